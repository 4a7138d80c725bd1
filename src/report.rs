//! Headless output: text for people and JSON for scripts, for each subcommand. The JSON field
//! names are a stable interface (documented in the README).

use crate::finding::{Finding, Severity, Tally};
use crate::format::model::{Model, Source};
use crate::text::{Bytes, Count, Shape, escape, escape_path, format_bytes, format_count};
use crate::tree::{DtypeMix, DtypeSet, LayerTree, NodeId, ROOT};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use unicode_width::UnicodeWidthStr;

/// Writes a value as one JSON document followed by a newline.
pub fn write_json<W: Write, T: Serialize>(out: &mut W, value: &T) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
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
            dtype: share.dtype.map_or("unknown", |d| d.name()).to_owned(),
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
    shape: &'a [u64],
    data_offsets: [u64; 2],
    file: &'a str,
    parameters: Option<u64>,
    bytes: u64,
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
    metadata: &'a BTreeMap<String, String>,
    tensors: Vec<TensorJson<'a>>,
}

/// How `inspect` shows the tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    Tree,
    Flat,
}

/// `stui inspect`: the model in one view. `tree` holds the tensors shown (filtered or all).
#[derive(Debug)]
pub struct Inspect<'a> {
    pub model: &'a Model,
    pub tree: &'a LayerTree,
    pub filter: Option<&'a str>,
}

impl Inspect<'_> {
    pub fn write_json<W: Write>(&self, out: &mut W) -> io::Result<()> {
        let model = self.model;
        let totals = &self.tree.root().totals;
        let tensors = self
            .tree
            .tensors_below(ROOT)
            .map(|index| {
                let tensor = &model.tensors[index];
                TensorJson {
                    name: tensor.name(),
                    dtype: tensor.info.dtype.name(),
                    shape: &tensor.info.shape,
                    data_offsets: tensor.info.data_offsets,
                    file: &model.shard_of(tensor).label,
                    parameters: tensor.info.element_count(),
                    bytes: tensor.info.byte_len(),
                }
            })
            .collect();
        write_json(
            out,
            &InspectJson {
                path: model.path.to_string_lossy().into_owned(),
                source: source_name(model.source),
                files: files_json(model),
                valid: model.is_valid(),
                filter: self.filter,
                tensor_count: totals.tensors,
                parameters: totals.parameters,
                total_bytes: totals.bytes,
                file_bytes: model.file_bytes(),
                dtypes: dtypes_json(&self.tree.dtype_mix(ROOT, &model.tensors)),
                metadata: &model.metadata,
                tensors,
            },
        )
    }

    pub fn write_text<W: Write>(&self, out: &mut W, listing: Listing) -> io::Result<()> {
        self.write_summary(out)?;
        writeln!(out)?;
        write_rows(out, self.model, self.tree, listing)
    }

    fn write_summary<W: Write>(&self, out: &mut W) -> io::Result<()> {
        let model = self.model;
        let totals = &self.tree.root().totals;
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
                "model       {}  {} in {} files, headers {}  {verdict}",
                escape_path(&model.path),
                format_bytes(model.file_bytes()),
                shards.len(),
                format_bytes(header)
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
            .dtype_mix(ROOT, &model.tensors)
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
                    share.dtype.map_or("unknown", |d| d.name()),
                    share.tensors
                )
            })
            .collect();
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
    label: String,
    dtype: String,
    shape: String,
    parameters: String,
    bytes: String,
}

impl Row {
    fn clear(&mut self) {
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

    /// Fills the columns after the label for node `id`: a tensor's own figures, or a group's totals.
    fn fill(&mut self, model: &Model, tree: &LayerTree, id: NodeId) {
        let node = tree.node(id);
        match node.tensor {
            Some(index) if tree.children(id).is_empty() => {
                let info = &model.tensors[index].info;
                self.dtype.push_str(&escape(info.dtype.name()));
                let _ = write!(self.shape, "{}", Shape(&info.shape));
                match info.element_count() {
                    Some(count) => write!(self.parameters, "{}", Count(count)),
                    None => write!(self.parameters, "overflow"),
                }
                .ok();
                let _ = write!(self.bytes, "{}", Bytes(info.byte_len()));
            }
            _ => {
                let totals = &node.totals;
                self.dtype.push_str(&set_label(totals.dtypes));
                let _ = write!(self.shape, "{} tensors", totals.tensors);
                let _ = write!(self.parameters, "{}", Count(totals.parameters));
                let _ = write!(self.bytes, "{}", Bytes(totals.bytes));
            }
        }
    }
}

/// Produces the listing's rows one at a time, handing each to `emit`.
fn for_each_row(model: &Model, tree: &LayerTree, listing: Listing, mut emit: impl FnMut(&Row)) {
    let mut row = Row::default();
    if listing == Listing::Flat {
        for index in tree.tensors_below(ROOT) {
            let Some(id) = tree.node_of_tensor(index) else {
                continue;
            };
            row.clear();
            row.label.push_str(&escape(model.tensors[index].name()));
            row.fill(model, tree, id);
            emit(&row);
        }
        return;
    }
    // (node, depth of its guide lines, is it the last child); `guides` holds, per depth, whether
    // a line continues below.
    let mut stack: Vec<(NodeId, usize, bool)> = Vec::new();
    let mut guides: Vec<bool> = Vec::new();
    let top = tree.children(ROOT);
    stack.extend(
        top.iter()
            .enumerate()
            .rev()
            .map(|(i, &child)| (child, 0, i + 1 == top.len())),
    );
    while let Some((id, depth, last)) = stack.pop() {
        let (shown, label) = collapse_chain(tree, id);
        row.clear();
        guides.truncate(depth);
        if depth > 0 {
            for &open in &guides[1..] {
                row.label.push_str(if open { "│  " } else { "   " });
            }
            row.label.push_str(if last { "└─ " } else { "├─ " });
        }
        row.label.push_str(&escape(&label));
        row.fill(model, tree, shown);
        emit(&row);
        guides.push(!last);
        let children = tree.children(shown);
        stack.extend(
            children
                .iter()
                .enumerate()
                .rev()
                .map(|(i, &child)| (child, depth + 1, i + 1 == children.len())),
        );
    }
}

/// Follows a chain of single-child groups (`mlp` → `down_proj` → `weight`), returning the last node
/// and the joined label.
fn collapse_chain(tree: &LayerTree, mut id: NodeId) -> (NodeId, String) {
    let mut label = tree.segment(id).to_owned();
    while let ([only], None) = (tree.children(id), tree.node(id).tensor) {
        id = *only;
        label.push('.');
        label.push_str(tree.segment(id));
    }
    (id, label)
}

/// `BF16`, `BF16+F32`, or `3 dtypes`.
pub fn set_label(set: DtypeSet) -> String {
    let mut names = set.iter().map(|d| d.map_or("?", |d| d.name()));
    match (set.len(), names.next(), names.next()) {
        (0, ..) => "-".into(),
        (1, Some(a), _) => a.into(),
        (2, Some(a), Some(b)) => format!("{b}+{a}"),
        (n, ..) => format!("{n} dtypes"),
    }
}

/// `BF16`, `BF16+F32`, or `3 dtypes`, largest share first.
pub fn mix_label(mix: &DtypeMix) -> String {
    let name = |share: &crate::tree::DtypeShare| share.dtype.map_or("?", |d| d.name());
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
    model: &Model,
    tree: &LayerTree,
    listing: Listing,
) -> io::Result<()> {
    const MAX_LABEL: usize = 72;
    let mut widths = [4, 5, 5, 6, 5];
    for_each_row(model, tree, listing, |row| {
        for (width, text) in widths.iter_mut().zip(row.columns()) {
            *width = (*width).max(text.width());
        }
    });
    widths[0] = widths[0].min(MAX_LABEL);
    let header = Row {
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
            let fill = width.saturating_sub(text.width());
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
    for_each_row(model, tree, listing, write_row);
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

impl Check<'_> {
    pub fn write_json<W: Write>(&self, out: &mut W) -> io::Result<()> {
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

    pub fn write_text<W: Write>(&self, out: &mut W) -> io::Result<()> {
        let model = self.model;
        let verdict = match model.first_rejection() {
            None if model.is_valid() => "valid: the reference implementation accepts it".to_owned(),
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
            "{} finding{}: {} error{}, {} warning{}, {} info",
            self.findings.len(),
            plural(self.findings.len()),
            tally.errors,
            plural(tally.errors),
            tally.warnings,
            plural(tally.warnings),
            tally.info
        )
    }
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// One finding on one line: severity, code, where, and what.
pub fn write_finding<W: Write>(out: &mut W, finding: &Finding) -> io::Result<()> {
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
