//! The dequantization kernels against the producers' own dequantization: every weight of the
//! checkpoints in `tests/fixtures/quant` (written by compressed-tensors, MLX, bitsandbytes,
//! optimum-quanto, auto-round and transformers themselves), compared bit for bit with `reference.safetensors` beside them.

use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use stui::format::Dtype;
use stui::quant::kernels::awq::Awq;
use stui::quant::kernels::bnb::{FourBit, FourBitMembers, Int8};
use stui::quant::kernels::comfy::ComfyMxfp8;
use stui::quant::kernels::compressed_tensors::{
    Mxfp4, Mxfp8, Naive, Nvfp4, Packed, PackedMembers, Strategy,
};
use stui::quant::kernels::fp8::Fp8;
use stui::quant::kernels::gptq::{Gptq, GptqMembers, Version};
use stui::quant::kernels::hqq::Hqq;
use stui::quant::kernels::mlx::{Affine, Float, Mode};
use stui::quant::kernels::quanto::Quanto;
use stui::quant::kernels::{Dequantize, KernelError, Stored};

fn folder(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant")
        .join(name)
}

/// A member of the checkpoint, as the kernels take it.
struct Member {
    bytes: Vec<u8>,
    dtype: Dtype,
    shape: Vec<u64>,
}

impl Member {
    fn stored(&self) -> Stored<'_> {
        Stored {
            bytes: &self.bytes,
            dtype: self.dtype,
            shape: &self.shape,
        }
    }
}

fn member(file: &SafeTensors<'_>, name: &str) -> Option<Member> {
    let view = file.tensor(name).ok()?;
    Some(Member {
        bytes: view.data().to_vec(),
        dtype: Dtype::from_name(&format!("{:?}", view.dtype())).unwrap(),
        shape: view.shape().iter().map(|&d| d as u64).collect(),
    })
}

/// Every weight of `name`'s reference: the logical name, its shape and values.
fn references(name: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(folder(name).join("reference.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut weights: Vec<_> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, view.shape().to_vec(), values)
        })
        .collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    weights
}

/// How values may differ from the producer's.
#[derive(Clone, Copy, PartialEq)]
enum Match {
    Bits,
    /// Equal as numbers: bitsandbytes' FP4 decodes code 8 as −0 where its stored
    /// `quant_map[8]` is +0; auto-round's GPTQ dequantization gives +0 for elements that are
    /// −0 here (every other element is equal bit for bit).
    UpToTheSignOfZero,
}

/// Finds member `suffix` of the weight being checked (`weight_scale`, `SCB`...).
type Members<'a, 'b> = &'b dyn Fn(&str) -> Option<Stored<'a>>;

/// Builds a weight's kernel from its members and logical shape.
type Build<'c> = dyn for<'a, 'b> Fn(Members<'a, 'b>, &[usize]) -> Result<Box<dyn Dequantize + 'a>, KernelError>
    + 'c;

/// Builds each weight's kernel with `build(members of P, logical shape)` and compares.
fn check(name: &str, expect: Match, build: &Build<'_>) {
    let bytes = std::fs::read(folder(name).join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let names: Vec<String> = file.names().into_iter().map(str::to_owned).collect();
    let members: Vec<(String, Member)> = names
        .iter()
        .map(|n| (n.clone(), member(&file, n).unwrap()))
        .collect();
    let weights = references(name);
    assert!(!weights.is_empty(), "{name}: no reference weights");
    for (logical, shape, expected) in weights {
        let prefix = logical.strip_suffix(".weight").unwrap().to_owned();
        let get = |suffix: &str| {
            let wanted = format!("{prefix}.{suffix}");
            members
                .iter()
                .find(|(n, _)| *n == wanted)
                .map(|(_, m)| m.stored())
        };
        let kernel = build(&get, &shape).unwrap_or_else(|e| panic!("{name} {logical}: {e}"));
        assert_eq!(
            kernel.rows() * kernel.cols(),
            expected.len(),
            "{name} {logical}"
        );
        let mut actual = vec![f32::NAN; expected.len()];
        kernel.dequantize_rows(0..kernel.rows(), &mut actual);
        for (k, (a, e)) in actual.iter().zip(&expected).enumerate() {
            let same = match expect {
                Match::Bits => a.to_bits() == e.to_bits(),
                Match::UpToTheSignOfZero => a == e,
            };
            assert!(
                same,
                "{name} {logical} element {k}: {a:e}, the producer's {e:e}"
            );
        }
    }
}

fn cols(shape: &[usize]) -> usize {
    shape[shape.len() - 1]
}

fn packed(name: &str, bits: u32) {
    check(name, Match::Bits, &|get, _| {
        let members = PackedMembers {
            weight_packed: get("weight_packed").unwrap(),
            weight_shape: get("weight_shape").unwrap(),
            weight_scale: get("weight_scale").unwrap(),
            weight_zero_point: get("weight_zero_point"),
            weight_g_idx: get("weight_g_idx"),
        };
        Ok(Box::new(Packed::new(
            members,
            bits,
            Strategy::Group { size: 128 },
            None,
        )?))
    });
}

#[test]
fn compressed_tensors_pack_quantized() {
    packed("ct-w4a16", 4);
    packed("ct-w4a16-asym", 4);
    packed("ct-w8a16", 8);
}

fn naive(name: &str, strategy: Strategy) {
    check(name, Match::Bits, &|get, _| {
        let weight = get("weight").unwrap();
        let scale = get("weight_scale").unwrap();
        Ok(Box::new(Naive::new(
            weight,
            scale,
            get("weight_zero_point"),
            None,
            strategy,
            8,
        )?))
    });
}

#[test]
fn compressed_tensors_int_and_float_quantized() {
    naive("ct-w8a8", Strategy::Channel);
    naive("ct-fp8-dynamic", Strategy::Channel);
    naive(
        "ct-fp8-block",
        Strategy::Block {
            rows: 128,
            cols: 128,
        },
    );
}

#[test]
fn compressed_tensors_mx_formats() {
    check("ct-mxfp4a16", Match::Bits, &|get, shape| {
        Ok(Box::new(Mxfp4::new(
            get("weight_packed").unwrap(),
            get("weight_scale").unwrap(),
            cols(shape),
        )?))
    });
    check("ct-mxfp8a16", Match::Bits, &|get, _| {
        Ok(Box::new(Mxfp8::new(
            get("weight").unwrap(),
            get("weight_scale").unwrap(),
        )?))
    });
}

#[test]
fn compressed_tensors_nvfp4() {
    check("ct-nvfp4a16", Match::Bits, &|get, shape| {
        Ok(Box::new(Nvfp4::new(
            get("weight_packed").unwrap(),
            get("weight_scale").unwrap(),
            get("weight_global_scale").unwrap(),
            cols(shape),
        )?))
    });
}

#[test]
fn mlx_affine_and_float_modes() {
    for (name, bits, group) in [
        ("mlx-affine-4bit-g64", 4, 64),
        ("mlx-affine-8bit-g32", 8, 32),
        ("mlx-affine-3bit-g128", 3, 128),
    ] {
        check(name, Match::Bits, &|get, _| {
            let (w, s, b) = (
                get("weight").unwrap(),
                get("scales").unwrap(),
                get("biases").unwrap(),
            );
            Ok(Box::new(Affine::new(w, s, b, bits, group)?))
        });
    }
    for (name, mode) in [
        ("mlx-mxfp4", Mode::Mxfp4),
        ("mlx-nvfp4", Mode::Nvfp4),
        ("mlx-mxfp8", Mode::Mxfp8),
    ] {
        check(name, Match::Bits, &|get, _| {
            Ok(Box::new(Float::new(
                get("weight").unwrap(),
                get("scales").unwrap(),
                mode,
            )?))
        });
    }
}

fn four_bit(name: &str, kind: &str, expect: Match) {
    check(name, expect, &|get, _| {
        let nested = get("weight.nested_absmax").zip(get("weight.nested_quant_map"));
        Ok(Box::new(FourBit::new(FourBitMembers {
            weight: get("weight").unwrap(),
            absmax: get("weight.absmax").unwrap(),
            quant_map: get("weight.quant_map").unwrap(),
            nested,
            quant_state: get(&format!("weight.quant_state.bitsandbytes__{kind}")).unwrap(),
        })?))
    });
}

#[test]
fn bitsandbytes() {
    four_bit("bnb-nf4-nested", "nf4", Match::Bits);
    four_bit("bnb-fp4", "fp4", Match::UpToTheSignOfZero);
    check("bnb-int8", Match::Bits, &|get, _| {
        Ok(Box::new(Int8::new(
            get("weight").unwrap(),
            get("SCB").unwrap(),
        )?))
    });
}

#[test]
fn optimum_quanto() {
    check("quanto-qint8", Match::Bits, &|get, _| {
        Ok(Box::new(Quanto::bytes(
            get("weight._data").unwrap(),
            get("weight._scale").unwrap(),
        )?))
    });
    check("quanto-qint4", Match::Bits, &|get, shape| {
        Ok(Box::new(Quanto::packed(
            get("weight._data._data").unwrap(),
            get("weight._scale").unwrap(),
            get("weight._shift").unwrap(),
            4,
            [shape[0], shape[1]],
        )?))
    });
}

/// comfy-kitchen's MXFP8: scales in cuBLAS' blocked layout, padded rows and columns included.
#[test]
fn comfyui_mxfp8() {
    check("comfy-mxfp8", Match::Bits, &|get, _| {
        Ok(Box::new(ComfyMxfp8::new(
            get("weight").unwrap(),
            get("weight_scale").unwrap(),
        )?))
    });
}

#[test]
fn hqq() {
    for name in ["hqq-4bit-g64", "hqq-3bit-g64"] {
        check(name, Match::Bits, &|get, shape| {
            Ok(Box::new(Hqq::new(
                get("W_q").unwrap(),
                get("scale").unwrap(),
                get("zero").unwrap(),
                [shape[0], shape[1]],
            )?))
        });
    }
}

fn gptq(name: &str, bits: u32, group: usize, version: Version) {
    check(name, Match::UpToTheSignOfZero, &|get, _| {
        let members = GptqMembers {
            qweight: get("qweight").unwrap(),
            qzeros: get("qzeros"),
            scales: get("scales").unwrap(),
            g_idx: get("g_idx"),
        };
        Ok(Box::new(Gptq::new(members, bits, Some(group), version)?))
    });
}

#[test]
fn auto_round_gptq_awq_and_native_exports() {
    gptq("autoround-gptq-4bit", 4, 64, Version::V1);
    gptq("autoround-gptq-3bit-asym", 3, 32, Version::V1);
    // `packing_format: auto_round:auto_gptq`: GPTQ v1's packing.
    gptq("autoround-native-4bit", 4, 64, Version::V1);
    check("autoround-awq-4bit", Match::Bits, &|get, _| {
        Ok(Box::new(Awq::new(
            get("qweight").unwrap(),
            get("qzeros"),
            get("scales").unwrap(),
        )?))
    });
}

/// auto-round's symmetric GPTQ export stores about half its scales negative: its weights read
/// with no scale finding.
#[test]
fn negative_gptq_scales_are_no_finding() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant/autoround-gptq-4bit/model.safetensors");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_stui"))
        .arg("stats")
        .arg(&model)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("int4"), "{text}");
    assert!(!text.contains("quant-scale"), "{text}");
    assert_eq!(output.status.code(), Some(0), "{text}");
}

#[test]
fn fine_grained_fp8_blocks() {
    check("fp8-block-transformers", Match::Bits, &|get, _| {
        Ok(Box::new(Fp8::block(
            get("weight").unwrap(),
            get("weight_scale_inv").unwrap(),
            [128, 128],
        )?))
    });
}
