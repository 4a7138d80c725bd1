//! Red flags in a file the reference accepts: things that are legal but suspicious or costly,
//! each a finding with its own code.

use super::StringMap;
use super::{Dtype, Tensor, TensorInfo};
use crate::finding::{Code, Finding, Findings};
use crate::text::escape;

/// A tensor this large trips 32-bit offsets in some loaders.
const LARGE_TENSOR: u64 = 2 << 30;

/// Metadata values longer than this are flagged.
const LARGE_VALUE: usize = 64 << 10;

/// `__metadata__` keys with a known meaning.
const KNOWN_KEYS: [&str; 9] = [
    "format",
    "quantization",
    "quantization_config",
    "producer",
    "model_type",
    "architecture",
    "license",
    "total_parameters",
    "version",
];

/// The red flags of one file's parsed header.
pub fn red_flags(tensors: &[Tensor], metadata: Option<&StringMap>) -> Findings {
    let mut findings: Findings = tensors.iter().flat_map(|t| tensor_flags(&t.info)).collect();
    if tensors
        .windows(2)
        .any(|pair| pair[0].info.data_offsets[0] > pair[1].info.data_offsets[0])
    {
        findings.push(Finding::info(
            Code::TensorOrder,
            "tensors are stored in a different order from the header's entries",
        ));
    }
    if let Some(metadata) = metadata {
        findings.append(metadata_flags(metadata));
    }
    findings
}

/// Flags a complete header padded with JSON whitespace other than spaces.
pub fn header_padding(text: &str) -> Option<Finding> {
    let json_end = text.trim_end().len();
    text[json_end..].bytes().any(|b| b != b' ').then(|| {
        Finding::info(
            Code::HeaderPadding,
            "the header is padded with tabs or line breaks, not spaces (accepted, unusual)",
        )
    })
}

fn tensor_flags(tensor: &TensorInfo) -> Vec<Finding> {
    let mut findings = Vec::new();
    let name = tensor.name.as_str();
    if tensor.byte_len() > LARGE_TENSOR {
        findings.push(
            Finding::warning(
                Code::TensorOver2Gib,
                format!(
                    "{} bytes: over 2 GiB, which some loaders cannot address",
                    tensor.byte_len()
                ),
            )
            .for_tensor(name),
        );
    }
    let Some(dtype) = tensor.dtype.known() else {
        return findings;
    };
    // U8, I8, I32 and U32 are left out: quantized formats pack their weights in them (MLX in
    // U32).
    let integer = matches!(
        dtype,
        Dtype::Bool | Dtype::U16 | Dtype::U64 | Dtype::I16 | Dtype::I64
    );
    let float_weight = || {
        let lower = name.to_ascii_lowercase();
        lower.ends_with(".weight") && (lower.contains("norm") || lower.ends_with("proj.weight"))
    };
    if integer && float_weight() {
        findings.push(
            Finding::info(
                Code::IntegerWeight,
                format!("a weight its name says is a float is stored as {dtype}"),
            )
            .for_tensor(name),
        );
    }
    // A data section misaligned as a whole is `header-length-unaligned`; this flags a tensor
    // misplaced within it.
    let element = u64::from(dtype.bits() / 8);
    let start = tensor.data_offsets[0];
    if element > 1 && !start.is_multiple_of(element) && tensor.byte_len() > 0 {
        findings.push(
            Finding::info(
                Code::DataMisaligned,
                format!(
                    "its data starts at byte {start} of the data section, not a multiple of its \
                     {element}-byte elements"
                ),
            )
            .for_tensor(name),
        );
    }
    findings
}

fn metadata_flags(metadata: &StringMap) -> Findings {
    /// Unknown keys named in the finding; the rest are counted.
    const NAMED: usize = 20;
    let mut findings = Findings::new();
    if let Some(format) = metadata.get("format")
        && !["pt", "tf", "flax", "mlx", "np", "numpy", "paddle", "jax"].contains(&format)
    {
        findings.push(Finding::warning(
            Code::MetadataFormat,
            format!(
                "`format` is `{}`; loaders expect `pt`, `tf`, `flax`, `mlx` or `np`",
                escape(format)
            ),
        ));
    }
    if let Some(config) = metadata.get("quantization_config")
        && serde_json::from_str::<serde_json::Value>(config).map_or(true, |v| !v.is_object())
    {
        findings.push(Finding::warning(
            Code::MetadataFormat,
            "`quantization_config` is not a JSON object",
        ));
    }
    let mut unknown = metadata
        .keys()
        .filter(|key| !KNOWN_KEYS.contains(key) && !key.starts_with("modelspec."));
    let named: Vec<String> = unknown
        .by_ref()
        .take(NAMED)
        .map(|key| format!("`{}`", escape(key)))
        .collect();
    if !named.is_empty() {
        let more = match unknown.count() {
            0 => String::new(),
            more => format!(" and {more} more"),
        };
        findings.push(Finding::info(
            Code::MetadataUnknownKey,
            format!("keys without a known meaning: {}{more}", named.join(", ")),
        ));
    }
    for (key, value) in metadata.iter() {
        if value.len() > LARGE_VALUE {
            findings.push(Finding::warning(
                Code::MetadataSuspicious,
                format!(
                    "the value of `{}` is {} bytes long",
                    escape(key),
                    value.len()
                ),
            ));
        } else if escape(value).len() != value.len() || escape(key).len() != key.len() {
            findings.push(Finding::warning(
                Code::MetadataSuspicious,
                format!(
                    "`{}` holds control or invisible characters: `{}`",
                    escape(key),
                    escape(value)
                ),
            ));
        }
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Shape;

    fn tensor(name: &str, dtype: Dtype, offsets: [u64; 2]) -> Tensor {
        TensorInfo {
            name: name.into(),
            dtype: dtype.into(),
            shape: Shape::from_slice(&[offsets[1] - offsets[0]]),
            data_offsets: offsets,
        }
        .into()
    }

    fn codes(findings: &[Finding]) -> Vec<&'static str> {
        findings.iter().map(|f| f.code.as_str()).collect()
    }

    #[test]
    fn flags_suspicious_tensors() {
        let tensors = [
            tensor("model.norm.weight", Dtype::U16, [0, 4]),
            tensor("model.layers.0.q_proj.weight", Dtype::U8, [4, 8]),
            tensor("x.weight", Dtype::U16, [8, 12]),
        ];
        assert_eq!(codes(&red_flags(&tensors, None)), ["integer-weight"]);
        let f16 = TensorInfo {
            shape: Shape::from_slice(&[2]),
            ..tensor("a", Dtype::F16, [1, 5]).info
        };
        assert_eq!(codes(&red_flags(&[f16.into()], None)), ["data-misaligned"]);
        let huge = tensor("embed.weight", Dtype::U8, [0, (2 << 30) + 1]);
        assert_eq!(codes(&red_flags(&[huge], None)), ["tensor-over-2gib"]);
        let reordered = [
            tensor("b", Dtype::U8, [4, 8]),
            tensor("a", Dtype::U8, [0, 4]),
        ];
        assert_eq!(codes(&red_flags(&reordered, None)), ["tensor-order"]);
    }

    #[test]
    fn flags_unusual_padding() {
        assert!(header_padding("{}  ").is_none());
        assert!(header_padding("{}").is_none());
        let padded = header_padding("{} \n\t").map(|f| f.code.as_str());
        assert_eq!(padded, Some("header-padding"));
    }

    #[test]
    fn flags_suspicious_metadata() {
        let metadata: StringMap = [
            ("format", "pickle"),
            ("custom", "x"),
            ("note", "\u{1b}[2J"),
            ("modelspec.title", "ok"),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            codes(&red_flags(&[], Some(&metadata))),
            [
                "metadata-format",
                "metadata-unknown-key",
                "metadata-suspicious"
            ]
        );
    }
}
