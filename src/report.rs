//! Headless output: text for people and JSON for scripts, for each subcommand. The JSON field
//! names are a stable interface (documented in the README).

use crate::finding::{Finding, Severity, Tally};
use crate::format::layout::format_shape;
use crate::format::model::{Model, Source};
use crate::text::{escape, escape_path, format_bytes, format_count};
use crate::tree::{DtypeMix, LayerTree, NodeId, ROOT};
use serde::Serialize;
use std::collections::BTreeMap;
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
            .walk(ROOT)
            .filter_map(|(id, _)| self.tree.node(id).tensor)
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
                dtypes: dtypes_json(&totals.dtypes),
                metadata: &model.metadata,
                tensors,
            },
        )
    }

    pub fn write_text<W: Write>(&self, out: &mut W, listing: Listing) -> io::Result<()> {
        self.write_summary(out)?;
        writeln!(out)?;
        let rows = match listing {
            Listing::Tree => tree_rows(self.model, self.tree),
            Listing::Flat => flat_rows(self.model, self.tree),
        };
        write_rows(out, &rows)
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
        let dtypes: Vec<String> = totals
            .dtypes
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

/// One line of the tensor listing.
struct Row {
    label: String,
    dtype: String,
    shape: String,
    parameters: String,
    bytes: String,
}

fn tree_rows(model: &Model, tree: &LayerTree) -> Vec<Row> {
    let mut rows = Vec::with_capacity(tree.len());
    // (node, prefix for its children, is it the last child)
    let mut stack: Vec<(NodeId, String, bool, bool)> = Vec::new();
    let top = &tree.root().children;
    for (i, &child) in top.iter().enumerate().rev() {
        stack.push((child, String::new(), i + 1 == top.len(), true));
    }
    while let Some((id, prefix, last, top_level)) = stack.pop() {
        let (shown, label) = collapse_chain(tree, id);
        let branch = match (top_level, last) {
            (true, _) => "",
            (false, true) => "└─ ",
            (false, false) => "├─ ",
        };
        rows.push(node_row(
            model,
            tree,
            shown,
            format!("{prefix}{branch}{}", escape(&label)),
        ));
        let child_prefix = match (top_level, last) {
            (true, _) => String::new(),
            (false, true) => format!("{prefix}   "),
            (false, false) => format!("{prefix}│  "),
        };
        let children = &tree.node(shown).children;
        for (i, &child) in children.iter().enumerate().rev() {
            stack.push((child, child_prefix.clone(), i + 1 == children.len(), false));
        }
    }
    rows
}

/// Follows a chain of single-child groups (`mlp` → `down_proj` → `weight`), returning the last node
/// and the joined label.
fn collapse_chain(tree: &LayerTree, mut id: NodeId) -> (NodeId, String) {
    let mut label = tree.node(id).segment.to_string();
    loop {
        let node = tree.node(id);
        match node.children[..] {
            [only] if node.tensor.is_none() => {
                id = only;
                label.push('.');
                label.push_str(&tree.node(only).segment);
            }
            _ => return (id, label),
        }
    }
}

fn flat_rows(model: &Model, tree: &LayerTree) -> Vec<Row> {
    tree.walk(ROOT)
        .filter(|&(id, _)| tree.node(id).tensor.is_some())
        .map(|(id, _)| {
            let name = tree.node(id).tensor.map_or("", |t| model.tensors[t].name());
            node_row(model, tree, id, escape(name).into_owned())
        })
        .collect()
}

fn node_row(model: &Model, tree: &LayerTree, id: NodeId, label: String) -> Row {
    let node = tree.node(id);
    let totals = &node.totals;
    match node.tensor {
        Some(index) if node.children.is_empty() => {
            let tensor = &model.tensors[index];
            Row {
                label,
                dtype: escape(tensor.info.dtype.name()).into_owned(),
                shape: format_shape(&tensor.info.shape),
                parameters: tensor
                    .info
                    .element_count()
                    .map_or_else(|| "overflow".into(), format_count),
                bytes: format_bytes(tensor.info.byte_len()),
            }
        }
        _ => Row {
            label,
            dtype: mix_label(&totals.dtypes),
            shape: format!("{} tensors", totals.tensors),
            parameters: format_count(totals.parameters),
            bytes: format_bytes(totals.bytes),
        },
    }
}

/// `BF16`, `BF16+F32`, or `3 dtypes`.
pub fn mix_label(mix: &DtypeMix) -> String {
    let name = |share: &crate::tree::DtypeShare| share.dtype.map_or("?", |d| d.name());
    match &mix.0[..] {
        [] => "-".into(),
        [one] => name(one).into(),
        [a, b] => format!("{}+{}", name(a), name(b)),
        more => format!("{} dtypes", more.len()),
    }
}

fn write_rows<W: Write>(out: &mut W, rows: &[Row]) -> io::Result<()> {
    const MAX_LABEL: usize = 72;
    let width = |f: fn(&Row) -> &str| rows.iter().map(|r| f(r).width()).max().unwrap_or(0);
    let label_width = width(|r| &r.label).clamp(4, MAX_LABEL);
    let dtype_width = width(|r| &r.dtype).max(5);
    let shape_width = width(|r| &r.shape).max(5);
    let params_width = width(|r| &r.parameters).max(6);
    let mut line = String::with_capacity(160);
    let pad = |line: &mut String, text: &str, to: usize, right: bool| {
        let fill = to.saturating_sub(text.width());
        if right {
            line.extend(std::iter::repeat_n(' ', fill));
            line.push_str(text);
        } else {
            line.push_str(text);
            line.extend(std::iter::repeat_n(' ', fill));
        }
    };
    let header = Row {
        label: "NAME".into(),
        dtype: "DTYPE".into(),
        shape: "SHAPE".into(),
        parameters: "PARAMS".into(),
        bytes: "BYTES".into(),
    };
    for row in std::iter::once(&header).chain(rows) {
        line.clear();
        pad(&mut line, &row.label, label_width, false);
        line.push_str("  ");
        pad(&mut line, &row.dtype, dtype_width, false);
        line.push_str("  ");
        pad(&mut line, &row.shape, shape_width, false);
        line.push_str("  ");
        pad(&mut line, &row.parameters, params_width, true);
        line.push_str("  ");
        pad(&mut line, &row.bytes, 10, true);
        line.truncate(line.trim_end().len());
        line.push('\n');
        out.write_all(line.as_bytes())?;
    }
    Ok(())
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
