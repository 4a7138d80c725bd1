//! The 22 element types of the format, in the reference's declaration order.

use std::fmt;

/// An element type. The declaration order is the reference's "rank", which its writer sorts by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Bool,
    F4,
    F6E2M3,
    F6E3M2,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    F8E8M0,
    F8E4M3Fnuz,
    F8E5M2Fnuz,
    I16,
    U16,
    F16,
    Bf16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

/// What kind of number an element holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Float,
    SignedInt,
    UnsignedInt,
    Complex,
}

impl Dtype {
    pub const ALL: [Dtype; 22] = [
        Dtype::Bool,
        Dtype::F4,
        Dtype::F6E2M3,
        Dtype::F6E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::F8E8M0,
        Dtype::F8E4M3Fnuz,
        Dtype::F8E5M2Fnuz,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// The name used in headers (case-sensitive).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::F4 => "F4",
            Dtype::F6E2M3 => "F6_E2M3",
            Dtype::F6E3M2 => "F6_E3M2",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::F8E4M3Fnuz => "F8_E4M3FNUZ",
            Dtype::F8E5M2Fnuz => "F8_E5M2FNUZ",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::C64 => "C64",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Parses a header dtype name exactly as the reference does: no aliases, no case folding.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Some(match name {
            "BOOL" => Dtype::Bool,
            "F4" => Dtype::F4,
            "F6_E2M3" => Dtype::F6E2M3,
            "F6_E3M2" => Dtype::F6E3M2,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "F8_E5M2" => Dtype::F8E5M2,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E8M0" => Dtype::F8E8M0,
            "F8_E4M3FNUZ" => Dtype::F8E4M3Fnuz,
            "F8_E5M2FNUZ" => Dtype::F8E5M2Fnuz,
            "I16" => Dtype::I16,
            "U16" => Dtype::U16,
            "F16" => Dtype::F16,
            "BF16" => Dtype::Bf16,
            "I32" => Dtype::I32,
            "U32" => Dtype::U32,
            "F32" => Dtype::F32,
            "C64" => Dtype::C64,
            "F64" => Dtype::F64,
            "I64" => Dtype::I64,
            "U64" => Dtype::U64,
            _ => return None,
        })
    }

    /// Bits per element.
    pub const fn bits(self) -> u32 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6E2M3 | Dtype::F6E3M2 => 6,
            Dtype::Bool
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8E5M2
            | Dtype::F8E4M3
            | Dtype::F8E8M0
            | Dtype::F8E4M3Fnuz
            | Dtype::F8E5M2Fnuz => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::Bf16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::C64 | Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
        }
    }

    /// Position in the reference's declaration order.
    pub fn rank(self) -> usize {
        self as usize
    }

    pub const fn kind(self) -> Kind {
        match self {
            Dtype::Bool => Kind::Bool,
            Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => Kind::UnsignedInt,
            Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => Kind::SignedInt,
            Dtype::C64 => Kind::Complex,
            _ => Kind::Float,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self.kind(), Kind::Float)
    }

    /// The smallest positive normal value of a float dtype: nonzero magnitudes below it are
    /// subnormal. `None` for dtypes without subnormals (integers, BOOL, C64, `F8_E8M0`).
    pub fn smallest_normal(self) -> Option<f64> {
        let exponent = match self {
            Dtype::F64 => return Some(f64::MIN_POSITIVE),
            Dtype::F32 | Dtype::Bf16 => -126,
            Dtype::F16 | Dtype::F8E5M2 => -14,
            Dtype::F8E5M2Fnuz => -15,
            Dtype::F8E4M3 => -6,
            Dtype::F8E4M3Fnuz => -7,
            Dtype::F6E3M2 => -2,
            Dtype::F6E2M3 | Dtype::F4 => 0,
            _ => return None,
        };
        Some(2f64.powi(exponent))
    }

    /// Elements smaller than a byte, packed several to a byte.
    pub const fn is_sub_byte(self) -> bool {
        self.bits() < 8
    }

    /// Bytes taken by `count` elements, `None` on overflow or when the bits do not fill whole
    /// bytes (an odd number of F4 values, for example).
    pub fn byte_len(self, count: u64) -> Option<u64> {
        let bits = count.checked_mul(u64::from(self.bits()))?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A tensor's dtype as written in its header: a known type, or a name the format does not define.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TensorDtype {
    Known(Dtype),
    /// Shared by the entries that give the same name (see [`TensorDtype::named`]). A thin
    /// pointer, so that a tensor entry stays small.
    Unknown(std::sync::Arc<OtherDtype>),
}

/// A dtype name the format does not define or, never read from a header, the encoding of a
/// quantized logical weight, named by its scheme ("int4 (GPTQ)").
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct OtherDtype {
    name: Box<str>,
    quantized: bool,
}

impl OtherDtype {
    pub fn is_quantized(&self) -> bool {
        self.quantized
    }
}

impl std::ops::Deref for OtherDtype {
    type Target = str;

    fn deref(&self) -> &str {
        &self.name
    }
}

impl TensorDtype {
    /// The dtype named `name`. A name the format does not define is kept once for all the
    /// entries of a header that give it (up to a few hundred names): a hostile header can give
    /// a million entries one.
    pub fn named(name: &str) -> TensorDtype {
        const SHARED: usize = 256;
        thread_local! {
            static NAMES: std::cell::RefCell<std::collections::HashMap<Box<str>, std::sync::Arc<OtherDtype>>> =
                std::cell::RefCell::default();
        }
        if let Some(dtype) = Dtype::from_name(name) {
            return TensorDtype::Known(dtype);
        }
        NAMES.with_borrow_mut(|names| {
            if let Some(shared) = names.get(name) {
                return TensorDtype::Unknown(shared.clone());
            }
            let shared = std::sync::Arc::new(OtherDtype {
                name: name.into(),
                quantized: false,
            });
            if names.len() < SHARED {
                names.insert(name.into(), shared.clone());
            }
            TensorDtype::Unknown(shared)
        })
    }

    /// The encoding of quantized logical weights of the scheme labelled `label`.
    pub fn quantized(label: &str) -> TensorDtype {
        TensorDtype::Unknown(std::sync::Arc::new(OtherDtype {
            name: label.into(),
            quantized: true,
        }))
    }

    /// Whether this is a quantized logical weight's encoding (see [`TensorDtype::quantized`]).
    pub fn is_quantized(&self) -> bool {
        matches!(self, TensorDtype::Unknown(other) if other.quantized)
    }

    pub fn known(&self) -> Option<Dtype> {
        match self {
            TensorDtype::Known(dtype) => Some(*dtype),
            TensorDtype::Unknown(_) => None,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            TensorDtype::Known(dtype) => dtype.name(),
            TensorDtype::Unknown(name) => name,
        }
    }
}

impl From<Dtype> for TensorDtype {
    fn from(dtype: Dtype) -> Self {
        TensorDtype::Known(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_ranks_follow_declaration_order() {
        for (rank, dtype) in Dtype::ALL.into_iter().enumerate() {
            assert_eq!(Dtype::from_name(dtype.name()), Some(dtype));
            assert_eq!(dtype.rank(), rank);
        }
        assert_eq!(Dtype::from_name("f32"), None);
        assert_eq!(Dtype::from_name(" F32"), None);
        assert_eq!(Dtype::from_name("F8_E4M3FN"), None);
    }

    #[test]
    fn byte_len_rejects_partial_bytes_and_overflow() {
        assert_eq!(Dtype::F4.byte_len(3), None);
        assert_eq!(Dtype::F4.byte_len(4), Some(2));
        assert_eq!(Dtype::F6E3M2.byte_len(2), None);
        assert_eq!(Dtype::F6E2M3.byte_len(4), Some(3));
        assert_eq!(Dtype::U64.byte_len(1 << 58), None);
        assert_eq!(Dtype::F32.byte_len(0), Some(0));
    }
}
