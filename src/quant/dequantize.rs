//! A logical weight's scheme and members handed to the kernel that reads its layout.

use super::kernels::bnb::{FourBit, FourBitMembers, Int8};
use super::kernels::compressed_tensors::{
    Mxfp4, Mxfp8, Naive, Nvfp4, Packed, PackedMembers, Strategy,
};
use super::kernels::fp8::Fp8;
use super::kernels::gptq::{Gptq, GptqMembers, Version};
use super::kernels::mlx::{Affine, Float, Mode};
use super::kernels::mx::{GptOssMxfp4, ModelOptNvfp4};
use super::kernels::{Dequantize, KernelError, Stored};
use super::{Grouping, Layout, LogicalWeight, Role};

/// The kernel of `weight`, given its members as stored; an error names the member that does
/// not fit, or says the layout's values are not read.
#[expect(
    clippy::too_many_lines,
    reason = "a table: one arm per layout, each naming its members"
)]
pub fn kernel<'a>(
    weight: &LogicalWeight,
    members: &[(Role, Stored<'a>)],
) -> Result<Box<dyn Dequantize + 'a>, KernelError> {
    let get = |role: Role| members.iter().find(|(r, _)| *r == role).map(|(_, s)| *s);
    let need =
        |role: Role, name: &'static str| get(role).ok_or_else(|| KernelError::new(name, "missing"));
    let scheme = weight.scheme;
    let bits = u32::from(scheme.bits);
    let cols = weight.info.shape.iter().next_back().unwrap_or(0);
    let cols = usize::try_from(cols).unwrap_or(usize::MAX);
    let strategy = || match scheme.grouping {
        Grouping::Tensor => Ok(Strategy::Tensor),
        Grouping::Channel => Ok(Strategy::Channel),
        Grouping::Group(size) => Ok(Strategy::Group {
            size: size as usize,
        }),
        Grouping::Block(rows, cols) => Ok(Strategy::Block {
            rows: rows as usize,
            cols: cols as usize,
        }),
        Grouping::Unknown => Err(KernelError::new("weight_scale", "grouping not known")),
    };
    Ok(match scheme.layout {
        Layout::CompressedPacked => Box::new(Packed::new(
            PackedMembers {
                weight_packed: need(Role::WeightPacked, "weight_packed")?,
                weight_shape: need(Role::WeightShape, "weight_shape")?,
                weight_scale: need(Role::WeightScale, "weight_scale")?,
                weight_zero_point: get(Role::WeightZeroPoint),
                weight_g_idx: get(Role::WeightGIdx),
            },
            bits,
            strategy()?,
            None,
        )?),
        Layout::CompressedInt | Layout::CompressedFloat => Box::new(Naive::new(
            need(Role::Weight, "weight")?,
            need(Role::WeightScale, "weight_scale")?,
            get(Role::WeightZeroPoint),
            get(Role::WeightGIdx),
            strategy()?,
            bits,
        )?),
        Layout::CompressedNvfp4 => Box::new(Nvfp4::new(
            need(Role::WeightPacked, "weight_packed")?,
            need(Role::WeightScale, "weight_scale")?,
            need(Role::WeightGlobalScale, "weight_global_scale")?,
            cols,
        )?),
        Layout::CompressedMxfp4 => Box::new(Mxfp4::new(
            need(Role::WeightPacked, "weight_packed")?,
            need(Role::WeightScale, "weight_scale")?,
            cols,
        )?),
        Layout::CompressedMxfp8 => Box::new(Mxfp8::new(
            need(Role::Weight, "weight")?,
            need(Role::WeightScale, "weight_scale")?,
        )?),
        Layout::Fp8ScaleInv => {
            let weight_member = need(Role::Weight, "weight")?;
            let scale = need(Role::WeightScaleInv, "weight_scale_inv")?;
            match scheme.grouping {
                Grouping::Block(rows, cols) => Box::new(Fp8::block(
                    weight_member,
                    scale,
                    [rows as usize, cols as usize],
                )?),
                _ => Box::new(Fp8::per_tensor(weight_member, scale)?),
            }
        }
        Layout::Fp8Scaled => {
            let weight_member = need(Role::Weight, "weight")?;
            let scale = need(Role::WeightScale, "weight_scale")?;
            match scheme.grouping {
                Grouping::Channel => Box::new(Fp8::row_wise(weight_member, scale)?),
                _ => Box::new(Fp8::per_tensor(weight_member, scale)?),
            }
        }
        Layout::GptqV1 | Layout::GptqV2 => Box::new(Gptq::new(
            GptqMembers {
                qweight: need(Role::QWeight, "qweight")?,
                qzeros: get(Role::QZeros),
                scales: need(Role::Scales, "scales")?,
                g_idx: get(Role::GIdx),
            },
            bits,
            match scheme.grouping {
                Grouping::Group(size) => Some(size as usize),
                _ => None,
            },
            if scheme.layout == Layout::GptqV1 {
                Version::V1
            } else {
                Version::V2
            },
        )?),
        Layout::Awq => Box::new(super::kernels::awq::Awq::new(
            need(Role::QWeight, "qweight")?,
            get(Role::QZeros),
            need(Role::Scales, "scales")?,
        )?),
        Layout::MlxAffine => Box::new(Affine::new(
            need(Role::Weight, "weight")?,
            need(Role::Scales, "scales")?,
            need(Role::Biases, "biases")?,
            bits,
            match scheme.grouping {
                Grouping::Group(size) => size as usize,
                _ => 0,
            },
        )?),
        Layout::MlxMxfp4 | Layout::MlxNvfp4 | Layout::MlxMxfp8 => Box::new(Float::new(
            need(Role::Weight, "weight")?,
            need(Role::Scales, "scales")?,
            match scheme.layout {
                Layout::MlxMxfp4 => Mode::Mxfp4,
                Layout::MlxNvfp4 => Mode::Nvfp4,
                _ => Mode::Mxfp8,
            },
        )?),
        Layout::BnbInt8 => Box::new(Int8::new(
            need(Role::Weight, "weight")?,
            need(Role::Scb, "SCB")?,
        )?),
        Layout::BnbNf4 | Layout::BnbFp4 => Box::new(FourBit::new(FourBitMembers {
            weight: need(Role::Weight, "weight")?,
            absmax: need(Role::Absmax, "absmax")?,
            quant_map: need(Role::QuantMap, "quant_map")?,
            nested: get(Role::NestedAbsmax).zip(get(Role::NestedQuantMap)),
            quant_state: need(Role::QuantState, "quant_state")?,
        })?),
        Layout::ModelOptNvfp4 => Box::new(ModelOptNvfp4::new(
            need(Role::Weight, "weight")?,
            need(Role::WeightScale, "weight_scale")?,
            need(Role::WeightScale2, "weight_scale_2")?,
            cols,
        )?),
        Layout::GptOssMxfp4 => Box::new(GptOssMxfp4::new(
            need(Role::Blocks, "blocks")?,
            need(Role::BlockScales, "scales")?,
        )?),
        Layout::ComfyNvfp4 => {
            let rows = weight.info.shape.iter().rev().nth(1).unwrap_or(0);
            Box::new(super::kernels::comfy::ComfyNvfp4::new(
                need(Role::Weight, "weight")?,
                need(Role::WeightScale, "weight_scale")?,
                need(Role::WeightScale2, "weight_scale_2")?,
                [usize::try_from(rows).unwrap_or(usize::MAX), cols],
            )?)
        }
        Layout::ComfyMxfp8 => Box::new(super::kernels::comfy::ComfyMxfp8::new(
            need(Role::Weight, "weight")?,
            need(Role::WeightScale, "weight_scale")?,
        )?),
        Layout::Quanto if bits == 8 => Box::new(super::kernels::quanto::Quanto::bytes(
            need(Role::QuantoData, "_data")?,
            need(Role::QuantoScale, "_scale")?,
        )?),
        Layout::Quanto => {
            // quanto keeps no logical shape: the flattened weight is read as its `[groups,
            // group size]` matrix, which holds the elements in the same order.
            let (data, scale) = (
                need(Role::QuantoData, "_data")?,
                need(Role::QuantoScale, "_scale")?,
            );
            let groups = scale.shape.first().copied().unwrap_or(0);
            let width = data.shape.last().copied().unwrap_or(0);
            let dim = |d: u64| usize::try_from(d).unwrap_or(usize::MAX);
            Box::new(super::kernels::quanto::Quanto::packed(
                data,
                scale,
                need(Role::QuantoShift, "_shift")?,
                bits,
                [dim(groups), dim(width)],
            )?)
        }
        Layout::Hqq => {
            let dim = |d: u64| usize::try_from(d).unwrap_or(usize::MAX);
            let rows = weight.info.shape.iter().rev().nth(1).unwrap_or(1);
            Box::new(super::kernels::hqq::Hqq::new(
                need(Role::HqqCodes, "W_q")?,
                need(Role::Scale, "scale")?,
                need(Role::HqqZero, "zero")?,
                [dim(rows), cols],
            )?)
        }
        // `W = q · s`, one scale for the tensor or one a row: compressed-tensors' int layout.
        Layout::ComfyInt8 => Box::new(Naive::new(
            need(Role::Weight, "weight")?,
            need(Role::WeightScale, "weight_scale")?,
            None,
            None,
            strategy()?,
            bits,
        )?),
        Layout::Exl2 | Layout::Exl3 => {
            return Err(KernelError::new(
                "weight",
                format!("stui does not read {} values yet", scheme.layout.family()),
            ));
        }
    })
}
