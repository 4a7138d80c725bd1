//! Stored tensors grouped into logical weights: each quantized Linear becomes one weight named
//! as the tensor it encodes, with its logical shape and scheme worked out from its members'
//! shapes (the config only cross-checks them), and a finding for each member that is missing
//! or does not fit.

use super::members::{Role, classify};
use super::recognise::{Declared, Strategy as DeclaredStrategy};
use super::scheme::{Grouping, Layout, Scheme};
use super::{LogicalWeight, Member};
use crate::finding::{Code, Finding};
use crate::format::remote::RemoteModel;
use crate::format::{Dtype, Model, Shape, TensorDtype, TensorInfo, read_exact_at};
use crate::text::escape;
use compact_str::CompactString;
use hashbrown::{HashTable, hash_table};
use std::collections::HashMap;
use std::fs::File;
use std::hash::BuildHasher;

/// Small member tensors (shapes, quant states, group indexes) are read whole up to this size.
const READ_LIMIT: u64 = 1 << 24;

/// The weights, their members (indexes into the model's tensors), and findings.
pub(super) struct Built {
    pub weights: Vec<LogicalWeight>,
    pub members: Vec<Member>,
    pub findings: Vec<Finding>,
}

pub(super) fn build(model: &Model, declared: Option<&Declared>) -> Built {
    use rayon::prelude::*;
    let entries = entries_of(model.tensors.par_iter().map(crate::format::Tensor::name));
    let marked = entries.iter().flatten().any(|e| e.3.marks_quantized());
    let declares_quantized = declared.is_some_and(Declared::stores_quantized);
    if !marked && !declares_quantized {
        return Built {
            weights: Vec::new(),
            members: Vec::new(),
            findings: Vec::new(),
        };
    }
    let mut findings = Vec::new();
    let (fetched, complete) = match &model.remote {
        Some(remote) => fetch_read_members(model, remote, &entries, &mut findings),
        None => (HashMap::new(), true),
    };
    let small = || match model.remote {
        Some(_) => Small::Fetched {
            bytes: &fetched,
            complete,
        },
        None => Small::Local(Vec::new()),
    };
    let runs = runs_by_group(&entries);
    // The groups are worked out in two halves side by side, cut between two groups.
    let middle = runs.len() / 2;
    let cut = middle
        + runs[middle..]
            .iter()
            .take_while(|run| middle > 0 && run.group == runs[middle - 1].group)
            .count();
    let (head, tail) = runs.split_at(cut);
    // The first half has room for every member, so that the second's are moved in after it.
    let members = |runs: &[Run]| -> usize { runs.iter().map(|run| run.len()).sum() };
    let (mut built, tail) = rayon::join(
        || build_groups((model, small()), declared, &entries, head, members(&runs)),
        || build_groups((model, small()), declared, &entries, tail, members(tail)),
    );
    built.findings.splice(0..0, findings);
    let offset = u32::try_from(built.members.len()).unwrap_or(u32::MAX);
    // Moved on both cores: the copy is mostly first touches of fresh pages.
    built
        .weights
        .par_extend(tail.weights.into_par_iter().map(|mut weight| {
            weight.first_member = weight.first_member.saturating_add(offset);
            weight
        }));
    built.members.par_extend(tail.members);
    built.findings.extend(tail.findings);
    built.weights.shrink_to_fit();
    built.members.shrink_to_fit();
    built
}

/// The most requests to the Hub for the members [`Builder::read`] reads, when a model is opened:
/// sixteen rounds of [`crate::format::remote::PARALLEL_REQUESTS`].
const MAX_MEMBER_REQUESTS: usize = 1024;

/// The bytes of the members a model on the Hub has that [`Builder::read`] reads (see
/// [`Role::read_for_values`]), fetched together before the weights are worked out, by tensor.
/// Group orders (`g_idx`), which only name the weights' act order and check it (the values read
/// them with the weight), are left out where they would take more than [`MAX_MEMBER_REQUESTS`]
/// requests, a model of thousands of experts, and everything where the others would; each is a
/// finding, as is a fetch that fails. Comes back with whether every member was fetched: the
/// weights whose members were not are then worked out without them, and no finding of theirs
/// repeats the one that says why.
fn fetch_read_members(
    model: &Model,
    remote: &RemoteModel,
    entries: &[Option<Entry<'_>>],
    findings: &mut Vec<Finding>,
) -> (HashMap<u32, Vec<u8>>, bool) {
    let read: Vec<(u32, Role)> = entries
        .iter()
        .flatten()
        .filter(|entry| entry.3.read_for_values())
        .map(|entry| (entry.2, entry.3))
        .filter(|&(tensor, _)| {
            let entry = &model.tensors[tensor as usize];
            entry.info.byte_len() <= READ_LIMIT && model.shard_of(entry).readable
        })
        .collect();
    let fetch = |read: &[u32]| {
        let ranges: Vec<(usize, u64, u64)> = read
            .iter()
            .map(|&tensor| {
                let entry = &model.tensors[tensor as usize];
                let (start, len) = model.file_range(entry);
                (entry.shard, start, len)
            })
            .collect();
        remote
            .read_small(&ranges, MAX_MEMBER_REQUESTS)
            .map(|bytes| {
                bytes.map(|bytes| read.iter().copied().zip(bytes).collect::<HashMap<_, _>>())
            })
    };
    let all: Vec<u32> = read.iter().map(|&(tensor, _)| tensor).collect();
    let shapes: Vec<u32> = read
        .iter()
        .filter(|(_, role)| !matches!(role, Role::GIdx | Role::WeightGIdx))
        .map(|&(tensor, _)| tensor)
        .collect();
    let fetched = match fetch(&all) {
        Ok(None) if shapes.len() < all.len() => {
            findings.push(Finding::info(
                Code::QuantGroupIndex,
                format!(
                    "the group orders (`g_idx`) of {} weights were not read from the Hub: they \
                     would take more than {MAX_MEMBER_REQUESTS} requests; act order is neither \
                     shown nor checked (it is in a downloaded copy)",
                    all.len() - shapes.len()
                ),
            ));
            fetch(&shapes)
        }
        fetched => fetched,
    };
    match fetched {
        Ok(Some(fetched)) => {
            let complete = fetched.len() == all.len();
            (fetched, complete)
        }
        Ok(None) => {
            findings.push(Finding::warning(
                Code::DataUnreadable,
                format!(
                    "the shapes and quant states of {} quantized weights were not read from the \
                     Hub: they would take more than {MAX_MEMBER_REQUESTS} requests; those \
                     weights are listed by their element count (open a downloaded copy)",
                    shapes.len()
                ),
            ));
            (HashMap::new(), false)
        }
        Err(error) => {
            findings.push(Finding::error(
                Code::DataUnreadable,
                format!(
                    "the members that describe the quantized weights (their shapes, quant states \
                     and group orders) could not be read from the Hub: {error}"
                ),
            ));
            (HashMap::new(), false)
        }
    }
}

/// A member's entry: its weight's prefix, whether that weight's name is dotted, the tensor and
/// its role.
type Entry<'a> = (&'a str, bool, u32, Role);

/// Each name's entry, `None` for a name that is no member: worked out on every core, each in
/// its place.
fn entries_of<'a>(
    names: impl rayon::iter::IndexedParallelIterator<Item = &'a str>,
) -> Vec<Option<Entry<'a>>> {
    use rayon::prelude::*;
    let mut entries = Vec::new();
    names
        .enumerate()
        .map(|(index, name)| {
            let m = classify(name)?;
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            Some((m.prefix, m.dotted_weight, index, m.role))
        })
        .collect_into_vec(&mut entries);
    entries
}

fn same_group(a: &Entry<'_>, b: &Entry<'_>) -> bool {
    a.0 == b.0 && a.1 == b.1
}

/// Entries next to each other of one group: `start..end` in the entries (all members), and the
/// group's number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Run {
    start: u32,
    end: u32,
    group: u32,
}

impl Run {
    /// How many members it holds.
    fn len(self) -> usize {
        (self.end - self.start) as usize
    }
}

/// The runs of `entries`, gathered by group: the groups numbered in the order they first come,
/// a group's runs in the model's order. A group's members mostly follow each other in the
/// model's order, so runs are gathered rather than entries, and nothing is copied but the runs;
/// each run's group is found by the hash of its prefix: no name is compared with another but an
/// equal one, whatever the order of the names.
fn runs_by_group(entries: &[Option<Entry<'_>>]) -> Vec<Run> {
    let index = |at: usize| u32::try_from(at).unwrap_or(u32::MAX);
    let mut runs: Vec<Run> = Vec::with_capacity(entries.len());
    // The run under way: where it starts, and its first entry.
    let mut current: Option<(usize, &Entry<'_>)> = None;
    for (at, entry) in entries.iter().map(Option::as_ref).chain([None]).enumerate() {
        if let Some((start, first)) = current
            && !entry.is_some_and(|entry| same_group(entry, first))
        {
            runs.push(Run {
                start: index(start),
                end: index(at),
                group: 0,
            });
            current = None;
        }
        if current.is_none() {
            current = entry.map(|entry| (at, entry));
        }
    }
    // A run's first entry, which is a member.
    let first = |start: usize| entries[start].as_ref();
    // Seeded anew in each process, so that no header can be written to make its names collide.
    let state = foldhash::fast::RandomState::default();
    let hash = |entry: Option<&Entry<'_>>| state.hash_one(entry.map(|e| (e.0, e.1)));
    let run_hashes: Vec<u64> = {
        use rayon::prelude::*;
        runs.par_iter()
            .map(|run| hash(first(run.start as usize)))
            .collect()
    };
    let same = |a: Option<&Entry<'_>>, b: Option<&Entry<'_>>| {
        a.zip(b).is_some_and(|(a, b)| same_group(a, b))
    };
    // The runs whose group came in an earlier run, with that run: found in two halves of the
    // hashes side by side, each half's groups in a table of its own.
    let earlier_runs = |half: u64| {
        let mut groups: HashTable<usize> = HashTable::with_capacity(runs.len() / 2);
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        for (at, (run, &run_hash)) in runs.iter().zip(&run_hashes).enumerate() {
            if run_hash >> 63 != half {
                continue;
            }
            let entry = first(run.start as usize);
            match groups.entry(
                run_hash,
                |&earlier| same(first(runs[earlier].start as usize), entry),
                |&earlier| hash(first(runs[earlier].start as usize)),
            ) {
                hash_table::Entry::Occupied(found) => repeats.push((at, *found.get())),
                hash_table::Entry::Vacant(slot) => {
                    slot.insert(at);
                }
            }
        }
        repeats
    };
    let (mut repeats, more) = rayon::join(|| earlier_runs(0), || earlier_runs(1));
    if repeats.is_empty() && more.is_empty() {
        // One run a group: the groups already come run by run.
        for (number, run) in (0u32..).zip(&mut runs) {
            run.group = number;
        }
        return runs;
    }
    repeats.extend(more);
    repeats.sort_unstable();
    // Each group numbered in the order it first comes; a repeated run takes its first run's.
    let mut groups = 0u32;
    let mut repeated = repeats.iter().peekable();
    for at in 0..runs.len() {
        runs[at].group = if let Some(&(_, earlier)) = repeated.next_if(|&&(run, _)| run == at) {
            runs[earlier].group
        } else {
            groups += 1;
            groups - 1
        };
    }
    // Placed by group, each group's runs in the order they come.
    let mut next_slot = vec![0u32; groups as usize + 1];
    for run in &runs {
        next_slot[run.group as usize + 1] += 1;
    }
    for group in 1..next_slot.len() {
        next_slot[group] += next_slot[group - 1];
    }
    let mut placed = vec![Run::default(); runs.len()];
    for run in &runs {
        let slot = &mut next_slot[run.group as usize];
        placed[*slot as usize] = *run;
        *slot += 1;
    }
    placed
}

/// Calls `each` with every group of `runs` (see [`runs_by_group`]): its prefix, whether its
/// weight's name is dotted, and its members by role and tensor.
fn for_each_group(
    entries: &[Option<Entry<'_>>],
    runs: &[Run],
    mut each: impl FnMut(&str, bool, &[Member]),
) {
    let by_role = |member: &Member| (member.role, member.tensor);
    let mut members: Vec<Member> = Vec::new();
    let mut at = 0;
    while at < runs.len() {
        let group = runs[at].group;
        let end = at
            + runs[at..]
                .iter()
                .take_while(|run| run.group == group)
                .count();
        members.clear();
        for run in &runs[at..end] {
            members.extend(
                entries[run.start as usize..run.end as usize]
                    .iter()
                    .flatten()
                    .map(|&(_, _, tensor, role)| Member { tensor, role }),
            );
        }
        if !members.is_sorted_by_key(by_role) {
            members.sort_unstable_by_key(by_role);
        }
        if let Some((prefix, dotted, ..)) = entries[runs[at].start as usize] {
            each(prefix, dotted, &members);
        }
        at = end;
    }
}

/// The logical weights of the groups of `runs`, with room for those of `room` members.
fn build_groups(
    (model, small): (&Model, Small<'_>),
    declared: Option<&Declared>,
    entries: &[Option<Entry<'_>>],
    runs: &[Run],
    room: usize,
) -> Built {
    let mut builder = Builder {
        model,
        declared,
        small,
        labels: Vec::new(),
        built: Built {
            weights: Vec::new(),
            members: Vec::new(),
            findings: Vec::new(),
        },
    };
    // A weight has at least one member, and most quantized ones two or more.
    builder.built.members.reserve(room);
    builder.built.weights.reserve(room / 2);
    for_each_group(entries, runs, |prefix, dotted, members| {
        builder.group(prefix, dotted, members);
    });
    builder.built
}

struct Builder<'a> {
    model: &'a Model,
    declared: Option<&'a Declared>,
    small: Small<'a>,
    labels: Vec<(Scheme, TensorDtype)>,
    built: Built,
}

/// Where the small members [`Builder::read`] reads come from.
enum Small<'a> {
    /// The model's files, each opened when first read from.
    Local(Vec<Option<File>>),
    /// Fetched from the Hub before the weights are worked out, by tensor; a member not there
    /// was not fetched (see [`fetch_read_members`]) when `complete` is false.
    Fetched {
        bytes: &'a HashMap<u32, Vec<u8>>,
        complete: bool,
    },
}

/// One group of members under way: what its weight is called and its members' entries.
struct Group<'g> {
    module: &'g str,
    name: CompactString,
    members: &'g [Member],
    tensors: &'g [crate::format::Tensor],
}

impl<'g> Group<'g> {
    fn get(&self, role: Role) -> Option<&'g TensorInfo> {
        self.index(role).map(|t| &self.tensors[t].info)
    }

    fn index(&self, role: Role) -> Option<usize> {
        self.members
            .iter()
            .find(|m| m.role == role)
            .map(|m| m.tensor as usize)
    }

    fn has(&self, role: Role) -> bool {
        self.index(role).is_some()
    }

    fn named(&self, suffix: &str) -> Option<&'g TensorInfo> {
        self.members
            .iter()
            .map(|m| &self.tensors[m.tensor as usize].info)
            .find(|t| t.name.ends_with(suffix))
    }
}

fn dims(info: &TensorInfo) -> Vec<u64> {
    info.shape.to_vec()
}

fn dtype(info: &TensorInfo) -> Option<Dtype> {
    info.dtype.known()
}

/// The longest dimension a shape read from a member's values may have: far beyond any weight's,
/// and small enough that a dimension times a code's bits, or a row's 32-bit words, never
/// overflows.
const MAX_DIMENSION: u64 = 1 << 40;

/// A shape from integers read from a member, a negative one taken as 0.
fn from_ints(values: &[i64]) -> Vec<u64> {
    values
        .iter()
        .map(|&v| u64::try_from(v).unwrap_or(0))
        .collect()
}

fn numel(dims: &[u64]) -> u64 {
    dims.iter().product()
}

fn show(dims: &[u64]) -> String {
    format!("{dims:?}")
}

/// `dims` without its last axis, and the last axis.
fn split_last(dims: &[u64]) -> (&[u64], u64) {
    match dims.split_last() {
        Some((&last, rest)) => (rest, last),
        None => (&[], 1),
    }
}

fn ceil_div(a: u64, b: u64) -> u64 {
    if b == 0 { 0 } else { a.div_ceil(b) }
}

impl Builder<'_> {
    fn finding(
        &mut self,
        severity: crate::finding::Severity,
        code: Code,
        tensor: &str,
        message: String,
    ) {
        self.built
            .findings
            .push(Finding::new(severity, code, message).for_tensor(escape(tensor).into_owned()));
    }

    /// The dtype a weight of `scheme` is listed with (see [`TensorDtype::quantized`]), one
    /// shared by the weights of each scheme: a model has a handful. Never its members' dtypes,
    /// which the layer checks would compare: whichever member came first in the files, which
    /// changes where a shard ends between a weight's members, made a false mismatch.
    fn label(&mut self, scheme: Scheme) -> TensorDtype {
        if let Some((_, label)) = self.labels.iter().find(|(s, _)| *s == scheme) {
            return label.clone();
        }
        let label = TensorDtype::quantized(&scheme.label());
        self.labels.push((scheme, label.clone()));
        label
    }

    fn error(&mut self, code: Code, tensor: &str, message: String) {
        self.finding(crate::finding::Severity::Error, code, tensor, message);
    }

    fn warning(&mut self, code: Code, tensor: &str, message: String) {
        self.finding(crate::finding::Severity::Warning, code, tensor, message);
    }

    /// The bytes of a small member tensor, `None` when it cannot be read or is too large.
    fn read(&mut self, tensor: usize) -> Option<Vec<u8>> {
        let entry = &self.model.tensors[tensor];
        let shard = self.model.shards.get(entry.shard)?;
        let len = entry.info.byte_len();
        if len > READ_LIMIT || !shard.readable {
            return None;
        }
        let files = match &mut self.small {
            Small::Fetched { bytes, .. } => {
                return bytes.get(&u32::try_from(tensor).ok()?).cloned();
            }
            Small::Local(files) => files,
        };
        if files.len() < self.model.shards.len() {
            files.resize_with(self.model.shards.len(), || None);
        }
        if files[entry.shard].is_none() {
            files[entry.shard] = File::open(&shard.path).ok();
        }
        let file = files[entry.shard].as_ref()?;
        let mut bytes = vec![0u8; usize::try_from(len).ok()?];
        read_exact_at(
            file,
            &mut bytes,
            shard.data_start + entry.info.data_offsets[0],
        )
        .ok()?;
        Some(bytes)
    }

    /// Whether member `tensor` of a model on the Hub was left unread, the requests it would
    /// take being too many: a finding says so once, and no weight reports it again.
    fn unfetched(&self, tensor: usize) -> bool {
        match &self.small {
            Small::Fetched { bytes, complete } => {
                !complete && u32::try_from(tensor).is_ok_and(|t| !bytes.contains_key(&t))
            }
            Small::Local(_) => false,
        }
    }

    /// The integers of a small I64 or I32 member.
    fn read_ints(&mut self, tensor: usize) -> Option<Vec<i64>> {
        let width = match dtype(&self.model.tensors[tensor].info)? {
            Dtype::I64 | Dtype::U64 => 8,
            Dtype::I32 | Dtype::U32 => 4,
            Dtype::I16 => 2,
            _ => return None,
        };
        let bytes = self.read(tensor)?;
        Some(
            bytes
                .chunks_exact(width)
                .map(|c| match width {
                    8 => i64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
                    4 => i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4]))),
                    _ => i64::from(i16::from_le_bytes(c.try_into().unwrap_or([0; 2]))),
                })
                .collect(),
        )
    }

    fn group(&mut self, prefix: &str, dotted: bool, members: &[Member]) {
        let mut name = CompactString::with_capacity(prefix.len() + ".weight".len());
        name.push_str(prefix);
        if dotted {
            name.push_str(".weight");
        }
        let group = Group {
            module: prefix,
            name,
            members,
            tensors: &self.model.tensors,
        };
        let Some(codes) = members.iter().find(|m| m.role.is_codes()) else {
            if let Some(orphan) = members.iter().find(|m| m.role.needs_codes()) {
                let orphan = self.model.tensors[orphan.tensor as usize]
                    .name()
                    .to_string();
                self.error(
                    Code::QuantMemberMissing,
                    &group.name,
                    format!(
                        "`{}` is stored but the weight it scales is not",
                        escape(&orphan)
                    ),
                );
            }
            return;
        };
        let recognised = match codes.role {
            Role::WeightPacked => self.compressed_packed(&group),
            Role::QWeight => self.gptq_or_awq(&group),
            Role::Blocks => self.gpt_oss(&group),
            Role::QuantoData => self.quanto(&group),
            Role::HqqCodes => self.hqq(&group),
            Role::Exl2Codes => Some(Self::exl2(&group)),
            Role::Exl3Codes => {
                let trellis = group.get(Role::Exl3Codes).map(dims).unwrap_or_default();
                Some((trellis, Scheme::new(Layout::Exl3, 0, Grouping::Unknown)))
            }
            _ => self.weight_with_members(&group),
        };
        let Some((shape, mut scheme)) = recognised else {
            return;
        };
        let stored: u64 = members
            .iter()
            .map(|m| self.model.tensors[m.tensor as usize].info.byte_len())
            .sum();
        if scheme.bits == 0 {
            let elements = numel(&shape).max(1);
            scheme.bits = u8::try_from((stored * 8 / elements).clamp(1, 16)).unwrap_or(8);
        }
        self.cross_check(&group, &scheme);
        let first = u32::try_from(self.built.members.len()).unwrap_or(u32::MAX);
        self.built.members.extend_from_slice(members);
        let dtype = self.label(scheme);
        self.built.weights.push(LogicalWeight {
            info: TensorInfo {
                name: group.name,
                dtype,
                shape: Shape::from_slice(&shape),
                data_offsets: [0, stored],
            },
            scheme,
            first_member: first,
            member_count: u16::try_from(members.len()).unwrap_or(u16::MAX),
            flat: scheme.layout == Layout::Quanto && shape.len() == 1,
        });
    }

    /// One scale per group of each row, `groups` to a row of a weight `[lead.., out, _]`: in
    /// the layout of `ComfyUI`, cuBLAS' blocked one, rows padded to 128 and groups to 4; else
    /// `[lead.., out, groups]`.
    fn expect_group_scales(
        &mut self,
        group: &Group<'_>,
        scale: &TensorInfo,
        comfy: bool,
        lead: &[u64],
        groups: u64,
    ) {
        if comfy {
            let out = lead.last().copied().unwrap_or(1);
            let swizzled = [out.div_ceil(128) * 128, groups.div_ceil(4) * 4];
            self.expect_shape(group, Some(scale), &swizzled);
        } else {
            let mut scale_dims = lead.to_vec();
            scale_dims.push(groups);
            self.expect_shape(group, Some(scale), &scale_dims);
        }
    }

    /// The config's bits and group size against the weight's own.
    fn cross_check(&mut self, group: &Group<'_>, scheme: &Scheme) {
        let Some(declared) = self.declared else {
            return;
        };
        let (bits, group_size) = declared.bits_and_group(group.module);
        let int_codes = matches!(scheme.layout.codes(), super::scheme::Codes::Int);
        if let Some(bits) = bits
            && int_codes
            && !scheme.layout.is_opaque()
            && bits != scheme.bits
        {
            self.warning(
                Code::QuantConfig,
                &group.name,
                format!(
                    "the config says {bits} bit, the tensors hold {} bit codes",
                    scheme.bits
                ),
            );
        }
        if let (Some(expected), Grouping::Group(found)) = (group_size, scheme.grouping)
            && expected != found
            && !matches!(scheme.layout, Layout::BnbNf4 | Layout::BnbFp4)
        {
            self.warning(
                Code::QuantConfig,
                &group.name,
                format!("the config says group size {expected}, the scales give {found}"),
            );
        }
    }

    /// How scales of shape `scale` are shared over a `[.., out, in]` weight.
    fn grouping(
        &mut self,
        group: &Group<'_>,
        out: u64,
        columns: u64,
        scale: &TensorInfo,
    ) -> Grouping {
        let declared = self.declared;
        let (_, declared_group) = declared.map_or((None, None), |d| d.bits_and_group(group.module));
        let declared_block = declared.and_then(|d| d.block);
        let per_channel = declared.and_then(|d| d.strategy) == Some(DeclaredStrategy::Channel);
        let scale_dims = dims(scale);
        let (rows, cols) = match scale_dims.as_slice() {
            [.., rows, cols] => (*rows, *cols),
            [rows] => (*rows, 1),
            [] => (1, 1),
        };
        if let Some([block_rows, block_cols]) = declared_block
            && scale_dims.len() >= 2
            && ceil_div(out, block_rows.into()) == rows
            && ceil_div(columns, block_cols.into()) == cols
        {
            return Grouping::Block(block_rows, block_cols);
        }
        // A weight of one row within one declared group, or declared per channel, has a single
        // scale too: a group's or a row's, whose zero point compressed-tensors packs, as it does
        // not a tensor's.
        if scale_dims.len() >= 2 && rows == out && cols == 1 {
            match declared_group {
                Some(size) if columns <= u64::from(size) => return Grouping::Group(size),
                None if per_channel => return Grouping::Channel,
                _ => {}
            }
        }
        if numel(&scale_dims) == 1 {
            return Grouping::Tensor;
        }
        if rows == out && cols == 1 {
            // A row no wider than the config's group is one group: the config's word holds.
            return match declared_group {
                Some(size) if columns <= u64::from(size) => Grouping::Group(size),
                _ => Grouping::Channel,
            };
        }
        if rows == out && cols > 1 {
            let size = declared_group
                .map(u64::from)
                .filter(|&g| ceil_div(columns, g) == cols)
                .or_else(|| {
                    let size = ceil_div(columns, cols);
                    (ceil_div(columns, size) == cols).then_some(size)
                });
            if let Some(size) = size.and_then(|s| u32::try_from(s).ok()) {
                return Grouping::Group(size);
            }
        }
        let [block_rows, block_cols] = declared_block.unwrap_or([128, 128]);
        if ceil_div(out, block_rows.into()) == rows && ceil_div(columns, block_cols.into()) == cols
        {
            return Grouping::Block(block_rows, block_cols);
        }
        self.error(
            Code::QuantMemberShape,
            &group.name,
            format!(
                "`{}` is {}, which fits a [{out}, {columns}] weight by neither tensor, row, group \
                 nor block",
                escape(&scale.name),
                show(&scale_dims)
            ),
        );
        Grouping::Unknown
    }

    /// A member that must have `expected` as its shape.
    fn expect_shape(&mut self, group: &Group<'_>, member: Option<&TensorInfo>, expected: &[u64]) {
        if let Some(member) = member
            && dims(member) != expected
        {
            self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "`{}` is {}, the scheme needs {}",
                    escape(&member.name),
                    show(&dims(member)),
                    show(expected)
                ),
            );
        }
    }

    /// `shape`, a logical shape read from the data of member `member` of a weight whose codes
    /// take `code_bytes`, or `None` with an error finding where it counts more values than the
    /// codes hold at one bit each, or has a dimension beyond [`MAX_DIMENSION`] (beside a 0): a
    /// hostile shape would otherwise overflow the products that check it against the other
    /// members.
    fn shape_within(
        &mut self,
        group: &Group<'_>,
        member: &str,
        shape: Vec<u64>,
        code_bytes: u64,
    ) -> Option<Vec<u64>> {
        let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        if elements.is_some_and(|n| n <= code_bytes.saturating_mul(8))
            && shape.iter().all(|&d| d <= MAX_DIMENSION)
        {
            return Some(shape);
        }
        self.error(
            Code::QuantMemberShape,
            &group.name,
            format!(
                "`{}{member}` gives {}, which its {code_bytes} bytes of codes cannot hold",
                escape(group.module),
                show(&shape)
            ),
        );
        None
    }

    fn missing(&mut self, group: &Group<'_>, member: &str, consequence: &str) {
        self.error(
            Code::QuantMemberMissing,
            &group.name,
            format!("`{}{member}` is missing{consequence}", escape(group.module)),
        );
    }

    /// Checks a `g_idx` member: each column's group in `[0, groups)`, no group over `size`
    /// columns. Returns whether the order differs from `column / size` (act-order).
    fn check_group_index(
        &mut self,
        group: &Group<'_>,
        role: Role,
        columns: u64,
        groups: u64,
        size: u64,
    ) -> bool {
        let Some(index) = group.index(role) else {
            return false;
        };
        let info = &self.model.tensors[index].info;
        let label = escape(&info.name).into_owned();
        if dims(info) != [columns] {
            self.error(
                Code::QuantGroupIndex,
                &group.name,
                format!(
                    "`{label}` is {}, one group per input column needs [{columns}]",
                    show(&dims(info))
                ),
            );
            return false;
        }
        let Some(values) = self.read_ints(index) else {
            return false;
        };
        if values.iter().all(|&v| v == -1) {
            return false;
        }
        let mut counts = vec![0u64; usize::try_from(groups).unwrap_or(0)];
        for (column, &value) in values.iter().enumerate() {
            let slot = usize::try_from(value).ok().filter(|&v| v < counts.len());
            let Some(slot) = slot else {
                self.error(
                    Code::QuantGroupIndex,
                    &group.name,
                    format!(
                        "`{label}` gives column {column} group {value}, outside the {groups} \
                         groups of the scales"
                    ),
                );
                return false;
            };
            counts[slot] += 1;
        }
        if let Some((over, &count)) = counts.iter().enumerate().find(|(_, c)| **c > size) {
            self.error(
                Code::QuantGroupIndex,
                &group.name,
                format!(
                    "`{label}` gives group {over} {count} columns, more than the group size {size}"
                ),
            );
        }
        values
            .iter()
            .enumerate()
            .any(|(column, &value)| u64::try_from(value).ok() != Some(column as u64 / size.max(1)))
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one layout's members checked in the order they are read"
    )]
    fn compressed_packed(&mut self, group: &Group<'_>) -> Option<(Vec<u64>, Scheme)> {
        let packed = group.get(Role::WeightPacked)?;
        let packed_dims = dims(packed);
        let (lead, width) = split_last(&packed_dims);
        let lead = lead.to_vec();
        let out = lead.last().copied().unwrap_or(1);
        let bytes_packed = dtype(packed) == Some(Dtype::U8);
        if group.has(Role::WeightGlobalScale) || bytes_packed {
            let nvfp4 = group.has(Role::WeightGlobalScale);
            let (layout, size) = if nvfp4 {
                (Layout::CompressedNvfp4, 16)
            } else {
                (Layout::CompressedMxfp4, 32)
            };
            let columns = width * 2;
            let mut scale_dims = lead.clone();
            scale_dims.push(ceil_div(columns, size));
            match group.get(Role::WeightScale) {
                Some(scale) => self.expect_shape(group, Some(scale), &scale_dims),
                None => self.missing(group, ".weight_scale", ""),
            }
            let mut shape = lead;
            shape.push(columns);
            let size = u32::try_from(size).unwrap_or(16);
            return Some((shape, Scheme::new(layout, 4, Grouping::Group(size))));
        }
        let declared_bits = self.declared.and_then(|d| d.bits_and_group(group.module).0);
        let width_from_bits = |bits: u64| {
            let mut shape = lead.clone();
            shape.push(width * 32 / bits);
            shape
        };
        let shape_member = group
            .index(Role::WeightShape)
            .filter(|&index| !self.unfetched(index));
        let shape = if let Some(index) = shape_member {
            match self.read_ints(index) {
                Some(values) if values.len() == packed_dims.len() => self.shape_within(
                    group,
                    ".weight_shape",
                    from_ints(&values),
                    packed.byte_len(),
                )?,
                Some(values) => {
                    self.error(
                        Code::QuantPackedWidth,
                        &group.name,
                        format!(
                            "`{}.weight_shape` holds {} values for a {}-D packed weight",
                            escape(group.module),
                            values.len(),
                            packed_dims.len()
                        ),
                    );
                    return None;
                }
                None => {
                    self.error(
                        Code::QuantMemberShape,
                        &group.name,
                        format!(
                            "`{}.weight_shape` is not a small integer tensor",
                            escape(group.module)
                        ),
                    );
                    return None;
                }
            }
        } else {
            let bits = u64::from(declared_bits.unwrap_or(4));
            if !group.has(Role::WeightShape) {
                self.missing(
                    group,
                    ".weight_shape",
                    &format!(": the width is taken from {bits} bit codes"),
                );
            }
            width_from_bits(bits)
        };
        let (shape_lead, columns) = split_last(&shape);
        if shape_lead != lead.as_slice() {
            self.error(
                Code::QuantPackedWidth,
                &group.name,
                format!(
                    "`{}.weight_shape` says {}, `weight_packed` is {}",
                    escape(group.module),
                    show(&shape),
                    show(&packed_dims)
                ),
            );
        }
        let fits = |bits: u64| {
            width == ceil_div(columns * bits, 32) || width == ceil_div(columns, 32 / bits)
        };
        let bits = match declared_bits.map(u64::from) {
            Some(bits) if (1..=8).contains(&bits) && fits(bits) => bits,
            declared => {
                let found = (1..=8).find(|&b| fits(b));
                if found.is_none() || declared.is_some() {
                    let at = declared.or(found).unwrap_or(4);
                    self.error(
                        Code::QuantPackedWidth,
                        &group.name,
                        format!(
                            "`{}.weight_shape` says {columns} columns, which {at} bit codes pack \
                             into {} words a row; `weight_packed` has {width}",
                            escape(group.module),
                            ceil_div(columns * at, 32)
                        ),
                    );
                }
                found.or(declared).unwrap_or(4)
            }
        };
        let mut scheme = Scheme::new(
            Layout::CompressedPacked,
            u8::try_from(bits).unwrap_or(4),
            Grouping::Unknown,
        );
        match group.get(Role::WeightScale) {
            Some(scale) => scheme.grouping = self.grouping(group, out, columns, scale),
            None => self.missing(group, ".weight_scale", ""),
        }
        if let Some(zero) = group.get(Role::WeightZeroPoint) {
            scheme.asymmetric = true;
            if let Some(scale) = group.get(Role::WeightScale) {
                let scale_dims = dims(scale);
                let (scale_lead, groups) = split_last(&scale_dims);
                let mut packed_zero = scale_lead[..scale_lead.len().saturating_sub(1)].to_vec();
                packed_zero.push(ceil_div(out * bits, 32));
                packed_zero.push(groups);
                let zero_dims = dims(zero);
                let mut legacy_zero = packed_zero.clone();
                let rows_at = legacy_zero.len() - 2;
                legacy_zero[rows_at] = ceil_div(out, 32 / bits);
                if zero_dims != scale_dims && zero_dims != packed_zero && zero_dims != legacy_zero {
                    self.error(
                        Code::QuantMemberShape,
                        &group.name,
                        format!(
                            "`{}` is {}, the scheme needs {} unpacked or {} packed",
                            escape(&zero.name),
                            show(&zero_dims),
                            show(&scale_dims),
                            show(&packed_zero)
                        ),
                    );
                }
            }
        }
        if let Grouping::Group(size) = scheme.grouping {
            scheme.act_order = self.check_group_index(
                group,
                Role::WeightGIdx,
                columns,
                ceil_div(columns, size.into()),
                size.into(),
            );
        }
        Some((shape, scheme))
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one layout's members checked in the order they are read"
    )]
    fn gptq_or_awq(&mut self, group: &Group<'_>) -> Option<(Vec<u64>, Scheme)> {
        let qweight = dims(group.get(Role::QWeight)?);
        let Some(scales) = group.get(Role::Scales).map(dims) else {
            self.missing(group, ".scales", ": the weight cannot be read");
            return None;
        };
        let (&[rows, words], &[groups, out]) = (qweight.as_slice(), scales.as_slice()) else {
            self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "`qweight` is {} and `scales` {}: both must be 2-D",
                    show(&qweight),
                    show(&scales)
                ),
            );
            return None;
        };
        let method = self.declared.map(|d| d.method.as_str());
        let format = self.declared.and_then(|d| d.format.as_deref());
        let awq = match (method, format) {
            (Some("awq"), _) => true,
            (Some("auto-round" | "autoround"), Some(f)) => f.contains("awq"),
            (Some("gptq" | "auto-round" | "autoround"), _) => false,
            _ => words != out && !group.has(Role::GIdx),
        };
        let (bits_declared, group_declared) = self
            .declared
            .map_or((None, None), |d| d.bits_and_group(group.module));
        if awq {
            let bits = if words == 0 {
                4
            } else {
                32 * words / out.max(1)
            };
            let columns = rows;
            self.expect_shape(group, group.get(Role::QZeros), &[groups, words]);
            if out != words * (32 / bits.max(1)) {
                self.error(
                    Code::QuantMemberShape,
                    &group.name,
                    format!(
                        "`qweight` is {} and `scales` {}: AWQ packs {out} columns into {} words",
                        show(&qweight),
                        show(&scales),
                        ceil_div(out * 4, 32)
                    ),
                );
            }
            let size = ceil_div(columns, groups.max(1));
            let mut scheme = Scheme::new(
                Layout::Awq,
                u8::try_from(bits).unwrap_or(4),
                Grouping::Group(u32::try_from(size).unwrap_or(0)),
            );
            scheme.asymmetric = group.has(Role::QZeros);
            return Some((vec![out, columns], scheme));
        }
        if words != out {
            self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "`qweight` is {} and `scales` {}: GPTQ stores one packed column per output",
                    show(&qweight),
                    show(&scales)
                ),
            );
        }
        let columns = match group.get(Role::GIdx).map(dims).as_deref() {
            Some(&[columns]) => columns,
            _ => rows * 32 / u64::from(bits_declared.unwrap_or(4)).max(1),
        };
        let bits = if columns > 0 && (rows * 32) % columns == 0 {
            rows * 32 / columns
        } else {
            self.error(
                Code::QuantPackedWidth,
                &group.name,
                format!(
                    "`qweight` has {rows} packed rows, which no bit width fills from {columns} \
                     input columns"
                ),
            );
            u64::from(bits_declared.unwrap_or(4))
        };
        let size = match group_declared.map(u64::from) {
            Some(size) if ceil_div(columns, size) == groups => size,
            _ => ceil_div(columns, groups.max(1)),
        };
        if ceil_div(columns, size) != groups {
            self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "`scales` has {groups} groups, which do not split {columns} columns evenly"
                ),
            );
        }
        self.expect_shape(
            group,
            group.get(Role::QZeros),
            &[groups, ceil_div(out * bits, 32)],
        );
        if !group.has(Role::QZeros) {
            self.missing(group, ".qzeros", "");
        }
        let v2 = matches!(format, Some("gptq_v2" | "gptq_p" | "auto_round"));
        let grouping = if groups == 1 {
            Grouping::Channel
        } else {
            Grouping::Group(u32::try_from(size).unwrap_or(0))
        };
        let mut scheme = Scheme::new(
            if v2 { Layout::GptqV2 } else { Layout::GptqV1 },
            u8::try_from(bits).unwrap_or(4),
            grouping,
        );
        scheme.asymmetric = self.declared.and_then(|d| d.symmetric) == Some(false);
        scheme.act_order = self.check_group_index(group, Role::GIdx, columns, groups, size);
        Some((vec![out, columns], scheme))
    }

    fn gpt_oss(&mut self, group: &Group<'_>) -> Option<(Vec<u64>, Scheme)> {
        let blocks = dims(group.get(Role::Blocks)?);
        let (lead, bytes) = split_last(&blocks);
        let (lead, block_count) = split_last(lead);
        if bytes != 16 {
            self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "`{}_blocks` is {}: MXFP4 blocks are 16 bytes",
                    escape(group.module),
                    show(&blocks)
                ),
            );
        }
        let mut scale_dims = lead.to_vec();
        scale_dims.push(block_count);
        match group.get(Role::BlockScales) {
            Some(scales) => self.expect_shape(group, Some(scales), &scale_dims),
            None => self.missing(group, "_scales", ": the weight cannot be read"),
        }
        let mut shape = lead.to_vec();
        shape.push(block_count * 32);
        Some((
            shape,
            Scheme::new(Layout::GptOssMxfp4, 4, Grouping::Group(32)),
        ))
    }

    fn quanto(&mut self, group: &Group<'_>) -> Option<(Vec<u64>, Scheme)> {
        let data = group.get(Role::QuantoData)?;
        if group.get(Role::QuantoScale).is_none() {
            self.missing(group, ".weight._scale", "");
        }
        let data_dims = dims(data);
        if dtype(data) == Some(Dtype::U8) {
            let bits = if self.declared.and_then(|d| d.format.as_deref()) == Some("qint2") {
                2
            } else {
                4
            };
            let rows = group.get(Role::QuantoScale).map_or(0, |s| numel(&dims(s)));
            let size = data_dims.last().copied().unwrap_or(0);
            let mut scheme = Scheme::new(
                Layout::Quanto,
                bits,
                Grouping::Group(u32::try_from(size).unwrap_or(0)),
            );
            scheme.asymmetric = group.has(Role::QuantoShift);
            return Some((vec![rows * size], scheme));
        }
        Some((data_dims, Scheme::new(Layout::Quanto, 8, Grouping::Channel)))
    }

    fn hqq(&mut self, group: &Group<'_>) -> Option<(Vec<u64>, Scheme)> {
        let Some(index) = group.index(Role::HqqShape) else {
            self.missing(group, ".shape", ": the logical shape is unknown");
            return None;
        };
        let values = self.read_ints(index)?;
        let code_bytes = group.get(Role::HqqCodes).map_or(0, TensorInfo::byte_len);
        let shape = self.shape_within(group, ".shape", from_ints(&values), code_bytes)?;
        let scales = group.get(Role::Scale).map_or(0, |s| numel(&dims(s)));
        let size = numel(&shape) / scales.max(1);
        // U8 packings hold 8 / bits rows of the group matrix in each row of `W_q`; the one I32
        // packing (`3bit_32`) ten rows of 3 bits.
        let bits = group.get(Role::HqqCodes).map_or(0, |codes| {
            if codes.dtype.known() == Some(Dtype::I32) {
                return 3;
            }
            let codes = dims(codes);
            let (packed_rows, width) = (codes.first().copied(), codes.last().copied());
            match (packed_rows, width) {
                (Some(packed), Some(width)) if packed > 0 && width > 0 => {
                    match numel(&shape) / width / packed {
                        1 => 8,
                        2 => 4,
                        4 => 2,
                        8 => 1,
                        _ => 0,
                    }
                }
                _ => 0,
            }
        });
        let mut scheme = Scheme::new(
            Layout::Hqq,
            bits,
            Grouping::Group(u32::try_from(size).unwrap_or(0)),
        );
        scheme.asymmetric = true;
        Some((shape, scheme))
    }

    fn exl2(group: &Group<'_>) -> (Vec<u64>, Scheme) {
        let out = group
            .get(Role::Exl2Codes)
            .and_then(|q| q.shape.get(1))
            .unwrap_or(0);
        let columns = group
            .named(".q_invperm")
            .or_else(|| group.named(".q_perm"))
            .map_or(0, |p| numel(&dims(p)));
        (
            vec![out, columns],
            Scheme::new(Layout::Exl2, 0, Grouping::Unknown),
        )
    }

    /// A `P.weight` with members beside it: FP8, int8, NVFP4, MLX, bitsandbytes layouts.
    #[expect(
        clippy::too_many_lines,
        reason = "one layout's members checked in the order they are read"
    )]
    fn weight_with_members(&mut self, group: &Group<'_>) -> Option<(Vec<u64>, Scheme)> {
        let weight = group.get(Role::Weight)?;
        let weight_dims = dims(weight);
        let stored = dtype(weight);
        let comfy = self.declared.is_some_and(|d| d.method == "comfyui")
            || group.named(".comfy_quant").is_some();
        let method = self.declared.map(|d| d.method.as_str());
        if group.has(Role::QuantState) || group.has(Role::Absmax) {
            return self.bitsandbytes_4bit(group);
        }
        if let Some(scb) = group.get(Role::Scb) {
            let out = weight_dims.first().copied().unwrap_or(0);
            self.expect_shape(group, Some(scb), &[out]);
            return Some((
                weight_dims,
                Scheme::new(Layout::BnbInt8, 8, Grouping::Channel),
            ));
        }
        if group.has(Role::Scales) && matches!(stored, Some(Dtype::U32)) {
            return self.mlx(group);
        }
        let (lead, width) = split_last(&weight_dims);
        let out = lead.last().copied().unwrap_or(1);
        if let Some(scale) = group.get(Role::WeightScaleInv) {
            let mut scheme = Scheme::new(Layout::Fp8ScaleInv, 8, Grouping::Unknown);
            scheme.grouping = self.grouping(group, out, width, scale);
            return Some((weight_dims, scheme));
        }
        let scale = group.get(Role::WeightScale);
        if let (Some(scale), Some(Dtype::U8)) = (scale, stored)
            && group.has(Role::WeightScale2)
        {
            let columns = width * 2;
            self.expect_group_scales(group, scale, comfy, lead, ceil_div(columns, 16));
            let layout = if comfy {
                Layout::ComfyNvfp4
            } else {
                Layout::ModelOptNvfp4
            };
            let mut shape = lead.to_vec();
            shape.push(columns);
            return Some((shape, Scheme::new(layout, 4, Grouping::Group(16))));
        }
        let is_fp8 = matches!(stored, Some(Dtype::F8E4M3 | Dtype::F8E5M2));
        if let Some(scale) = scale {
            if is_fp8 && matches!(dtype(scale), Some(Dtype::U8 | Dtype::F8E8M0)) {
                self.expect_group_scales(group, scale, comfy, lead, ceil_div(width, 32));
                let layout = if comfy {
                    Layout::ComfyMxfp8
                } else {
                    Layout::CompressedMxfp8
                };
                return Some((weight_dims, Scheme::new(layout, 8, Grouping::Group(32))));
            }
            let layout = match (stored, comfy, method) {
                (Some(Dtype::I8), true, _) => Layout::ComfyInt8,
                (Some(Dtype::I8), false, _) => Layout::CompressedInt,
                (_, _, Some("compressed-tensors")) if is_fp8 => Layout::CompressedFloat,
                _ if is_fp8 => Layout::Fp8Scaled,
                _ => {
                    if self.declared.is_some_and(Declared::stores_quantized) {
                        self.warning(
                            Code::QuantConfig,
                            &group.name,
                            format!(
                                "stored as {} beside `{}`: the config says weights are stored \
                                 quantized",
                                weight.dtype.name(),
                                escape(&scale.name)
                            ),
                        );
                    }
                    return None;
                }
            };
            let mut scheme = Scheme::new(layout, 8, Grouping::Unknown);
            scheme.grouping = self.grouping(group, out, width, scale);
            if let Some(zero) = group.get(Role::WeightZeroPoint) {
                scheme.asymmetric = true;
                self.expect_shape(group, Some(zero), &dims(scale));
            }
            if let Grouping::Group(size) = scheme.grouping {
                scheme.act_order = self.check_group_index(
                    group,
                    Role::WeightGIdx,
                    width,
                    ceil_div(width, size.into()),
                    size.into(),
                );
            }
            return Some((weight_dims, scheme));
        }
        if is_fp8 && let Some(scale) = group.get(Role::Scale) {
            let mut scheme = Scheme::new(Layout::Fp8Scaled, 8, Grouping::Unknown);
            scheme.grouping = self.grouping(group, out, width, scale);
            return Some((weight_dims, scheme));
        }
        let quantized_dtype = matches!(
            stored,
            Some(Dtype::I8 | Dtype::U8 | Dtype::I32 | Dtype::U32 | Dtype::F8E4M3 | Dtype::F8E5M2)
        );
        let ignored = self
            .declared
            .and_then(|d| d.ignores(group.module))
            .unwrap_or(false);
        if quantized_dtype && !ignored && self.declared.is_some_and(Declared::stores_quantized) {
            self.missing(
                group,
                ".weight_scale",
                &format!(
                    ": the weight is stored as {} codes with no scale to read them",
                    weight.dtype.name()
                ),
            );
        }
        None
    }

    fn mlx(&mut self, group: &Group<'_>) -> Option<(Vec<u64>, Scheme)> {
        let weight_dims = dims(group.get(Role::Weight)?);
        let scales = group.get(Role::Scales)?;
        let scale_dims = dims(scales);
        let (lead, words) = split_last(&weight_dims);
        let (scale_lead, groups) = split_last(&scale_dims);
        if scale_lead != lead {
            self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "`{}` is {}, the packed weight is {}: they must agree but for the last axis",
                    escape(&scales.name),
                    show(&scale_dims),
                    show(&weight_dims)
                ),
            );
        }
        let (bits, size) = self
            .declared
            .map_or((None, None), |d| d.bits_and_group(group.module));
        let mode = self.declared.and_then(|d| d.format.as_deref());
        let mut shape = lead.to_vec();
        if group.has(Role::Biases) {
            self.expect_shape(group, group.get(Role::Biases), &scale_dims);
            let fits = |b: u64, g: u64| words * 32 % b == 0 && words * 32 / b == g * groups;
            let (bits, size) = match (bits.map(u64::from), size.map(u64::from)) {
                (Some(b), Some(g)) if fits(b, g) => (b, g),
                (Some(b), Some(g)) => {
                    self.error(
                        Code::QuantMemberShape,
                        &group.name,
                        format!(
                            "the config's {b} bit, group {g} needs {} scales a row; `{}` has \
                             {groups}",
                            words * 32 / b / g.max(1),
                            escape(&scales.name)
                        ),
                    );
                    (b, g)
                }
                _ => [
                    (4, 64),
                    (4, 32),
                    (4, 128),
                    (8, 64),
                    (2, 64),
                    (3, 64),
                    (6, 64),
                    (5, 64),
                ]
                .into_iter()
                .find(|&(b, g)| fits(b, g))
                .unwrap_or((4, 64)),
            };
            shape.push(words * 32 / bits.max(1));
            let mut scheme = Scheme::new(
                Layout::MlxAffine,
                u8::try_from(bits).unwrap_or(4),
                Grouping::Group(u32::try_from(size).unwrap_or(64)),
            );
            scheme.asymmetric = true;
            return Some((shape, scheme));
        }
        let (layout, bits, size) = match mode {
            Some("nvfp4") => (Layout::MlxNvfp4, 4, 16),
            Some("mxfp8") => (Layout::MlxMxfp8, 8, 32),
            _ => (Layout::MlxMxfp4, 4, 32),
        };
        let columns = words * 32 / bits;
        if ceil_div(columns, size) != groups {
            self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "`{}` has {groups} scales a row, {columns} columns in groups of {size} \
                     need {}",
                    escape(&scales.name),
                    ceil_div(columns, size)
                ),
            );
        }
        shape.push(columns);
        let size = u32::try_from(size).unwrap_or(32);
        Some((
            shape,
            Scheme::new(
                layout,
                u8::try_from(bits).unwrap_or(4),
                Grouping::Group(size),
            ),
        ))
    }

    fn bitsandbytes_4bit(&mut self, group: &Group<'_>) -> Option<(Vec<u64>, Scheme)> {
        let weight = group.get(Role::Weight)?;
        let elements_stored = weight.byte_len() * 2;
        let state = group.index(Role::QuantState).and_then(|index| {
            let bytes = self.read(index)?;
            serde_json::from_slice::<serde_json::Value>(&bytes).ok()
        });
        let Some(state) = state else {
            let unfetched = group
                .index(Role::QuantState)
                .is_some_and(|index| self.unfetched(index));
            match (group.has(Role::QuantState), unfetched) {
                (_, true) => {}
                (true, false) => self.error(
                    Code::QuantMemberShape,
                    &group.name,
                    format!(
                        "`{}.weight.quant_state.*` is not the JSON bitsandbytes writes",
                        escape(group.module)
                    ),
                ),
                (false, false) => self.missing(
                    group,
                    ".weight.quant_state.bitsandbytes__nf4",
                    ": the logical shape and block size are unknown",
                ),
            }
            return Some((
                vec![elements_stored],
                Scheme::new(Layout::BnbNf4, 4, Grouping::Unknown),
            ));
        };
        let shape: Vec<u64> = state.get("shape").and_then(|s| s.as_array()).map_or_else(
            || vec![elements_stored],
            |dims| dims.iter().filter_map(serde_json::Value::as_u64).collect(),
        );
        let shape = self.shape_within(group, ".weight.quant_state.*", shape, weight.byte_len())?;
        let block = state
            .get("blocksize")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(64);
        let layout = match state.get("quant_type").and_then(|t| t.as_str()) {
            Some("fp4") => Layout::BnbFp4,
            _ => Layout::BnbNf4,
        };
        let elements = numel(&shape);
        if ceil_div(elements, 2) != weight.byte_len() {
            self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "the quant state says {}, which packs into {} bytes; `{}` has {}",
                    show(&shape),
                    ceil_div(elements, 2),
                    escape(&weight.name),
                    weight.byte_len()
                ),
            );
        }
        let blocks = ceil_div(elements, block);
        match group.get(Role::Absmax) {
            Some(absmax) if numel(&dims(absmax)) != blocks => self.error(
                Code::QuantMemberShape,
                &group.name,
                format!(
                    "`{}` has {} block scales, {elements} values in blocks of {block} need {blocks}",
                    escape(&absmax.name),
                    numel(&dims(absmax))
                ),
            ),
            Some(_) => {}
            None => self.missing(group, ".weight.absmax", ": the weight cannot be read"),
        }
        if !group.has(Role::QuantMap) {
            self.missing(group, ".weight.quant_map", ": the weight cannot be read");
        }
        let mut scheme = Scheme::new(
            layout,
            4,
            Grouping::Group(u32::try_from(block).unwrap_or(64)),
        );
        scheme.nested = state.get("nested_blocksize").is_some();
        if scheme.nested {
            for (role, suffix) in [
                (Role::NestedAbsmax, ".weight.nested_absmax"),
                (Role::NestedQuantMap, ".weight.nested_quant_map"),
            ] {
                if !group.has(role) {
                    self.missing(group, suffix, ": the block scales cannot be read");
                }
            }
        }
        Some((shape, scheme))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries<'a>(names: &[&'a str]) -> Vec<Option<Entry<'a>>> {
        use rayon::prelude::*;
        entries_of(names.par_iter().copied())
    }

    /// The groups of `names` as [`build_groups`] is given them: each prefix, with its members'
    /// tensors.
    fn gathered(names: &[&str]) -> (Vec<(String, Vec<u32>)>, Vec<Run>) {
        let entries = entries(names);
        let runs = runs_by_group(&entries);
        let mut groups = Vec::new();
        for_each_group(&entries, &runs, |prefix, _, members| {
            groups.push((
                prefix.to_owned(),
                members.iter().map(|m| m.tensor).collect(),
            ));
        });
        (groups, runs)
    }

    /// Gathering keeps the groups in the order they first come, a group's entries by role and
    /// tensor, its runs apart included.
    #[test]
    fn entries_are_gathered_by_group_in_the_order_groups_come() {
        let (groups, _) = gathered(&[
            "m.b.weight",
            "m.b.weight_scale_inv",
            "m.a.weight_scale_inv",
            "m.a.weight",
            "m.c.qweight",
            "m.b.bias",
            "m.a.scales",
            "m.b-c.weight",
            "m.b.weight_scale",
            "m.a.qweight",
        ]);
        let expected = [
            ("m.b", vec![0, 8, 1]),
            ("m.a", vec![3, 2, 9, 6]),
            ("m.c", vec![4]),
            ("m.b-c", vec![7]),
        ];
        assert_eq!(groups.len(), expected.len());
        for ((prefix, tensors), (expected_prefix, expected_tensors)) in groups.iter().zip(&expected)
        {
            assert_eq!(prefix, expected_prefix);
            assert_eq!(tensors, expected_tensors);
        }
    }

    /// Entries whose groups come one run each are taken as they are, a run for each group.
    #[test]
    fn entries_already_gathered_stay_as_they_are() {
        let (groups, runs) = gathered(&[
            "m.z.weight",
            "m.z.weight_scale",
            "m.a.qweight",
            "m.a.scales",
        ]);
        assert_eq!(
            runs,
            [
                Run {
                    start: 0,
                    end: 2,
                    group: 0
                },
                Run {
                    start: 2,
                    end: 4,
                    group: 1
                }
            ]
        );
        assert_eq!(groups[0], ("m.z".to_owned(), vec![0, 1]));
        assert_eq!(groups[1], ("m.a".to_owned(), vec![2, 3]));
    }
}
