//! What a quantized weight is stored as: the layout its members follow, its bits and how its
//! scales are shared, in a few bytes per weight.

use serde::Serialize;
use std::fmt;

/// The storage layouts stui tells apart, one per producer family and packing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// compressed-tensors int-quantized / naive: `weight` I8 and `weight_scale` (stui's own int8
    /// output is this layout).
    CompressedInt,
    /// compressed-tensors float-quantized: `weight` F8 and a float `weight_scale`.
    CompressedFloat,
    /// compressed-tensors pack-quantized: `weight_packed` I32, `weight_shape`, `weight_scale`.
    CompressedPacked,
    /// compressed-tensors nvfp4-pack-quantized: `weight_packed` U8, F8 scales, a dividing global
    /// scale.
    CompressedNvfp4,
    /// compressed-tensors mxfp4-pack-quantized: `weight_packed` U8 and E8M0 scales.
    CompressedMxfp4,
    /// compressed-tensors mxfp8-quantized: `weight` F8 and E8M0 scales.
    CompressedMxfp8,
    /// Fine-grained FP8: `weight` F8 and a multiplying `weight_scale_inv` (blocks, rows or one).
    Fp8ScaleInv,
    /// FP8 with a plain `weight_scale` (fbgemm rows, `ModelOpt` FP8, `ComfyUI` float8).
    Fp8Scaled,
    GptqV1,
    GptqV2,
    Awq,
    /// `ModelOpt` NVFP4: `weight` U8, F8 scales, a multiplying `weight_scale_2`.
    ModelOptNvfp4,
    /// `ComfyUI` NVFP4: as `ModelOpt`'s, high nibble first and swizzled scales.
    ComfyNvfp4,
    /// `ComfyUI` `int8_tensorwise`.
    ComfyInt8,
    /// `ComfyUI` MXFP8: `weight` F8 and E8M0 scales, swizzled as `ComfyUI`'s NVFP4 scales are.
    ComfyMxfp8,
    /// gpt-oss MXFP4 experts: `*_blocks` and `*_scales`.
    GptOssMxfp4,
    MlxAffine,
    MlxMxfp4,
    MlxNvfp4,
    MlxMxfp8,
    BnbInt8,
    BnbNf4,
    BnbFp4,
    Hqq,
    Quanto,
    Exl2,
    Exl3,
}

impl Layout {
    /// Whether the stored tensors say all their loader needs, with no quantization config
    /// written beside them: HQQ's own saves keep each layer's settings in its tensors, and
    /// `ComfyUI` marks each layer with a tensor (or in the file's metadata).
    pub const fn described_by_its_tensors(self) -> bool {
        matches!(
            self,
            Layout::Hqq | Layout::ComfyNvfp4 | Layout::ComfyInt8 | Layout::ComfyMxfp8
        )
    }

    /// The producer family, as the dtype mix names it ("int4 (GPTQ)").
    pub const fn family(self) -> &'static str {
        match self {
            Layout::CompressedInt
            | Layout::CompressedFloat
            | Layout::CompressedPacked
            | Layout::CompressedNvfp4
            | Layout::CompressedMxfp4
            | Layout::CompressedMxfp8 => "compressed-tensors",
            Layout::Fp8ScaleInv => "FP8 block",
            Layout::Fp8Scaled => "FP8",
            Layout::GptqV1 | Layout::GptqV2 => "GPTQ",
            Layout::Awq => "AWQ",
            Layout::ModelOptNvfp4 => "ModelOpt",
            Layout::ComfyNvfp4 | Layout::ComfyInt8 | Layout::ComfyMxfp8 => "ComfyUI",
            Layout::GptOssMxfp4 => "gpt-oss",
            Layout::MlxAffine | Layout::MlxMxfp4 | Layout::MlxNvfp4 | Layout::MlxMxfp8 => "MLX",
            Layout::BnbInt8 | Layout::BnbNf4 | Layout::BnbFp4 => "bitsandbytes",
            Layout::Hqq => "HQQ",
            Layout::Quanto => "quanto",
            Layout::Exl2 => "EXL2",
            Layout::Exl3 => "EXL3",
        }
    }

    /// The producer as the scheme text ends ("…, GPTQ v1").
    const fn producer(self) -> &'static str {
        match self {
            Layout::GptqV1 => "GPTQ v1",
            Layout::GptqV2 => "GPTQ v2",
            Layout::Fp8ScaleInv | Layout::Fp8Scaled => "",
            other => other.family(),
        }
    }

    /// What the codes are, before bits are counted: integers, or one of the float formats.
    pub const fn codes(self) -> Codes {
        match self {
            Layout::CompressedFloat
            | Layout::CompressedMxfp8
            | Layout::ComfyMxfp8
            | Layout::Fp8ScaleInv
            | Layout::Fp8Scaled
            | Layout::MlxMxfp8 => Codes::Fp8,
            Layout::CompressedNvfp4
            | Layout::ModelOptNvfp4
            | Layout::ComfyNvfp4
            | Layout::MlxNvfp4 => Codes::Nvfp4,
            Layout::CompressedMxfp4 | Layout::GptOssMxfp4 | Layout::MlxMxfp4 => Codes::Mxfp4,
            Layout::BnbNf4 => Codes::Nf4,
            Layout::BnbFp4 => Codes::BnbFp4,
            Layout::Exl2 | Layout::Exl3 => Codes::Opaque,
            _ => Codes::Int,
        }
    }

    /// Values stui does not read (recognised only): shown with their logical shape and bits.
    pub const fn is_opaque(self) -> bool {
        matches!(self.codes(), Codes::Opaque)
    }
}

/// The kind of code a weight stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codes {
    Int,
    Fp8,
    Nvfp4,
    Mxfp4,
    Nf4,
    BnbFp4,
    Opaque,
}

/// How scales are shared across the weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Grouping {
    Tensor,
    Channel,
    /// One scale per this many consecutive input columns of a row (or, for bitsandbytes, of the
    /// flattened weight).
    Group(u32),
    /// One scale per block of rows × columns.
    Block(u32, u32),
    /// Unknown (recognise-only layouts).
    Unknown,
}

/// One weight's scheme: its layout, bits per code and how scales are shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scheme {
    pub layout: Layout,
    pub bits: u8,
    pub grouping: Grouping,
    /// Has zero points (or MLX biases).
    pub asymmetric: bool,
    /// Columns take their group from a `g_idx` (act-order).
    pub act_order: bool,
    /// bitsandbytes 4-bit with double-quantized block scales.
    pub nested: bool,
}

impl Scheme {
    pub const fn new(layout: Layout, bits: u8, grouping: Grouping) -> Scheme {
        Scheme {
            layout,
            bits,
            grouping,
            asymmetric: false,
            act_order: false,
            nested: false,
        }
    }

    /// The kind of code and its width: "int4", "fp8 e4m3", "nvfp4", "nf4".
    pub fn code_name(&self) -> String {
        match self.layout.codes() {
            Codes::Int => format!("int{}", self.bits),
            Codes::Fp8 => "fp8 e4m3".to_string(),
            Codes::Nvfp4 => "nvfp4".to_string(),
            Codes::Mxfp4 => "mxfp4".to_string(),
            Codes::Nf4 => "nf4".to_string(),
            Codes::BnbFp4 => "fp4".to_string(),
            Codes::Opaque => format!("{} (not read)", self.layout.family().to_lowercase()),
        }
    }

    /// The short label of the dtype mix: "int4 (GPTQ)", "fp8 e4m3 (FP8 block)".
    pub fn label(&self) -> String {
        match self.layout.codes() {
            Codes::Opaque => self.code_name(),
            _ => format!("{} ({})", self.code_name(), self.layout.family()),
        }
    }
}

/// "int4 g128 asym, GPTQ v1", "fp8 e4m3 block 128x128", "nvfp4 g16, compressed-tensors".
impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.code_name())?;
        match self.grouping {
            Grouping::Tensor => f.write_str(" per tensor")?,
            Grouping::Channel => f.write_str(" per channel")?,
            Grouping::Group(size) => write!(f, " g{size}")?,
            Grouping::Block(rows, cols) => write!(f, " block {rows}x{cols}")?,
            Grouping::Unknown => {}
        }
        if self.asymmetric {
            f.write_str(match self.layout {
                Layout::MlxAffine | Layout::Hqq | Layout::Quanto => " affine",
                _ => " asym",
            })?;
        }
        if self.act_order {
            f.write_str(" act-order")?;
        }
        if self.nested {
            f.write_str(" double-quant")?;
        }
        let producer = self.layout.producer();
        if !producer.is_empty() && !matches!(self.layout.codes(), Codes::Opaque) {
            write!(f, ", {producer}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_schemes_as_users_name_them() {
        let mut gptq = Scheme::new(Layout::GptqV1, 4, Grouping::Group(128));
        gptq.asymmetric = true;
        assert_eq!(gptq.to_string(), "int4 g128 asym, GPTQ v1");
        assert_eq!(gptq.label(), "int4 (GPTQ)");
        let fp8 = Scheme::new(Layout::Fp8ScaleInv, 8, Grouping::Block(128, 128));
        assert_eq!(fp8.to_string(), "fp8 e4m3 block 128x128");
        let nvfp4 = Scheme::new(Layout::CompressedNvfp4, 4, Grouping::Group(16));
        assert_eq!(nvfp4.to_string(), "nvfp4 g16, compressed-tensors");
        let exl2 = Scheme::new(Layout::Exl2, 4, Grouping::Unknown);
        assert_eq!(exl2.to_string(), "exl2 (not read)");
    }
}
