//! Findings: every problem or notable fact stui reports about a model, with a stable code.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
    Info,
}

impl Severity {
    pub const fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

macro_rules! codes {
    ($($variant:ident => $text:literal, $meaning:literal;)*) => {
        /// A stable identifier for a kind of finding. The kebab-case text never changes meaning.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $($variant,)*
        }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text,)*
                }
            }

            /// One line on what the code means, for documentation and help screens.
            pub const fn meaning(self) -> &'static str {
                match self {
                    $(Code::$variant => $meaning,)*
                }
            }
        }
    };
}

codes! {
    FileEmpty => "file-empty", "the file has no bytes at all";
    FileTooSmall => "file-too-small", "the file is shorter than the 8-byte header length";
    NotSafetensors => "not-safetensors", "the file is another format (LFS pointer, HTML, zip, pickle, GGUF, JSON, ...)";
    HeaderTooLarge => "header-too-large", "the declared header length is over the 100,000,000-byte limit";
    HeaderPastEnd => "header-past-end", "the declared header length runs past the end of the file";
    HeaderNotUtf8 => "header-not-utf8", "the header is not valid UTF-8";
    HeaderJson => "header-json", "the header is not valid JSON";
    HeaderNulPadding => "header-nul-padding", "the header is padded with NUL bytes, which only JSON whitespace may be";
    HeaderNotObject => "header-not-object", "the header is JSON but not an object";
    HeaderLeadingWhitespace => "header-leading-whitespace", "the header starts with whitespace (accepted, but unusual)";
    HeaderLengthUnaligned => "header-length-unaligned", "the header length is not a multiple of 8, so the data is not 8-byte aligned";
    HeaderPadding => "header-padding", "the header is padded with tabs or line breaks rather than spaces (accepted, unusual)";
    MetadataInvalid => "metadata-invalid", "__metadata__ is not an object of string values";
    MetadataDuplicate => "metadata-duplicate", "__metadata__ appears twice";
    MetadataFormat => "metadata-format", "__metadata__ `format` or `quantization_config` has a value loaders do not expect";
    MetadataUnknownKey => "metadata-unknown-key", "__metadata__ has keys without a known meaning (listed, for review)";
    MetadataSuspicious => "metadata-suspicious", "a __metadata__ value is very long or holds control or invisible characters";
    TensorEntryInvalid => "tensor-entry-invalid", "a tensor entry is not an object with dtype, shape and data_offsets";
    TensorEntryPositional => "tensor-entry-positional", "a tensor entry is written as a [dtype, shape, offsets] array (accepted quirk)";
    TensorFieldUnknown => "tensor-field-unknown", "a tensor entry has a field the format does not define (ignored)";
    DtypeUnknown => "dtype-unknown", "a dtype name the format does not define";
    DtypeEnumForm => "dtype-enum-form", "a dtype written as {\"NAME\": null} (accepted quirk)";
    DuplicateTensorName => "duplicate-tensor-name", "the same tensor name appears twice in the header";
    OffsetReversed => "offset-reversed", "a tensor's data_offsets end before they begin";
    OffsetGap => "offset-gap", "bytes of the data section that no tensor claims, before a tensor";
    OffsetOverlap => "offset-overlap", "a tensor's bytes overlap another tensor's";
    OffsetPastEnd => "offset-past-end", "a tensor's bytes run past the end of the file";
    ShapeOverflow => "shape-overflow", "the element count or bit count of a shape overflows 64 bits";
    SubByteMisaligned => "sub-byte-misaligned", "a sub-byte tensor (F4, F6) does not fill a whole number of bytes";
    SizeMismatch => "size-mismatch", "data_offsets span a different number of bytes than shape and dtype need";
    DataTruncated => "data-truncated", "the file ends before the last tensor's data: a truncated download or copy";
    TrailingBytes => "trailing-bytes", "bytes after the last tensor's data that no tensor claims";
    TensorOver2Gib => "tensor-over-2gib", "a single tensor over 2 GiB, which some loaders cannot address";
    IntegerWeight => "integer-weight", "a projection or norm weight stored in an integer dtype no quantized format uses";
    DataMisaligned => "data-misaligned", "a tensor's data does not start on a multiple of its element size in the file";
    TensorOrder => "tensor-order", "tensors are stored in a different order from the header's entries";
    LayerIncomplete => "layer-incomplete", "a tensor the other layers of its kind have is missing from a layer";
    LayerMismatch => "layer-mismatch", "a layer's tensor has a shape or dtype unlike the same tensor in the other layers of its kind";
    LayerMissing => "layer-missing", "a layer below the last one has no tensor at all";
    LayerLayout => "layer-layout", "a part that one run of layers has and another lacks, with no config to say so (a note, not a gap)";
    TensorMissing => "tensor-missing", "a tensor a checkpoint of this model_type and config holds is not in the model";
    TensorUnexpected => "tensor-unexpected", "a tensor a checkpoint of this model_type and config does not hold (loaders ignore it)";
    ConfigMismatch => "config-mismatch", "config.json gives a size the tensors' shapes contradict (both values shown)";
    ConfigInvalid => "config-invalid", "the config.json beside the model cannot be read or is not JSON";
    IndexInvalid => "index-invalid", "a sharded model's index.json cannot be read or has the wrong form";
    IndexPathEscapes => "index-path-escapes", "an index names a shard outside its own folder (refused)";
    ShardMissing => "shard-missing", "a shard named by the index does not exist";
    ShardUnreadable => "shard-unreadable", "a shard exists but cannot be read";
    FolderComponents => "folder-components", "a folder with a model of its own also has subfolders that hold models (a diffusers pipeline's components; not read)";
    FolderParts => "folder-parts", "a folder without an index holds several .safetensors files that are not one set of shards and share no tensor: they are read side by side as one model";
    FolderOtherFiles => "folder-other-files", "a folder holds other .safetensors files or indexes beside the file or index its loader reads (not read)";
    IndexTensorMissing => "index-tensor-missing", "the index maps a tensor to a shard that does not hold it";
    TensorNotInIndex => "tensor-not-in-index", "a shard holds a tensor the index does not map (loaders will not find it)";
    TensorInTwoShards => "tensor-in-two-shards", "the same tensor name is stored in two shards";
    IndexTotalSize => "index-total-size", "metadata.total_size in the index differs from the tensors' bytes";
    MetadataMismatch => "metadata-mismatch", "shards disagree on a __metadata__ value";
    QuantMemberMissing => "quant-member-missing", "a quantized weight lacks a member its scheme needs (a scale, the packed shape, the codes themselves)";
    QuantMemberShape => "quant-member-shape", "a quantized weight's member has a shape its scheme and group size do not give";
    QuantPackedWidth => "quant-packed-width", "a packed weight's width disagrees with its `weight_shape` (or the bits) it is read with";
    QuantGroupIndex => "quant-group-index", "a `g_idx` is not a valid group assignment (a group out of range, or too many columns in one)";
    QuantIgnore => "quant-ignore", "a Linear left unquantized that the config's ignore list does not name, or named but quantized";
    QuantConfig => "quant-config", "the quantization config and the stored tensors disagree (method, bits, group size, quantized or not)";
    QuantRotated => "quant-rotated", "the weights are stored in a rotated basis (Hadamard transforms): statistics are of the rotated weights";
    QuantOpaque => "quant-opaque", "quantized weights stui recognises but whose values it does not read (EXL2, EXL3)";
    QuantScale => "quant-scale", "a quantized weight's scale or zero point is NaN, infinite, zero (zeroing its group), negative where the scheme forbids it, or out of range";
    ValuesNan => "values-nan", "a tensor holds NaN values";
    ValuesInf => "values-inf", "a tensor holds infinite values";
    ValuesAllZero => "values-all-zero", "every value of a tensor is zero";
    ValuesConstant => "values-constant", "every value of a tensor is the same nonzero number";
    ValuesExtreme => "values-extreme", "a float weight holds values of magnitude over the set limit (1e4 by default)";
    ValuesGarbage => "values-garbage", "a float tensor holds values over 1e30, which look like uninitialised memory";
    LayerOutlier => "layer-outlier", "a tensor's std or absmax is over 10x (or under 1/10) the median of the same tensor in the other layers";
    MapOutlier => "map-outlier", "a tensor's std stands out from the same tensor's in the other layers: a robust z-score (by median absolute deviation) of 6 or more, and 1.5x to 10x off the median";
    LayerBand => "layer-band", "a run of layers whose tensors' std is off the other layers' for most tensor kinds";
    ExpertDead => "expert-dead", "every tensor of an expert of a mixture-of-experts layer is all zeros";
    ExpertConstant => "expert-constant", "every tensor of an expert holds one repeated nonzero value";
    ExpertCopy => "expert-copy", "an expert's tensors are byte-identical to another expert's of the same layer";
    DataUnreadable => "data-unreadable", "a tensor's bytes could not be read (the file shrank, was replaced, or an I/O error)";
    ScanFailed => "scan-failed", "stui failed while computing a tensor's statistics (a bug: please report it)";
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// One problem or notable fact, about a file and perhaps one tensor in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub code: Code,
    /// The tensor concerned, if the finding is about one.
    pub tensor: Option<String>,
    /// The file concerned, for models made of several files.
    pub file: Option<String>,
    /// What is wrong, in a user's words.
    pub message: String,
}

impl Finding {
    pub fn new(severity: Severity, code: Code, message: impl Into<String>) -> Self {
        Finding {
            severity,
            code,
            tensor: None,
            file: None,
            message: message.into(),
        }
    }

    pub fn error(code: Code, message: impl Into<String>) -> Self {
        Finding::new(Severity::Error, code, message)
    }

    pub fn warning(code: Code, message: impl Into<String>) -> Self {
        Finding::new(Severity::Warning, code, message)
    }

    pub fn info(code: Code, message: impl Into<String>) -> Self {
        Finding::new(Severity::Info, code, message)
    }

    #[must_use]
    pub fn for_tensor(mut self, name: impl Into<String>) -> Self {
        self.tensor = Some(name.into());
        self
    }

    #[must_use]
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = Some(file.into());
        self
    }
}

/// Findings as a file or model keeps them: at most [`Findings::KEPT`] of each code, then, in
/// their place, one finding of that code saying how many more there are. A hostile header can
/// give every one of a million entries a finding, which would take hundreds of megabytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    list: Vec<Finding>,
    /// Per code: how many are in `list` (not counting the summary), and the summary's place
    /// and count once some are left out.
    codes: BTreeMap<Code, Kept>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Kept {
    listed: usize,
    left_out: Option<(usize, u64)>,
}

impl Findings {
    pub const KEPT: usize = 1_000;

    pub fn new() -> Findings {
        Findings::default()
    }

    pub fn push(&mut self, finding: Finding) {
        let kept = self.codes.entry(finding.code).or_default();
        if kept.listed < Self::KEPT {
            kept.listed += 1;
            self.list.push(finding);
        } else {
            Self::leave_out(&mut self.list, kept, &finding, 1);
        }
    }

    /// Adds `finding` before all the others.
    pub fn push_first(&mut self, finding: Finding) {
        let rest = std::mem::take(self);
        self.push(finding);
        self.append(rest);
    }

    /// Moves every finding of `other` here, its counts of findings left out included.
    pub fn append(&mut self, other: Findings) {
        let summaries: BTreeMap<usize, u64> = other
            .codes
            .values()
            .filter_map(|kept| kept.left_out)
            .collect();
        for (at, finding) in other.list.into_iter().enumerate() {
            match summaries.get(&at) {
                Some(&count) => {
                    let kept = self.codes.entry(finding.code).or_default();
                    Self::leave_out(&mut self.list, kept, &finding, count);
                }
                None => self.push(finding),
            }
        }
    }

    /// Counts `count` findings like `finding` as left out, in the summary of their code (made
    /// where the first is left out).
    fn leave_out(list: &mut Vec<Finding>, kept: &mut Kept, finding: &Finding, count: u64) {
        let (at, total) = kept.left_out.get_or_insert_with(|| {
            list.push(Finding::new(finding.severity, finding.code, String::new()));
            (list.len() - 1, 0)
        });
        *total += count;
        let summary = &mut list[*at];
        summary.message.clear();
        let _ = write!(
            summary.message,
            "{total} more `{}` findings are not listed (at most {} of each kind are kept)",
            finding.code,
            Self::KEPT
        );
    }

    /// Says of every finding that it is about the file `label`.
    pub fn in_file(&mut self, label: &str) {
        for finding in &mut self.list {
            finding.file = Some(label.to_owned());
        }
    }

    pub fn into_vec(self) -> Vec<Finding> {
        self.list
    }
}

impl std::ops::Deref for Findings {
    type Target = [Finding];

    fn deref(&self) -> &[Finding] {
        &self.list
    }
}

impl Extend<Finding> for Findings {
    fn extend<I: IntoIterator<Item = Finding>>(&mut self, findings: I) {
        for finding in findings {
            self.push(finding);
        }
    }
}

impl FromIterator<Finding> for Findings {
    fn from_iter<I: IntoIterator<Item = Finding>>(findings: I) -> Findings {
        let mut list = Findings::new();
        list.extend(findings);
        list
    }
}

impl IntoIterator for Findings {
    type Item = Finding;
    type IntoIter = std::vec::IntoIter<Finding>;

    fn into_iter(self) -> Self::IntoIter {
        self.list.into_iter()
    }
}

impl<'a> IntoIterator for &'a Findings {
    type Item = &'a Finding;
    type IntoIter = std::slice::Iter<'a, Finding>;

    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

impl Serialize for Findings {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.list.serialize(serializer)
    }
}

/// Counts of findings by severity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub errors: usize,
    pub warnings: usize,
    pub info: usize,
}

impl Tally {
    pub fn of<'a>(findings: impl IntoIterator<Item = &'a Finding>) -> Tally {
        let mut tally = Tally::default();
        for finding in findings {
            tally.add(finding);
        }
        tally
    }

    pub fn add(&mut self, finding: &Finding) {
        match finding.severity {
            Severity::Error => self.errors += 1,
            Severity::Warning => self.warnings += 1,
            Severity::Info => self.info += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn keeps_a_thousand_of_each_code_and_counts_the_rest() {
        let bad = |i: usize| Finding::error(Code::DtypeUnknown, format!("bad {i}"));
        let mut findings: Findings = (0..2_500).map(bad).collect();
        findings.push(Finding::warning(Code::LayerIncomplete, "one"));
        assert_eq!(findings.len(), Findings::KEPT + 2);
        let summary = &findings[Findings::KEPT];
        assert_eq!(summary.code, Code::DtypeUnknown);
        assert_eq!(summary.severity, Severity::Error);
        assert!(
            summary
                .message
                .starts_with("1500 more `dtype-unknown` findings")
        );
        assert_eq!(findings[Findings::KEPT + 1].code, Code::LayerIncomplete);

        let mut model: Findings = (0..10).map(bad).collect();
        model.append(findings);
        assert_eq!(model.len(), Findings::KEPT + 2);
        let summary = model.iter().find(|f| f.message.contains("more")).unwrap();
        assert!(
            summary
                .message
                .starts_with("1510 more `dtype-unknown` findings")
        );

        model.push_first(Finding::info(Code::HeaderPadding, "first"));
        assert_eq!(model[0].code, Code::HeaderPadding);
        assert_eq!(model.len(), Findings::KEPT + 3);
    }

    #[test]
    fn codes_are_unique_kebab_case() {
        let mut seen = HashSet::new();
        for code in Code::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "{text} twice");
            assert!(
                text.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            );
            assert!(!code.meaning().is_empty());
        }
    }
}
