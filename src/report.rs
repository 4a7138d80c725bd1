//! Headless output: text for people and JSON for scripts, for each subcommand. The JSON field
//! names are a stable interface (documented in the README).

pub mod cache;

use crate::analysis::{Histogram, Moments};
use crate::arch::ModelInfo;
use crate::finding::{Finding, Severity, Tally};
use crate::format::Tensor;
use crate::format::model::{Model, Source};
use crate::quant::{LogicalTensors, LogicalWeight, Quantization};
use crate::text::{
    Bytes, Count, Counted, Shape, display_width, escape, escape_path, format_bytes, format_count,
    is_numeric_part, natural_cmp,
};
use crate::tree::{DtypeMix, DtypeSet, Fingerprints, LayerTree, NodeId, ROOT};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};
use std::fmt::Write as _;
use std::io::{self, Write};

mod map;
pub use map::{MapReport, layer_numbers, legend, value_text};

/// A headless command's output, as text for people or JSON for scripts.
pub trait Report {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()>;
    fn write_json(&self, out: &mut dyn Write) -> io::Result<()>;
}

/// Writes a value as one JSON document followed by a newline. Strings keep their exact text,
/// but the characters that could drive or disguise a terminal (C1 controls, bidirectional
/// overrides, invisible marks) are written as `\uXXXX` escapes, as the C0 controls already are,
/// so that printing the document is safe.
pub fn write_json<W: Write + ?Sized, T: Serialize>(out: &mut W, value: &T) -> io::Result<()> {
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut *out, SafeFormatter(PrettyFormatter::new()));
    value.serialize(&mut serializer)?;
    writeln!(out)
}

/// The `serde_json` pretty printer, escaping what [`crate::text::escape`] escapes in strings.
struct SafeFormatter<'a>(PrettyFormatter<'a>);

impl Formatter for SafeFormatter<'_> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((at, c)) = rest
            .char_indices()
            .find(|&(_, c)| crate::text::is_hazard(c))
        {
            writer.write_all(&rest.as_bytes()[..at])?;
            write!(writer, "\\u{:04x}", u32::from(c))?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }

    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_array(writer)
    }
    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array(writer)
    }
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(writer, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array_value(writer)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object(writer)
    }
    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object(writer)
    }
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(writer, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object_value(writer)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object_value(writer)
    }
}

#[derive(Debug, Serialize)]
pub struct FileJson {
    pub path: String,
    pub bytes: u64,
    pub header_bytes: Option<u64>,
    pub valid: bool,
    /// The reference's error variant when it rejects the file.
    pub rejection: Option<&'static str>,
}

fn files_json(model: &Model) -> Vec<FileJson> {
    model
        .shards
        .iter()
        .map(|shard| FileJson {
            path: shard.path.to_string_lossy().into_owned(),
            bytes: shard.file_len,
            header_bytes: shard.header_len,
            valid: shard.readable && shard.rejection.is_none(),
            rejection: shard
                .rejection
                .as_ref()
                .map(crate::format::Rejection::variant),
        })
        .collect()
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::File => "file",
        Source::Index => "index",
        Source::Folder => "folder",
    }
}

#[derive(Serialize)]
struct DtypeJson {
    dtype: String,
    tensors: u64,
    parameters: u64,
    bytes: u64,
}

fn dtypes_json(mix: &DtypeMix) -> Vec<DtypeJson> {
    mix.0
        .iter()
        .map(|share| DtypeJson {
            dtype: share.name("unknown").to_owned(),
            tensors: share.tensors,
            parameters: share.parameters,
            bytes: share.bytes,
        })
        .collect()
}

#[derive(Serialize)]
struct TensorJson<'a> {
    name: &'a str,
    dtype: &'a str,
    shape: &'a crate::format::Shape,
    /// `None` for a logical weight, whose bytes are its members'.
    #[serde(skip_serializing_if = "Option::is_none")]
    data_offsets: Option<[u64; 2]>,
    file: &'a str,
    parameters: Option<u64>,
    bytes: u64,
    /// A logical weight's stored tensors.
    #[serde(skip_serializing_if = "Option::is_none")]
    members: Option<Vec<&'a str>>,
}

#[derive(Serialize)]
struct InspectJson<'a> {
    path: String,
    source: &'static str,
    files: Vec<FileJson>,
    valid: bool,
    filter: Option<&'a str>,
    tensor_count: u64,
    parameters: u64,
    total_bytes: u64,
    file_bytes: u64,
    dtypes: Vec<DtypeJson>,
    metadata: &'a crate::format::StringMap,
    structural_id: &'a str,
    architecture: Option<&'a ModelInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quantization: Option<QuantizationJson<'a>>,
    tensors: TensorListJson<'a>,
}

/// A quantized model's scheme and its logical weights, for `inspect --json`.
#[derive(Serialize)]
struct QuantizationJson<'a> {
    scheme: String,
    declared: Option<String>,
    bits_per_weight: f64,
    rotated: bool,
    weights: Vec<LogicalWeightJson<'a>>,
}

#[derive(Serialize)]
struct LogicalWeightJson<'a> {
    name: &'a str,
    shape: &'a crate::format::Shape,
    scheme: String,
    bits_per_weight: f64,
    members: Vec<&'a str>,
}

/// The logical weights by name, whatever the order of the model's tensors.
fn quantization_json<'a>(model: &'a Model, quantization: &'a Quantization) -> QuantizationJson<'a> {
    let mut by_name: Vec<(usize, &LogicalWeight)> =
        quantization.weights.iter().enumerate().collect();
    by_name.sort_unstable_by(|a, b| {
        crate::text::byte_order(a.1.info.name.as_bytes(), b.1.info.name.as_bytes())
    });
    QuantizationJson {
        scheme: quantization.summary(),
        declared: quantization
            .declared
            .as_ref()
            .map(crate::quant::Declared::summary),
        bits_per_weight: quantization.bits_per_weight(),
        rotated: quantization.rotated,
        weights: by_name
            .into_iter()
            .map(|(index, weight)| LogicalWeightJson {
                name: &weight.info.name,
                shape: &weight.info.shape,
                scheme: weight.scheme.to_string(),
                bits_per_weight: weight.bits_per_weight(),
                members: quantization
                    .members(index)
                    .iter()
                    .map(|m| model.tensors[m.tensor as usize].name())
                    .collect(),
            })
            .collect(),
    }
}

/// Every tensor of the tree in display order, written as it is walked rather than gathered
/// first: the listing of a million tensors would otherwise be held whole.
struct TensorListJson<'a> {
    shown: Shown<'a>,
    tree: &'a LayerTree,
}

impl Serialize for TensorListJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let shown = self.shown;
        serializer.collect_seq(self.tree.tensors_below(ROOT).map(|index| {
            let tensor = &shown.tensors[index];
            let members = shown.members(index).map(|members| {
                members
                    .iter()
                    .map(|m| shown.model.tensors[m.tensor as usize].name())
                    .collect()
            });
            TensorJson {
                name: tensor.name(),
                dtype: tensor.info.dtype.name(),
                shape: &tensor.info.shape,
                data_offsets: members.is_none().then_some(tensor.info.data_offsets),
                file: &shown.model.shard_of(tensor).label,
                parameters: tensor.info.element_count(),
                bytes: tensor.info.byte_len(),
                members,
            }
        }))
    }
}

/// What a listing shows: the tensors its tree was built from (the model's own, or a quantized
/// model's [`LogicalTensors`]) and, for the latter, each logical weight's members.
#[derive(Clone, Copy, Debug)]
pub struct Shown<'a> {
    pub model: &'a Model,
    pub tensors: &'a [Tensor],
    pub logical: Option<(&'a LogicalTensors, &'a Quantization)>,
}

impl<'a> Shown<'a> {
    /// The model's stored tensors.
    pub fn stored(model: &'a Model) -> Shown<'a> {
        Shown {
            model,
            tensors: &model.tensors,
            logical: None,
        }
    }

    /// A quantized model's logical weights in place of their members.
    pub fn logical(
        model: &'a Model,
        logical: &'a LogicalTensors,
        quantization: &'a Quantization,
    ) -> Shown<'a> {
        Shown {
            model,
            tensors: &logical.tensors,
            logical: Some((logical, quantization)),
        }
    }

    /// The members of shown tensor `index`, when it is a logical weight.
    fn members(&self, index: usize) -> Option<&'a [crate::quant::Member]> {
        let (logical, quantization) = self.logical?;
        Some(quantization.members(logical.weight(index)?))
    }
}

/// How `inspect` shows the tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// The layer tree, with runs of identically shaped numbered siblings (`layers.0` to
    /// `layers.31`) shown once, as `0-31 ×32`.
    Tree,
    /// The layer tree with every node.
    Expanded,
    /// One tensor per line, full names.
    Flat,
}

/// `stui inspect`: the model in one view. `tree` holds the tensors shown (filtered or all).
#[derive(Debug)]
pub struct Inspect<'a> {
    pub shown: Shown<'a>,
    pub tree: &'a LayerTree,
    pub filter: Option<&'a str>,
    pub architecture: Option<&'a ModelInfo>,
    pub quantization: Option<&'a Quantization>,
    /// [`crate::hash::structural_id`] of the model.
    pub structural_id: &'a str,
}

impl Inspect<'_> {
    pub fn write_json<W: Write>(&self, out: &mut W) -> io::Result<()> {
        let model = self.shown.model;
        let tensors = self.shown.tensors;
        let totals = self.tree.totals(ROOT, tensors);
        write_json(
            out,
            &InspectJson {
                path: model.path.to_string_lossy().into_owned(),
                source: source_name(model.source),
                files: files_json(model),
                valid: model.is_valid(),
                filter: self.filter,
                tensor_count: u64::from(totals.tensors),
                parameters: totals.parameters,
                total_bytes: totals.bytes,
                file_bytes: model.file_bytes(),
                dtypes: dtypes_json(&self.tree.dtype_mix(ROOT, tensors)),
                metadata: &model.metadata,
                structural_id: self.structural_id,
                architecture: self.architecture,
                quantization: self.quantization.map(|q| quantization_json(model, q)),
                tensors: TensorListJson {
                    shown: self.shown,
                    tree: self.tree,
                },
            },
        )
    }

    pub fn write_text<W: Write>(&self, out: &mut W, listing: Listing) -> io::Result<()> {
        self.write_summary(out)?;
        writeln!(out)?;
        write_rows(out, self.shown, self.tree, listing)
    }

    fn write_summary<W: Write>(&self, out: &mut W) -> io::Result<()> {
        let model = self.shown.model;
        let tensors = self.shown.tensors;
        let totals = self.tree.totals(ROOT, tensors);
        let verdict = if model.is_valid() {
            "valid"
        } else {
            "NOT VALID (see `stui check`)"
        };
        let header: u64 = model.shards.iter().filter_map(|s| s.header_len).sum();
        match &model.shards[..] {
            [single] if model.source == Source::File => writeln!(
                out,
                "file        {}  {}, header {}  {verdict}",
                escape_path(&single.path),
                format_bytes(single.file_len),
                format_bytes(header)
            )?,
            shards => writeln!(
                out,
                "model       {}  {} in {}, {}  {verdict}",
                escape_path(&model.path),
                format_bytes(model.file_bytes()),
                Counted(shards.len(), "file"),
                if shards.len() == 1 {
                    format!("header {}", format_bytes(header))
                } else {
                    format!("headers {}", format_bytes(header))
                }
            )?,
        }
        let all = model.tensors.len() as u64;
        let matched = match self.filter {
            Some(filter) => format!(" of {all} match `{}`", escape(filter)),
            None => String::new(),
        };
        writeln!(
            out,
            "tensors     {}{matched}  parameters {}  data {}",
            totals.tensors,
            format_count(totals.parameters),
            format_bytes(totals.bytes)
        )?;
        let dtypes: Vec<String> = self
            .tree
            .dtype_mix(ROOT, tensors)
            .0
            .iter()
            .map(|share| {
                let percent = if totals.bytes == 0 {
                    0.0
                } else {
                    share.bytes as f64 * 100.0 / totals.bytes as f64
                };
                format!(
                    "{} {} ({percent:.0}%)",
                    share.name("unknown"),
                    share.tensors
                )
            })
            .collect();
        writeln!(out, "structure   {}", self.structural_id)?;
        self.write_identity(out)?;
        writeln!(
            out,
            "dtypes      {}",
            if dtypes.is_empty() {
                "-".into()
            } else {
                dtypes.join(", ")
            }
        )?;
        if model.metadata.is_empty() {
            writeln!(out, "metadata    -")?;
        }
        for (i, (key, value)) in model.metadata.iter().enumerate() {
            let label = if i == 0 { "metadata" } else { "" };
            writeln!(
                out,
                "{label:<12}{} = {}",
                escape(key),
                escape(&shorten(value, 200))
            )?;
        }
        Ok(())
    }

    /// The `arch`, `pattern` and `quantized` lines: what the model is.
    fn write_identity<W: Write>(&self, out: &mut W) -> io::Result<()> {
        if let Some(architecture) = self.architecture {
            writeln!(out, "arch        {architecture}")?;
            for (i, pattern) in architecture.patterns().enumerate() {
                let label = if i == 0 { "pattern" } else { "" };
                let stack = pattern
                    .stack
                    .as_deref()
                    .map_or_else(String::new, |stack| format!("`{}` ", escape(stack)));
                writeln!(out, "{label:<12}{stack}{}", pattern.summary)?;
            }
        }
        if let Some(quantization) = self.quantization {
            writeln!(
                out,
                "quantized   {}  {:.2} bits/weight  {}{}",
                escape(&quantization.summary()),
                quantization.bits_per_weight(),
                Counted(quantization.weights.len(), "weight"),
                quantization
                    .declared
                    .as_ref()
                    .map_or_else(String::new, |d| format!("  declared: {}", d.summary()))
            )?;
        }
        Ok(())
    }
}

/// A value cut to `max` characters, with a note of how long it was.
fn shorten(value: &str, max: usize) -> String {
    match value.char_indices().nth(max) {
        Some((cut, _)) => format!("{}... ({} bytes)", &value[..cut], value.len()),
        None => value.to_owned(),
    }
}

/// One line of the tensor listing, its buffers reused from line to line.
#[derive(Default)]
struct Row {
    /// Columns the tree guides take before `label`.
    indent: usize,
    /// When only measuring: the widths of the dtype and shape columns, the texts left empty.
    measured: Option<(usize, usize)>,
    label: String,
    dtype: String,
    shape: String,
    parameters: String,
    bytes: String,
}

impl Row {
    fn clear(&mut self) {
        self.indent = 0;
        self.measured = None;
        for text in [
            &mut self.label,
            &mut self.dtype,
            &mut self.shape,
            &mut self.parameters,
            &mut self.bytes,
        ] {
            text.clear();
        }
    }

    /// Measures the dtype and shape columns for node `id` without writing them out.
    fn measure(&mut self, tensors: &[Tensor], tree: &LayerTree, id: NodeId) {
        let node = tree.node(id);
        self.measured = Some(match node.tensor() {
            Some(index) if tree.children(id).is_empty() => {
                Self::measure_tensor(&tensors[index].info)
            }
            _ => {
                let digits = |n: u64| n.checked_ilog10().unwrap_or(0) as usize + 1;
                let totals = tree.totals(id, tensors);
                let dtypes = totals.dtypes;
                let dtype = if dtypes.len() == 1 {
                    4
                } else {
                    set_label(dtypes).len()
                };
                (dtype, digits(u64::from(totals.tensors)) + " tensors".len())
            }
        });
    }

    /// The dtype and shape columns' widths for a tensor.
    fn measure_tensor(info: &crate::format::TensorInfo) -> (usize, usize) {
        let digits = |n: u64| n.checked_ilog10().unwrap_or(0) as usize + 1;
        let dims: usize = info.shape.iter().map(digits).sum();
        let shape = 2 + dims + 2 * info.shape.len().saturating_sub(1);
        (display_width(&escape(info.dtype.name())), shape)
    }

    /// Fills the columns after the label with a tensor's own figures.
    fn fill_tensor(&mut self, info: &crate::format::TensorInfo) {
        self.dtype.push_str(&escape(info.dtype.name()));
        let _ = write!(self.shape, "{}", Shape(&info.shape));
        match info.element_count() {
            Some(count) => write!(self.parameters, "{}", Count(count)),
            None => write!(self.parameters, "overflow"),
        }
        .ok();
        let _ = write!(self.bytes, "{}", Bytes(info.byte_len()));
    }

    /// Fills the columns after the label for node `id`: a tensor's own figures, or a group's totals.
    fn fill(&mut self, tensors: &[Tensor], tree: &LayerTree, id: NodeId) {
        let node = tree.node(id);
        match node.tensor() {
            Some(index) if tree.children(id).is_empty() => self.fill_tensor(&tensors[index].info),
            _ => {
                let totals = tree.totals(id, tensors);
                self.dtype.push_str(&set_label(totals.dtypes));
                let _ = write!(self.shape, "{}", Counted(totals.tensors, "tensor"));
                let _ = write!(self.parameters, "{}", Count(totals.parameters));
                let _ = write!(self.bytes, "{}", Bytes(totals.bytes));
            }
        }
    }
}

/// Produces the listing's rows one at a time, handing each to `emit`; with `measure`, only the
/// label is written out and the other columns measured. `prints` are the tree's
/// [`Fingerprints`] when identical siblings are to be folded.
fn for_each_row(
    shown: Shown,
    tree: &LayerTree,
    listing: Listing,
    prints: Option<&Fingerprints>,
    measure: bool,
    mut emit: impl FnMut(&Row),
) {
    let tensors = shown.tensors;
    let mut row = Row::default();
    let fill = |row: &mut Row, id| {
        if measure {
            row.measure(tensors, tree, id);
        } else {
            row.fill(tensors, tree, id);
        }
    };
    if listing == Listing::Flat {
        for index in tree.tensors_below(ROOT) {
            let Some(id) = tree.node_of_tensor(index) else {
                continue;
            };
            row.clear();
            row.label.push_str(&escape(tensors[index].name()));
            fill(&mut row, id);
            emit(&row);
        }
        return;
    }
    // Depth first: at each depth, the children being listed and the next to list. Rows are made
    // as they are shown, so a group of a million children costs no more than one of ten.
    // `guides` holds, per depth, whether a guide line continues below.
    let mut stack: Vec<(&[NodeId], usize)> = vec![(tree.children(ROOT), 0)];
    let mut guides: Vec<bool> = Vec::new();
    while let Some(top) = stack.last_mut() {
        let (children, next) = *top;
        if next == children.len() {
            stack.pop();
            continue;
        }
        let (id, run, end) = sibling_row(tree, prints, children, next);
        top.1 = end;
        let depth = stack.len() - 1;
        let last = end == children.len();
        let segment = tree.segment(id);
        let label = match (run, segment.split_once('.')) {
            (Some(run), None) => format!("{}-{} ×{}", run.first, run.last, run.count),
            (Some(run), Some((_, rest))) => {
                format!("{}-{}.{rest} ×{}", run.first, run.last, run.count)
            }
            (None, _) => segment.to_owned(),
        };
        row.clear();
        guides.truncate(depth);
        if depth > 0 {
            for &open in &guides[1..] {
                row.label.push_str(if open { "│  " } else { "   " });
            }
            row.label.push_str(if last { "└─ " } else { "├─ " });
        }
        row.indent = 3 * depth;
        row.label.push_str(&escape(&label));
        fill(&mut row, id);
        emit(&row);
        guides.push(!last);
        if listing == Listing::Expanded {
            let members = tree
                .node(id)
                .tensor()
                .and_then(|index| Some((tensors[index].name(), shown.members(index)?)));
            if let Some((weight, members)) = members {
                for (k, member) in members.iter().enumerate() {
                    let info = &shown.model.tensors[member.tensor as usize].info;
                    row.clear();
                    for &open in &guides[1..] {
                        row.label.push_str(if open { "│  " } else { "   " });
                    }
                    row.label.push_str(if k + 1 == members.len() {
                        "└─ "
                    } else {
                        "├─ "
                    });
                    row.indent = 3 * (depth + 1);
                    row.label
                        .push_str(&escape(crate::quant::listed::member_label(
                            weight, &info.name,
                        )));
                    if measure {
                        row.measured = Some(Row::measure_tensor(info));
                    } else {
                        row.fill_tensor(info);
                    }
                    emit(&row);
                }
            }
        }
        stack.push((tree.children(id), 0));
    }
}

/// A run of numbered siblings with identical structure, shown as its first member.
#[derive(Clone, Copy, Debug)]
struct Run {
    first: u64,
    last: u64,
    count: u64,
}

/// The row that starts at `children[i]`: the child alone or, when `prints` is given, the run of
/// consecutively numbered, identically shaped siblings it begins (`3`, `4`, …, or `3.weight`,
/// `4.weight`, … when each holds one tensor); and the index after the row.
fn sibling_row(
    tree: &LayerTree,
    prints: Option<&Fingerprints>,
    children: &[NodeId],
    i: usize,
) -> (NodeId, Option<Run>, usize) {
    // The number a segment starts with, and the parts after it.
    let number = |child: NodeId| {
        let segment = tree.segment(child);
        let (first, rest) = segment.split_once('.').unwrap_or((segment, ""));
        let canonical = first == "0" || !first.starts_with('0');
        first
            .parse::<u64>()
            .ok()
            .filter(|_| canonical && is_numeric_part(first))
            .map(|number| (number, rest))
    };
    let first = children[i];
    if let (Some(prints), Some((start, rest))) = (prints, number(first)) {
        let mut end = i + 1;
        while end < children.len()
            && prints.of(children[end]) == prints.of(first)
            && number(children[end]) == start.checked_add((end - i) as u64).map(|next| (next, rest))
        {
            end += 1;
        }
        let count = (end - i) as u64;
        if count > 1 {
            let run = Run {
                first: start,
                last: start + count - 1,
                count,
            };
            return (first, Some(run), end);
        }
    }
    (first, None, i + 1)
}

/// `BF16`, `BF16+F32`, `quant+BF16` (quantized weights and BF16 tensors), or `3 dtypes`.
pub fn set_label(set: DtypeSet) -> String {
    let mut names = set
        .iter()
        .map(|d| d.map_or("?", |d| d.name()))
        .chain(set.has_quantized().then_some("quant"));
    match (set.len(), names.next(), names.next()) {
        (0, ..) => "-".into(),
        (1, Some(a), _) => a.into(),
        (2, Some(a), Some(b)) => format!("{b}+{a}"),
        (n, ..) => format!("{n} dtypes"),
    }
}

/// `BF16`, `BF16+F32`, or `3 dtypes`, largest share first.
pub fn mix_label(mix: &DtypeMix) -> String {
    fn name(share: &crate::tree::DtypeShare) -> &str {
        share.name("?")
    }
    match &mix.0[..] {
        [] => "-".into(),
        [one] => name(one).into(),
        [a, b] => format!("{}+{}", name(a), name(b)),
        more => format!("{} dtypes", more.len()),
    }
}

/// Writes the listing: one pass to size the columns, one to write them.
fn write_rows<W: Write>(
    out: &mut W,
    shown: Shown,
    tree: &LayerTree,
    listing: Listing,
) -> io::Result<()> {
    const MAX_LABEL: usize = 72;
    // Parameters and bytes take at most 6 and 8 columns ("65.5 M", "1023 KiB").
    let mut widths = [4, 5, 5, 6, 8];
    let prints = (listing == Listing::Tree).then(|| Fingerprints::new(tree, shown.tensors));
    let prints = prints.as_ref();
    for_each_row(shown, tree, listing, prints, true, |row| {
        widths[0] = widths[0].max(row.width(0, &row.label));
        if let Some((dtype, shape)) = row.measured {
            widths[1] = widths[1].max(dtype);
            widths[2] = widths[2].max(shape);
        }
    });
    widths[0] = widths[0].min(MAX_LABEL);
    let header = Row {
        indent: 0,
        measured: None,
        label: "NAME".into(),
        dtype: "DTYPE".into(),
        shape: "SHAPE".into(),
        parameters: "PARAMS".into(),
        bytes: "BYTES".into(),
    };
    let mut line = String::with_capacity(160);
    let mut result = Ok(());
    let mut write_row = |row: &Row| {
        if result.is_err() {
            return;
        }
        line.clear();
        for (column, (text, width)) in row.columns().into_iter().zip(widths).enumerate() {
            if column > 0 {
                line.push_str("  ");
            }
            let fill = width.saturating_sub(row.width(column, text));
            if column >= 3 {
                line.extend(std::iter::repeat_n(' ', fill));
                line.push_str(text);
            } else {
                line.push_str(text);
                line.extend(std::iter::repeat_n(' ', fill));
            }
        }
        line.truncate(line.trim_end().len());
        line.push('\n');
        result = out.write_all(line.as_bytes());
    };
    write_row(&header);
    for_each_row(shown, tree, listing, prints, false, write_row);
    result
}

impl Row {
    fn columns(&self) -> [&str; 5] {
        [
            &self.label,
            &self.dtype,
            &self.shape,
            &self.parameters,
            &self.bytes,
        ]
    }

    /// Terminal columns a cell takes; the label's tree guides are counted, not measured.
    fn width(&self, column: usize, text: &str) -> usize {
        if column == 0 && self.indent > 0 {
            let guides = self
                .label
                .char_indices()
                .nth(self.indent)
                .map_or(self.label.len(), |(at, _)| at);
            self.indent + display_width(&self.label[guides..])
        } else {
            display_width(text)
        }
    }
}

#[derive(Serialize)]
struct RejectionJson<'a> {
    file: &'a str,
    variant: &'static str,
    message: String,
}

#[derive(Serialize)]
struct CheckJson<'a> {
    path: String,
    valid: bool,
    rejection: Option<RejectionJson<'a>>,
    files: Vec<FileJson>,
    findings: &'a [Finding],
    summary: Tally,
}

/// `stui check`: every finding and the strict verdict.
#[derive(Debug)]
pub struct Check<'a> {
    pub model: &'a Model,
    pub findings: &'a [Finding],
}

impl Report for Check<'_> {
    fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        let rejection = self
            .model
            .first_rejection()
            .map(|(shard, rejection)| RejectionJson {
                file: &shard.label,
                variant: rejection.variant(),
                message: rejection.to_string(),
            });
        write_json(
            out,
            &CheckJson {
                path: self.model.path.to_string_lossy().into_owned(),
                valid: self.model.is_valid(),
                rejection,
                files: files_json(self.model),
                findings: self.findings,
                summary: Tally::of(self.findings),
            },
        )
    }

    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let model = self.model;
        let verdict = match model.first_rejection() {
            None if model.is_valid() => "valid: the reference implementation accepts it".to_owned(),
            None if model.shards.is_empty() => {
                "NOT VALID: no file of the model could be read".to_owned()
            }
            None => "NOT VALID: a file of the model is missing or unreadable".to_owned(),
            Some((shard, rejection)) => {
                let which = if model.shards.len() > 1 {
                    format!(" `{}`", escape(&shard.label))
                } else {
                    String::new()
                };
                format!(
                    "NOT VALID: the reference implementation rejects{which}: {} ({rejection})",
                    rejection.variant()
                )
            }
        };
        writeln!(out, "{}: {verdict}", escape_path(&model.path))?;
        for finding in self.findings {
            write_finding(out, finding)?;
        }
        let tally = Tally::of(self.findings);
        writeln!(
            out,
            "{}: {}, {}, {} info",
            Counted(self.findings.len(), "finding"),
            Counted(tally.errors, "error"),
            Counted(tally.warnings, "warning"),
            tally.info
        )
    }
}

/// One finding on one line: severity, code, where, and what.
pub fn write_finding<W: Write + ?Sized>(out: &mut W, finding: &Finding) -> io::Result<()> {
    let mut place = String::new();
    if let Some(file) = &finding.file {
        place.push_str(&escape(file));
        place.push_str(": ");
    }
    if let Some(tensor) = &finding.tensor {
        place.push('`');
        place.push_str(&escape(tensor));
        place.push_str("`: ");
    }
    let severity = match finding.severity {
        Severity::Error => "ERROR",
        Severity::Warning => "warning",
        Severity::Info => "info",
    };
    writeln!(
        out,
        "  {severity:<7} {:<24} {place}{}",
        finding.code.as_str(),
        escape(&finding.message)
    )
}

/// One tensor's line of `stui stats`.
#[derive(Debug)]
pub struct StatsRow<'a> {
    pub name: &'a str,
    pub dtype: &'a str,
    pub moments: Option<&'a Moments>,
    pub histogram: Option<&'a Histogram>,
    /// A logical weight's code counts.
    pub codes: Option<&'a crate::quant::kernels::CodeCounts>,
}

impl StatsRow<'_> {
    /// Holds NaN or Inf.
    pub fn is_broken(&self) -> bool {
        self.moments
            .is_some_and(|m| m.nan + m.pos_inf + m.neg_inf > 0)
    }
}

#[derive(Serialize)]
struct HistogramJson<'a> {
    edges: Vec<f64>,
    counts: &'a [u64],
    log2: &'a [(i32, u64)],
    zeros: u64,
}

#[derive(Serialize)]
struct StatsRowJson<'a> {
    name: &'a str,
    dtype: &'a str,
    count: Option<u64>,
    min: Option<f64>,
    max: Option<f64>,
    mean: Option<f64>,
    std: Option<f64>,
    absmax: Option<f64>,
    nan: Option<u64>,
    pos_inf: Option<u64>,
    neg_inf: Option<u64>,
    zeros: Option<u64>,
    subnormals: Option<u64>,
    histogram: Option<HistogramJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    codes: Option<CodesJson<'a>>,
}

/// A logical weight's codes: how many levels, how many used, how many elements at the integer
/// extremes, and the count of each level.
#[derive(Serialize)]
struct CodesJson<'a> {
    levels: usize,
    used: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    clipped_low: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    clipped_high: Option<u64>,
    counts: &'a [u64],
}

impl<'a> StatsRowJson<'a> {
    fn of(row: &StatsRow<'a>) -> StatsRowJson<'a> {
        let finite = |m: &Moments, value: f64| (m.finite() > 0).then_some(value);
        let m = row.moments;
        StatsRowJson {
            name: row.name,
            dtype: row.dtype,
            count: m.map(|m| m.count),
            min: m.and_then(|m| finite(m, m.min)),
            max: m.and_then(|m| finite(m, m.max)),
            mean: m.and_then(Moments::mean),
            std: m.and_then(Moments::std),
            absmax: m.and_then(Moments::absmax),
            nan: m.map(|m| m.nan),
            pos_inf: m.map(|m| m.pos_inf),
            neg_inf: m.map(|m| m.neg_inf),
            zeros: m.map(|m| m.zeros),
            subnormals: m.map(|m| m.subnormals),
            histogram: row.histogram.map(|h| HistogramJson {
                edges: h.edges(),
                counts: &h.counts,
                log2: &h.log2,
                zeros: h.zeros,
            }),
            codes: row.codes.map(|codes| {
                let clipped = codes.clipped();
                CodesJson {
                    levels: codes.space.levels,
                    used: codes.used(),
                    clipped_low: clipped.map(|(low, _)| low),
                    clipped_high: clipped.map(|(_, high)| high),
                    counts: &codes.counts,
                }
            }),
        }
    }
}

/// `stui stats` output, written as tensors finish: every tensor's statistics in display order,
/// those holding NaN or Inf first, then the findings.
///
/// Rows and findings are rendered as they come and kept in spooled temporary files, in memory
/// while small and on disk past [`SPOOL_IN_MEMORY`], then copied out in order: a model of a
/// million tensors is not held as a million results.
#[derive(Debug)]
pub struct StatsWriter {
    json: bool,
    name_width: usize,
    dtype_width: usize,
    broken: Spool,
    rest: Spool,
    findings: Spool,
    tally: Tally,
}

/// Bytes of output a spool keeps in memory before it moves to a temporary file.
const SPOOL_IN_MEMORY: usize = 1 << 20;

/// Rendered rows or findings, counted.
#[derive(Debug)]
struct Spool {
    out: io::BufWriter<tempfile::SpooledTempFile>,
    items: usize,
}

impl Spool {
    /// Keeping up to `in_memory` bytes in memory.
    fn new(in_memory: usize) -> Spool {
        Spool {
            out: io::BufWriter::new(tempfile::SpooledTempFile::new(in_memory)),
            items: 0,
        }
    }

    /// Adds `value` as an element of a JSON array nested one level deep (a field of the
    /// document), as the pretty printer would write it there.
    fn push_json(&mut self, value: &impl Serialize) -> io::Result<()> {
        if self.items > 0 {
            self.out.write_all(b",\n")?;
        }
        self.out.write_all(b"    ")?;
        write_pretty_indented(&mut self.out, value, "    ")?;
        self.items += 1;
        Ok(())
    }

    /// Copies out what the spool holds.
    fn copy_to(self, out: &mut dyn Write) -> io::Result<()> {
        use std::io::{Seek, SeekFrom};
        let mut spooled = self
            .out
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?;
        spooled.seek(SeekFrom::Start(0))?;
        io::copy(&mut spooled, out).map(|_| ())
    }
}

/// Writes `value` as the pretty printer would at a nesting of `indent`: every line after the
/// first indented by it.
fn write_pretty_indented<W: Write + ?Sized>(
    out: &mut W,
    value: &impl Serialize,
    indent: &str,
) -> io::Result<()> {
    let mut text = Vec::new();
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut text, SafeFormatter(PrettyFormatter::new()));
    value.serialize(&mut serializer)?;
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if i > 0 {
            out.write_all(b"\n")?;
            out.write_all(indent.as_bytes())?;
        }
        out.write_all(line)?;
    }
    Ok(())
}

/// Writes a field of a pretty-printed document, at the top level of its object.
fn write_field(out: &mut dyn Write, key: &str, value: &impl Serialize) -> io::Result<()> {
    write!(out, "  \"{key}\": ")?;
    write_pretty_indented(out, value, "  ")
}

/// Writes the elements spooled as a JSON array field's value, one spool after the other.
fn write_spooled_array(out: &mut dyn Write, spools: Vec<Spool>) -> io::Result<()> {
    if spools.iter().all(|spool| spool.items == 0) {
        return out.write_all(b"[]");
    }
    out.write_all(b"[\n")?;
    let mut first = true;
    for spool in spools.into_iter().filter(|spool| spool.items > 0) {
        if !first {
            out.write_all(b",\n")?;
        }
        first = false;
        spool.copy_to(out)?;
    }
    out.write_all(b"\n  ]")
}

impl StatsWriter {
    /// For the tensors named `names`, in JSON or text.
    pub fn new<'n>(json: bool, names: impl IntoIterator<Item = &'n str>) -> StatsWriter {
        StatsWriter::spooling(json, names, SPOOL_IN_MEMORY)
    }

    /// Widens the dtype column to `width` (quantized weights' "int4 (GPTQ)").
    #[must_use]
    pub fn with_dtype_width(mut self, width: usize) -> StatsWriter {
        self.dtype_width = self.dtype_width.max(width);
        self
    }

    fn spooling<'n>(
        json: bool,
        names: impl IntoIterator<Item = &'n str>,
        in_memory: usize,
    ) -> StatsWriter {
        let name_width = if json {
            0
        } else {
            names
                .into_iter()
                .map(|name| display_width(&escape(name)))
                .max()
                .unwrap_or(4)
                .clamp(4, 60)
        };
        StatsWriter {
            json,
            name_width,
            dtype_width: 5,
            broken: Spool::new(in_memory),
            rest: Spool::new(in_memory),
            findings: Spool::new(in_memory),
            tally: Tally::default(),
        }
    }

    /// Adds the next tensor's row, in display order.
    pub fn row(&mut self, row: &StatsRow) -> io::Result<()> {
        let spool = if row.is_broken() {
            &mut self.broken
        } else {
            &mut self.rest
        };
        if self.json {
            return spool.push_json(&StatsRowJson::of(row));
        }
        spool.items += 1;
        write_stats_line(&mut spool.out, row, self.name_width, self.dtype_width)
    }

    pub fn finding(&mut self, finding: &Finding) -> io::Result<()> {
        self.tally.add(finding);
        if self.json {
            return self.findings.push_json(finding);
        }
        self.findings.items += 1;
        write_finding(&mut self.findings.out, finding)
    }

    /// Whether any row so far holds NaN or Inf.
    pub fn any_broken(&self) -> bool {
        self.broken.items > 0
    }

    /// Whether any finding so far is an error.
    pub fn any_errors(&self) -> bool {
        self.tally.errors > 0
    }

    /// Writes the whole output.
    pub fn finish(
        self,
        out: &mut dyn Write,
        model: &Model,
        bytes_scanned: u64,
        seconds: f64,
    ) -> io::Result<()> {
        if self.json {
            return self.finish_json(out, model, bytes_scanned, seconds);
        }
        writeln!(
            out,
            "{:<width$}  {:<dtype$}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>6}  {:>6}  {:>8}",
            "NAME",
            "DTYPE",
            "MIN",
            "MAX",
            "MEAN",
            "STD",
            "ABSMAX",
            "NAN",
            "INF",
            "ZEROS",
            width = self.name_width,
            dtype = self.dtype_width
        )?;
        let (rows, broken) = (self.broken.items + self.rest.items, self.broken.items);
        self.broken.copy_to(out)?;
        self.rest.copy_to(out)?;
        if self.findings.items > 0 {
            writeln!(out)?;
        }
        self.findings.copy_to(out)?;
        writeln!(
            out,
            "{}, {broken} with NaN or Inf; {} scanned in {seconds:.2} s; {}, {}, {} info",
            Counted(rows, "tensor"),
            format_bytes(bytes_scanned),
            Counted(self.tally.errors, "error"),
            Counted(self.tally.warnings, "warning"),
            self.tally.info
        )
    }

    /// The document `write_json` would print for these fields, assembled from the spools.
    fn finish_json(
        self,
        out: &mut dyn Write,
        model: &Model,
        bytes_scanned: u64,
        seconds: f64,
    ) -> io::Result<()> {
        out.write_all(b"{\n")?;
        write_field(out, "path", &model.path.to_string_lossy())?;
        out.write_all(b",\n")?;
        write_field(out, "valid", &model.is_valid())?;
        out.write_all(b",\n  \"tensors\": ")?;
        write_spooled_array(out, vec![self.broken, self.rest])?;
        out.write_all(b",\n  \"findings\": ")?;
        write_spooled_array(out, vec![self.findings])?;
        out.write_all(b",\n")?;
        write_field(out, "summary", &self.tally)?;
        out.write_all(b",\n")?;
        write_field(out, "bytes_scanned", &bytes_scanned)?;
        out.write_all(b",\n")?;
        write_field(out, "seconds", &seconds)?;
        out.write_all(b"\n}\n")
    }
}

/// One row of the text table.
fn write_stats_line<W: Write + ?Sized>(
    out: &mut W,
    row: &StatsRow,
    name_width: usize,
    dtype_width: usize,
) -> io::Result<()> {
    let name = escape(row.name);
    let pad = name_width.saturating_sub(display_width(&name));
    let mark = if row.is_broken() { "!" } else { " " };
    write!(
        out,
        "{name}{:pad$}{mark} {:<dtype_width$}",
        "",
        escape(row.dtype)
    )?;
    match row.moments {
        Some(m) => {
            let number = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.4e}"));
            let finite = m.finite() > 0;
            writeln!(
                out,
                "  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>6}  {:>6}  {:>8}",
                number(finite.then_some(m.min)),
                number(finite.then_some(m.max)),
                number(m.mean()),
                number(m.std()),
                number(m.absmax()),
                m.nan,
                m.pos_inf + m.neg_inf,
                m.zeros
            )
        }
        None => writeln!(out, "  (not scanned)"),
    }
}

/// `stui quantize`: what was written, and the tensors that lost the most.
pub fn write_quantize<W: Write>(
    out: &mut W,
    model: &Model,
    summary: &crate::quantize::Summary,
    json: bool,
) -> io::Result<()> {
    if json {
        return write_json(out, &QuantizeJson { model, summary });
    }
    for path in &summary.output {
        writeln!(out, "wrote {}", escape_path(path))?;
    }
    writeln!(
        out,
        "{} quantized to {}, {} kept; {} -> {}; {}",
        Counted(summary.quantized.len(), "tensor"),
        scheme_label(summary),
        summary.kept().count(),
        format_bytes(summary.bytes_before),
        format_bytes(summary.bytes_after),
        if summary.verified {
            "the output is valid"
        } else {
            "THE OUTPUT DID NOT VERIFY"
        }
    )?;
    let beyond: Vec<&str> = summary
        .beyond_range()
        .map(|q| model.tensors[q.tensor].name())
        .collect();
    if !beyond.is_empty() {
        writeln!(
            out,
            "read back as Inf, values beyond the range of the dtype they load in: {}; keep {} \
             with --keep-below-snr (an SNR of -inf falls below any threshold), or choose another \
             scheme",
            crate::text::listed_in_backticks(&beyond, 4),
            if beyond.len() == 1 { "it" } else { "them" }
        )?;
    }
    let below: Vec<&str> = summary
        .kept()
        .filter(|&(_, why)| why == crate::quantize::Kept::BelowSnr)
        .map(|(t, _)| model.tensors[t].name())
        .collect();
    if !below.is_empty() {
        writeln!(out, "kept in source precision (SNR below the threshold):")?;
        for name in below {
            writeln!(out, "  {}", escape(name))?;
        }
    }
    let worst = summary.worst_first();
    if !worst.is_empty() {
        writeln!(
            out,
            "{:<60}  {:>8}  {:>12}  {:>10}",
            "WORST TENSORS", "SNR dB", "MAX ERROR", "REL RMS"
        )?;
    }
    for q in worst.iter().take(10) {
        writeln!(
            out,
            "{:<60}  {:>8.2}  {:>12.4e}  {:>10.4e}",
            escape(model.tensors[q.tensor].name()),
            q.error.snr_db,
            q.error.max_abs_error,
            q.error.relative_rms_error
        )?;
    }
    Ok(())
}

/// Every scheme side by side, as a table or JSON.
pub fn write_comparison<W: Write>(
    out: &mut W,
    model: &Model,
    comparison: &crate::quantize::Comparison,
    json: bool,
) -> io::Result<()> {
    let worst_name =
        |result: &crate::quantize::SchemeResult| result.worst.map(|t| model.tensors[t].name());
    if json {
        #[derive(Serialize)]
        struct Row<'a> {
            #[serde(flatten)]
            result: &'a crate::quantize::SchemeResult,
            worst_tensor: Option<&'a str>,
        }
        #[derive(Serialize)]
        struct Document<'a> {
            schemes: Vec<Row<'a>>,
            non_finite: Vec<&'a str>,
        }
        let document = Document {
            schemes: comparison
                .schemes
                .iter()
                .map(|result| Row {
                    result,
                    worst_tensor: worst_name(result),
                })
                .collect(),
            non_finite: comparison
                .non_finite
                .iter()
                .map(|&t| model.tensors[t].name())
                .collect(),
        };
        return write_json(out, &document);
    }
    writeln!(
        out,
        "{:<12}  {:>7}  {:>10}  {:>9}  {:>9}  {:>9}  WORST TENSOR",
        "SCHEME", "WEIGHTS", "OUTPUT", "BITS/W", "WORST dB", "MEDIAN dB"
    )?;
    for result in &comparison.schemes {
        let [bits, worst_db, median_db] = [
            result.bits_per_weight,
            result.worst_snr_db,
            result.median_snr_db,
        ]
        .map(two_places_or_dash);
        writeln!(
            out,
            "{:<12}  {:>7}  {:>10}  {bits:>9}  {worst_db:>9}  {median_db:>9}  {}",
            result.scheme.name(),
            result.weights,
            format_bytes(result.output_bytes),
            worst_name(result).map(escape).unwrap_or_default()
        )?;
    }
    for &tensor in &comparison.non_finite {
        writeln!(
            out,
            "{} holds NaN or Inf: left out",
            escape(model.tensors[tensor].name())
        )?;
    }
    Ok(())
}

/// A figure of a comparison to two places; `–` where there is none (a scheme that quantizes
/// none of the weights compared has no bits per weight or error).
pub fn two_places_or_dash(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |value| format!("{value:.2}"))
}

/// The scheme of a quantization as the summary says it: `int8 (per channel)` for W8A8.
fn scheme_label(summary: &crate::quantize::Summary) -> String {
    let scales =
        crate::quantize::scales_label(summary.scheme, summary.granularity, summary.group_size);
    match summary.scheme {
        crate::quantize::Scheme::W8A8 => format!("int8 ({scales})"),
        scheme => format!("{scheme} ({scales})"),
    }
}

/// A quantization's summary as JSON, each tensor named as it is written.
struct QuantizeJson<'a> {
    model: &'a Model,
    summary: &'a crate::quantize::Summary,
}

impl Serialize for QuantizeJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let QuantizeJson { model, summary } = *self;
        let name = |tensor: usize| model.tensors[tensor].name();
        let mut json = serializer.serialize_struct("Summary", 9)?;
        json.serialize_field("output", &summary.output)?;
        json.serialize_field("scheme", &summary.scheme)?;
        json.serialize_field("granularity", &summary.granularity)?;
        json.serialize_field("quantized", &QuantizedList(self))?;
        json.serialize_field("kept", &KeptList(self))?;
        json.serialize_field("bytes_before", &summary.bytes_before)?;
        json.serialize_field("bytes_after", &summary.bytes_after)?;
        json.serialize_field("worst", &summary.worst().map(|q| name(q.tensor)))?;
        json.serialize_field("verified", &summary.verified)?;
        json.end()
    }
}

struct QuantizedList<'a>(&'a QuantizeJson<'a>);

impl Serialize for QuantizedList<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let QuantizeJson { model, summary } = *self.0;
        serializer.collect_seq(summary.quantized.iter().map(|q| {
            let dtype = model.tensors[q.tensor].info.dtype.known();
            QuantizedJson {
                name: model.tensors[q.tensor].name(),
                source_dtype: dtype.map_or("?", crate::format::Dtype::name),
                scale_dtype: if summary.scheme == crate::quantize::Scheme::Nvfp4A16 {
                    crate::format::Dtype::F8E4M3.name()
                } else {
                    crate::quantize::scale_dtype(dtype.unwrap_or(crate::format::Dtype::F32)).name()
                },
                error: &q.error,
            }
        }))
    }
}

struct KeptList<'a>(&'a QuantizeJson<'a>);

impl Serialize for KeptList<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let QuantizeJson { model, summary } = *self.0;
        serializer.collect_seq(
            summary
                .kept()
                .map(|(tensor, why)| (model.tensors[tensor].name(), why)),
        )
    }
}

#[derive(Serialize)]
struct QuantizedJson<'a> {
    name: &'a str,
    source_dtype: &'static str,
    scale_dtype: &'static str,
    #[serde(flatten)]
    error: &'a crate::quantize::Error8,
}

/// `stui hash`: file digests (as `sha256sum` prints them), tensor digests, and the structural ID.
#[derive(Debug)]
pub struct Hashes<'a> {
    pub files: Vec<(String, String)>,
    pub tensors: Option<TensorDigests<'a>>,
    pub structural_id: String,
}

/// Each tensor's SHA-256, by index in `tensors`: 32 bytes a tensor, written out in hexadecimal
/// as the output is written.
#[derive(Debug)]
pub struct TensorDigests<'a> {
    pub tensors: &'a [crate::format::Tensor],
    pub digests: Vec<[u8; 32]>,
}

impl TensorDigests<'_> {
    /// Groups of tensors whose bytes are identical (same digest, not empty), each in name order,
    /// in the order of their first names, as indexes into `tensors`: found by sorting indexes,
    /// as a model can have millions of tensors (all of them alike, in a hostile file).
    pub fn duplicates(&self) -> Vec<Vec<u32>> {
        /// The SHA-256 of no bytes: every empty tensor has it.
        const EMPTY: [u8; 32] = [
            0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f,
            0xb9, 0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b,
            0x78, 0x52, 0xb8, 0x55,
        ];
        let name = |i: u32| self.tensors[i as usize].name();
        let mut order: Vec<u32> = (0..self.digests.len())
            .filter(|&i| self.digests[i] != EMPTY)
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        order.sort_unstable_by(|&a, &b| {
            self.digests[a as usize]
                .cmp(&self.digests[b as usize])
                .then_with(|| natural_cmp(name(a), name(b)))
        });
        let mut duplicates: Vec<Vec<u32>> = order
            .chunk_by(|&a, &b| self.digests[a as usize] == self.digests[b as usize])
            .filter(|run| run.len() > 1)
            .map(<[u32]>::to_vec)
            .collect();
        duplicates.sort_by(|a, b| natural_cmp(name(a[0]), name(b[0])));
        duplicates
    }

    fn name(&self, index: u32) -> &str {
        self.tensors[index as usize].name()
    }

    /// Each tensor's name and digest, in the model's order.
    fn rows(&self) -> impl Iterator<Item = (&str, String)> + '_ {
        self.tensors
            .iter()
            .zip(&self.digests)
            .map(|(tensor, digest)| (tensor.name(), crate::hash::hex(digest)))
    }
}

impl Report for Hashes<'_> {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        for (path, digest) in &self.files {
            writeln!(out, "{digest}  {}", escape(path))?;
        }
        for (name, digest) in self.tensors.iter().flat_map(TensorDigests::rows) {
            writeln!(out, "{digest}  tensor {}", escape(name))?;
        }
        writeln!(out, "{}  structural id", self.structural_id)?;
        if let Some(digests) = &self.tensors {
            for group in digests.duplicates() {
                write!(out, "identical bytes: ")?;
                for (i, &index) in group.iter().enumerate() {
                    let separator = if i == 0 { "" } else { ", " };
                    write!(out, "{separator}`{}`", escape(digests.name(index)))?;
                }
                writeln!(out)?;
            }
        }
        Ok(())
    }

    fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        #[derive(Serialize)]
        struct Named<'a> {
            name: &'a str,
            sha256: String,
        }
        /// The groups of identical tensors, by name.
        struct Duplicates<'a>(&'a TensorDigests<'a>, Vec<Vec<u32>>);
        impl Serialize for Duplicates<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let Duplicates(digests, groups) = self;
                serializer.collect_seq(groups.iter().map(|group| {
                    group
                        .iter()
                        .map(|&index| digests.name(index))
                        .collect::<Vec<_>>()
                }))
            }
        }
        /// The tensors' digests, written as they are turned into text.
        struct Rows<'a>(&'a TensorDigests<'a>);
        impl Serialize for Rows<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.rows().map(|(name, sha256)| Named { name, sha256 }))
            }
        }
        #[derive(Serialize)]
        struct Document<'a> {
            files: Vec<Named<'a>>,
            tensors: Option<Rows<'a>>,
            structural_id: &'a str,
            duplicates: Option<Duplicates<'a>>,
        }
        write_json(
            out,
            &Document {
                files: self
                    .files
                    .iter()
                    .map(|(name, sha256)| Named {
                        name,
                        sha256: sha256.clone(),
                    })
                    .collect(),
                tensors: self.tensors.as_ref().map(Rows),
                structural_id: &self.structural_id,
                duplicates: self
                    .tensors
                    .as_ref()
                    .map(|digests| Duplicates(digests, digests.duplicates())),
            },
        )
    }
}

/// `stui diff`: every difference between two models.
#[derive(Debug)]
pub struct Diff<'a> {
    pub a: &'a crate::diff::Side<'a>,
    pub b: &'a crate::diff::Side<'a>,
    pub diff: &'a crate::diff::ModelDiff,
}

impl Report for Diff<'_> {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        use crate::diff::Status;
        writeln!(out, "a  {}", escape_path(&self.a.model.path))?;
        writeln!(out, "b  {}", escape_path(&self.b.model.path))?;
        let (mut same, mut changed, mut added, mut removed, mut unreadable) = (0, 0, 0, 0, 0);
        for tensor in &self.diff.tensors {
            let name = escape(tensor.name(self.a, self.b));
            match &tensor.status {
                Status::Same => same += 1,
                Status::Added => {
                    added += 1;
                    writeln!(out, "added    {name}")?;
                }
                Status::Removed => {
                    removed += 1;
                    writeln!(out, "removed  {name}")?;
                }
                Status::Unreadable { error } => {
                    unreadable += 1;
                    writeln!(out, "unread   {name}  {}", escape(error))?;
                }
                Status::Changed(what) => {
                    let crate::diff::Changed {
                        dtype,
                        shape,
                        change,
                        unaligned,
                    } = what.as_ref();
                    changed += 1;
                    let mut line = format!("changed  {name}");
                    if let Some((x, y)) = dtype {
                        let _ = write!(line, "  dtype {} -> {}", escape(x), escape(y));
                    }
                    if let Some((x, y)) = shape {
                        let _ = write!(line, "  shape {} -> {}", Shape(x), Shape(y));
                    }
                    if let Some(reason) = unaligned {
                        let _ = write!(line, "  {reason}");
                    }
                    if let Some(change) = change {
                        let values = change.changed_values;
                        let verb = if values == 1 { "differs" } else { "differ" };
                        let _ = write!(line, "  {change}  {} {verb}", Counted(values, "value"));
                        match change.nonfinite_mismatches {
                            0 => {}
                            1 => line.push_str(" (1 NaN/Inf mismatch)"),
                            n => {
                                let _ = write!(line, " ({n} NaN/Inf mismatches)");
                            }
                        }
                    }
                    writeln!(out, "{line}")?;
                }
            }
        }
        for entry in &self.diff.metadata {
            let show = |value: &Option<String>| {
                value
                    .as_deref()
                    .map_or_else(|| "(absent)".to_string(), |v| format!("`{}`", escape(v)))
            };
            writeln!(
                out,
                "metadata `{}`: {} -> {}",
                escape(&entry.key),
                show(&entry.a),
                show(&entry.b)
            )?;
        }
        let verdict = if self.diff.identical() {
            "identical"
        } else {
            "different"
        };
        writeln!(
            out,
            "{verdict}: {same} same, {changed} changed, {added} added, {removed} removed, \
             {unreadable} unreadable; {}",
            Counted(self.diff.metadata.len(), "metadata difference")
        )?;
        if !self.diff.values_compared {
            writeln!(
                out,
                "layout only (names, dtypes, shapes, metadata): a model read from the Hub has \
                 its values compared only once downloaded"
            )?;
        }
        Ok(())
    }

    fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        #[derive(Serialize)]
        struct Named<'a> {
            name: &'a str,
            #[serde(flatten)]
            status: &'a crate::diff::Status,
        }
        /// Every tensor with its name, written as it is looked up.
        struct Tensors<'a>(&'a Diff<'a>);
        impl Serialize for Tensors<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let Diff { a, b, diff } = self.0;
                serializer.collect_seq(diff.tensors.iter().map(|tensor| Named {
                    name: tensor.name(a, b),
                    status: &tensor.status,
                }))
            }
        }
        #[derive(Serialize)]
        struct Document<'a> {
            a: String,
            b: String,
            identical: bool,
            values_compared: bool,
            tensors: Tensors<'a>,
            metadata: &'a [crate::diff::MetadataDiff],
        }
        write_json(
            out,
            &Document {
                a: self.a.model.path.to_string_lossy().into_owned(),
                b: self.b.model.path.to_string_lossy().into_owned(),
                identical: self.diff.identical(),
                values_compared: self.diff.values_compared,
                tensors: Tensors(self),
                metadata: &self.diff.metadata,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_group_tensors_with_identical_bytes() {
        use sha2::Digest;
        let digest = |bytes: &[u8]| -> [u8; 32] { sha2::Sha256::digest(bytes).into() };
        let named = [
            ("layers.10.w", digest(b"a")),
            ("layers.2.w", digest(b"a")),
            ("embed", digest(b"b")),
            ("lm_head", digest(b"b")),
            ("bias", digest(b"c")),
            ("empty.0", digest(b"")),
            ("empty.1", digest(b"")),
        ];
        let tensors: Vec<crate::format::Tensor> = named
            .iter()
            .map(|&(name, _)| {
                crate::format::TensorInfo {
                    name: name.into(),
                    dtype: crate::format::Dtype::U8.into(),
                    shape: [1].into(),
                    data_offsets: [0, 1],
                }
                .into()
            })
            .collect();
        let hashes = Hashes {
            files: Vec::new(),
            tensors: Some(TensorDigests {
                tensors: &tensors,
                digests: named.iter().map(|&(_, digest)| digest).collect(),
            }),
            structural_id: "0".repeat(64),
        };
        let digests = hashes.tensors.as_ref().unwrap();
        let groups: Vec<Vec<&str>> = digests
            .duplicates()
            .iter()
            .map(|group| group.iter().map(|&i| digests.name(i)).collect())
            .collect();
        assert_eq!(
            groups,
            [vec!["embed", "lm_head"], vec!["layers.2.w", "layers.10.w"]]
        );
        let mut text = Vec::new();
        hashes.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(&format!(
            "{}  tensor bias\n",
            crate::hash::hex(&digest(b"c"))
        )));
        assert!(text.ends_with(
            "identical bytes: `embed`, `lm_head`\nidentical bytes: `layers.2.w`, `layers.10.w`\n"
        ));
    }
    /// The statistics output written through spools that stay in memory and through spools that
    /// move to disk at once: the same bytes, and in JSON the same document `write_json` prints.
    #[test]
    fn stats_output_is_the_same_spooled_in_memory_or_on_disk() {
        /// The document as `write_json` prints it from one value.
        #[derive(Serialize)]
        struct Expected<'a> {
            path: String,
            valid: bool,
            tensors: Vec<StatsRowJson<'a>>,
            findings: &'a [Finding],
            summary: Tally,
            bytes_scanned: u64,
            seconds: f64,
        }

        let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo.safetensors");
        let model = Model::open(&demo).unwrap();
        let normal = Moments::of_f64(&[1.0, -2.0, 0.0, 3.5], f64::MIN_POSITIVE);
        let broken = Moments::of_f64(&[1.0, f64::NAN, f64::INFINITY], f64::MIN_POSITIVE);
        let rows = [
            ("a.weight", Some(&normal)),
            ("b.weight", Some(&broken)),
            ("c.weight", None),
            ("d.weight", Some(&normal)),
        ];
        let findings = [
            Finding::error(crate::finding::Code::ValuesNan, "1 of 3 values are NaN")
                .for_tensor("b.weight"),
            Finding::info(crate::finding::Code::TensorOrder, "not in order"),
        ];
        let render = |json: bool, in_memory: usize| {
            let names = rows.iter().map(|&(name, _)| name);
            let mut writer = StatsWriter::spooling(json, names, in_memory);
            for &(name, moments) in &rows {
                let row = StatsRow {
                    name,
                    dtype: "F32",
                    moments,
                    histogram: None,
                    codes: None,
                };
                writer.row(&row).unwrap();
            }
            for finding in &findings {
                writer.finding(finding).unwrap();
            }
            assert!(writer.any_broken() && writer.any_errors());
            let mut out = Vec::new();
            writer.finish(&mut out, &model, 1234, 0.5).unwrap();
            String::from_utf8(out).unwrap()
        };
        for json in [false, true] {
            assert_eq!(render(json, 8 << 20), render(json, 16), "json: {json}");
        }
        let text = render(false, 16);
        let order: Vec<&str> = text.lines().skip(1).take(4).map(|l| &l[..8]).collect();
        assert_eq!(order, ["b.weight", "a.weight", "c.weight", "d.weight"]);
        assert!(text.ends_with("4 tensors, 1 with NaN or Inf; 1.21 KiB scanned in 0.50 s; 1 error, 0 warnings, 1 info\n"));
        let ordered: Vec<StatsRow> = [1, 0, 2, 3]
            .into_iter()
            .map(|i| StatsRow {
                name: rows[i].0,
                dtype: "F32",
                moments: rows[i].1,
                histogram: None,
                codes: None,
            })
            .collect();
        let expected = Expected {
            path: model.path.to_string_lossy().into_owned(),
            valid: model.is_valid(),
            tensors: ordered.iter().map(StatsRowJson::of).collect(),
            findings: &findings,
            summary: Tally::of(&findings),
            bytes_scanned: 1234,
            seconds: 0.5,
        };
        let mut printed = Vec::new();
        write_json(&mut printed, &expected).unwrap();
        assert_eq!(render(true, 16), String::from_utf8(printed).unwrap());
    }
}
