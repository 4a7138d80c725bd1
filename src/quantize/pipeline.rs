//! The writer of every scheme but W8A8: where it must (NVFP4, a sharded output) a first pass for
//! each weight's largest magnitude (and NaN or Inf), then each output file written in the
//! reference layout, each member of a quantized weight streamed a run of rows at a time from its
//! source. The pass that makes a weight's codes also dequantizes them and measures the error
//! against the source rows in hand, and takes a digest of every member's bytes it made; the file
//! written is then read back and each member's bytes checked against that digest, so the errors
//! reported are those of the file written while the source is read once or twice, not three
//! times. Without a first pass, the codes' pass watches for NaN and Inf (see [`quantize_then`]).
//!
//! The members of a weight are placed apart in the file (by dtype rank, then name), so each is
//! streamed when the writer reaches it: the small members (scales, zero points) worked out while
//! streaming a weight's codes are kept for later when they fit in [`KEPT_BYTES`], and worked out
//! again otherwise, so that memory does not grow with the model.

use super::copying::write_copying_beside;
use super::digest::Digest;
use super::scheme::{ErrorSums, Member, Plan, Role, Scheme, Streams};
use super::{
    Choice, Control, Kept, NonFinite, Options, Quantized, Summary, Writer, Written,
    largest_magnitudes, map_rows_aligned, output_metadata, prepare,
};
use crate::error::{Error, Result};
use crate::format::writer::{FileLayout, Metadata, Name, Specs, write_atomically};
use crate::format::{Dtype, Model, Shape, Tensor};
use crate::text::escape;
use fixedbitset::FixedBitSet;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// What keeping a small member of `len` bytes costs in memory: its bytes, and its entry and
/// allocation (the scales of a tiny weight are a few bytes, and half a million of them were
/// counted as a megabyte while they took over 40).
fn kept_cost(len: u64) -> u64 {
    len + 96
}

/// Members read back side by side at most.
const READ_BACK_BATCH: usize = 4096;

/// Bytes of small members kept between the codes' pass and the place they are written.
const KEPT_BYTES: u64 = 32 << 20;

fn fits(tensor: &Tensor, options: &Options) -> bool {
    super::compare::fits(options.scheme, options.group_size, tensor)
}

fn plan_of(options: &Options, tensor: &Tensor, absmax: f64) -> Plan {
    super::compare::plan_for(options.scheme, options.group_size, tensor, absmax)
}

pub fn quantize(
    model: &Model,
    output: &Path,
    options: &Options,
    control: &Control,
) -> Result<Summary> {
    quantize_then(model, output, options, control, &|_| {})
}

/// [`quantize`], running `before_read_back` on each file written before it is read back.
///
/// A tensor holding NaN or Inf must be known before a file is written: it is kept or stops
/// everything, and its place in the file depends on it. NVFP4 reads every weight first anyway,
/// for the largest magnitude its global scale needs, and finds them then. The other schemes
/// write a single file at once and watch for them as they go (see `Context::watch_non_finite`):
/// only when one is seen is every weight read for NaN and Inf (as NVFP4 reads it) but those the
/// stopped write had already made codes of, and the file written again. Where that could leave
/// something written (a sharded output's first files, a folder made for the output), every
/// weight is read first as for NVFP4.
fn quantize_then(
    model: &Model,
    output: &Path,
    options: &Options,
    control: &Control,
    before_read_back: &(dyn Fn(&Path) + Sync),
) -> Result<Summary> {
    let (sharded, targets, files) = prepare(model, output)?;
    let mut choices = super::choose_all(model, &files, options, control, |t| fits(t, options))?;
    let folder_made = targets[0]
        .parent()
        .is_none_or(|folder| folder.as_os_str().is_empty() || folder.is_dir());
    let read_first = options.scheme == Scheme::Nvfp4A16 || targets.len() > 1 || !folder_made;
    // Each weight is read for its codes, and read back (counted as the source's read it
    // replaces); a pass for scales written before their codes is counted when it runs.
    let writing = |choices: &[Choice]| -> u64 {
        model
            .tensors
            .iter()
            .zip(choices)
            .map(|(t, c)| match c {
                Choice::Quantize => 2 * t.info.byte_len(),
                Choice::Keep(_) => t.info.byte_len(),
            })
            .sum()
    };
    let bytes_of = |weights: &[usize]| -> u64 {
        weights
            .iter()
            .map(|&index| model.tensors[index].info.byte_len())
            .sum()
    };
    let quantized = unread(&choices, &FixedBitSet::new());
    let first_read = bytes_of(&quantized);
    control.bytes_total.fetch_add(
        writing(&choices) + if read_first { first_read } else { 0 },
        Ordering::Relaxed,
    );
    let mut absmax = vec![0.0; model.tensors.len()];
    if read_first {
        read_largest(
            model,
            &files,
            &quantized,
            &mut choices,
            &mut absmax,
            options,
            control,
        )?;
    }
    super::ready_folder(&targets)?;
    let write = |choices: &[Choice], absmax: &[f64], watch_non_finite: bool| {
        let ignore = super::ignored_modules(model, choices);
        let config = super::quantization_config(options, &ignore).to_string();
        let context = Context {
            model,
            files: &files,
            choices,
            absmax,
            options,
            config: &config,
            control,
            before_read_back,
            watch_non_finite,
            non_finite_seen: AtomicBool::new(false),
            found_finite: Mutex::new(FixedBitSet::new()),
        };
        let written = super::write_outputs(
            model,
            output,
            (sharded, &targets),
            &ignore,
            options,
            &context,
        );
        let found_finite = context
            .found_finite
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (written, context.non_finite_seen.into_inner(), found_finite)
    };
    let written = match write(&choices, &absmax, !read_first) {
        (Err(_), true, found_finite) => {
            // The weights not yet found finite read, then the file written again in full: what
            // is left to do from here.
            let wanted = unread(&choices, &found_finite);
            control.bytes_total.store(
                control.bytes_done.load(Ordering::Relaxed) + bytes_of(&wanted),
                Ordering::Relaxed,
            );
            read_largest(
                model,
                &files,
                &wanted,
                &mut choices,
                &mut absmax,
                options,
                control,
            )?;
            control
                .bytes_total
                .fetch_add(writing(&choices), Ordering::Relaxed);
            write(&choices, &absmax, false).0?
        }
        (written, ..) => written?,
    };
    Ok(written.summary(model, targets, options, choices))
}

/// The weights `choices` quantizes but those `found_finite`: those to read for NaN and Inf
/// (the schemes that watch for them use no largest magnitude of the others).
fn unread(choices: &[Choice], found_finite: &FixedBitSet) -> Vec<usize> {
    (0..choices.len())
        .filter(|&index| choices[index] == Choice::Quantize && !found_finite.contains(index))
        .collect()
}

/// Reads each of `wanted` (weights `choices` quantizes) for its largest magnitude, into
/// `absmax`; one holding NaN or Inf is kept as it is or stops everything, as `options` say.
fn read_largest(
    model: &Model,
    files: &[File],
    wanted: &[usize],
    choices: &mut [Choice],
    absmax: &mut [f64],
    options: &Options,
    control: &Control,
) -> Result<()> {
    let largest = largest_magnitudes(model, files, wanted, control)?;
    for (&index, largest) in wanted.iter().zip(largest) {
        match largest {
            Some(largest) => absmax[index] = largest,
            None if options.non_finite == NonFinite::Skip => {
                choices[index] = Choice::Keep(Kept::NonFinite);
            }
            None => {
                return Err(Error::Invalid(format!(
                    "`{}` holds NaN or Inf; quantizing it would spread them (skip such tensors to go on)",
                    escape(model.tensors[index].name())
                )));
            }
        }
    }
    Ok(())
}

/// A tensor of an output file: a source tensor copied, or a member of a quantized weight (its
/// index among the plan's members), by index among the model's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Copy(u32),
    Member(u32, u8),
}

impl Entry {
    fn tensor(self) -> usize {
        let (Entry::Copy(tensor) | Entry::Member(tensor, _)) = self;
        tensor as usize
    }
}

struct Context<'a> {
    model: &'a Model,
    files: &'a [File],
    choices: &'a [Choice],
    absmax: &'a [f64],
    options: &'a Options,
    config: &'a str,
    control: &'a Control,
    before_read_back: &'a (dyn Fn(&Path) + Sync),
    /// Whether writing stops at a weight holding NaN or Inf (in the codes' pass, a sum of squares
    /// that is not finite, which values beyond `f32`'s squares also give), setting
    /// `non_finite_seen`.
    watch_non_finite: bool,
    non_finite_seen: AtomicBool,
    /// The weights whose codes were made while watching, none of whose values is NaN or Inf.
    found_finite: Mutex<FixedBitSet>,
}

impl Context<'_> {
    fn plan(&self, tensor: usize) -> Plan {
        plan_of(
            self.options,
            &self.model.tensors[tensor],
            self.absmax[tensor],
        )
    }

    fn member(&self, tensor: usize, member: u8) -> Member {
        let mut members = self.plan(tensor).members();
        members.swap_remove(usize::from(member))
    }

    /// The entries of the model's tensors from `first` to `end`, each quantized weight's
    /// members one after another.
    fn entries(&self, first: usize, end: usize) -> Vec<Entry> {
        let members = |index: usize| match self.choices[index] {
            Choice::Quantize => self.plan(index).members().len(),
            Choice::Keep(_) => 1,
        };
        // Sized exactly: doubling a list of millions would hold both copies at once.
        let mut entries = Vec::with_capacity((first..end).map(members).sum());
        for index in first..end {
            let index32 = u32::try_from(index).unwrap_or(u32::MAX);
            if self.choices[index] == Choice::Quantize {
                let count = self.plan(index).members().len();
                entries
                    .extend((0..count).map(|m| Entry::Member(index32, m.try_into().unwrap_or(0))));
            } else {
                entries.push(Entry::Copy(index32));
            }
        }
        entries
    }

    fn name(&self, entry: Entry) -> Name<'_> {
        let stem = self.model.tensors[entry.tensor()].name();
        match entry {
            Entry::Copy(_) => Name::new(stem),
            Entry::Member(tensor, member) => Name {
                stem,
                suffix: self.member(tensor as usize, member).suffix,
            },
        }
    }
}

impl Writer for Context<'_> {
    fn write_index(&self, output: &Path) -> Result<usize> {
        write_index(self, output)
    }

    fn write_shard(&self, shard: usize, target: &Path) -> Result<Written> {
        let model = self.model;
        let first = model.tensors.partition_point(|t| t.shard < shard);
        let end = model.tensors.partition_point(|t| t.shard <= shard);
        let specs = ShardSpecs {
            context: self,
            entries: self.entries(first, end),
        };
        let metadata = output_metadata(model.shards[shard].metadata.as_deref(), self.config);
        let layout = FileLayout::plan(&specs, Some(metadata))?;
        let mut kept: HashMap<(u32, u8), Vec<u8>> = HashMap::new();
        let mut kept_bytes = 0u64;
        let weights = self.choices[first..end]
            .iter()
            .filter(|&&choice| choice == Choice::Quantize)
            .count();
        // By weight, sized exactly, and sorted once written: a table of half a million weights
        // took twice the room.
        let mut measured: Vec<(u32, Measured)> = Vec::with_capacity(weights);
        write_atomically(target, |out| {
            write_copying_beside(
                &layout,
                out,
                |spec| match specs.entries[spec] {
                    Entry::Copy(index) => Some(index as usize),
                    Entry::Member(..) => None,
                },
                (model, self.files, self.control),
                |spec, out| {
                    let Entry::Member(index, member) = specs.entries[spec] else {
                        return Ok(());
                    };
                    if let Some(bytes) = kept.remove(&(index, member)) {
                        kept_bytes -= kept_cost(bytes.len() as u64);
                        return out.write_all(&bytes);
                    }
                    let mut keeping = Keeping {
                        kept: &mut kept,
                        kept_bytes: &mut kept_bytes,
                        measured: &mut measured,
                    };
                    self.write_member(index, member, out, &mut keeping)
                },
            )
        })?;
        let mut quantized = Vec::new();
        (self.before_read_back)(target);
        let differs = layout.differences(target)?.is_some();
        measured.sort_unstable_by_key(|&(index, _)| index);
        let read_back = self.read_back(&layout, target, &measured, &mut quantized)?;
        Ok(Written {
            quantized,
            bytes: layout.file_len(),
            verified: !differs && read_back,
        })
    }
}

/// What the pass that makes a weight's codes measures while it runs: the error of the members
/// it makes against the source, whether every value is within half a step, and a digest of each
/// member's bytes.
#[derive(Default)]
struct Measuring {
    sums: ErrorSums,
    within: bool,
    codes: Digest,
    scales: Digest,
    zero_points: Digest,
}

impl Measuring {
    fn add(&mut self, streams: &Streams, sums: &ErrorSums, within: bool) {
        self.sums.merge(sums);
        self.within &= within;
        self.codes.update(&streams.codes);
        self.scales.update(&streams.scales);
        self.zero_points.update(&streams.zero_points);
    }

    /// What is kept of it until the file is read back: the digests finished, a few words
    /// rather than three hash states of over 500 bytes each (a model of half a million small
    /// weights held 1.9 GB of them).
    fn finish(&self) -> Measured {
        Measured {
            sums: self.sums,
            within: self.within,
            codes: self.codes.finish(),
            scales: self.scales.finish(),
            zero_points: self.zero_points.finish(),
        }
    }
}

/// What the pass that made a weight's codes measured (see [`Measuring`]).
struct Measured {
    sums: ErrorSums,
    within: bool,
    codes: u64,
    scales: u64,
    zero_points: u64,
}

impl Measured {
    fn digest(&self, role: Role) -> Option<u64> {
        match role {
            Role::Codes => Some(self.codes),
            Role::Scales { .. } => Some(self.scales),
            Role::ZeroPoints { .. } => Some(self.zero_points),
            Role::Shape | Role::GlobalScale => None,
        }
    }
}

/// What the writing of a file keeps from one member to the next: the small members made ahead
/// (and their bytes), and each weight's measure.
struct Keeping<'a> {
    kept: &'a mut HashMap<(u32, u8), Vec<u8>>,
    kept_bytes: &'a mut u64,
    measured: &'a mut Vec<(u32, Measured)>,
}

impl Context<'_> {
    /// Writes member `member` of quantized weight `index`, streaming the weight; the other
    /// streamed members it yields are kept for later while they fit. The pass that makes the
    /// codes written measures them.
    fn write_member(
        &self,
        index: u32,
        member: u8,
        out: &mut (impl Write + Send),
        keeping: &mut Keeping<'_>,
    ) -> io::Result<()> {
        let tensor = &self.model.tensors[index as usize];
        let plan = self.plan(index as usize);
        let members = plan.members();
        let wanted = &members[usize::from(member)];
        if wanted.rows_per_row().is_none() {
            return out.write_all(&plan.whole(wanted.role));
        }
        // The other streamed members not yet written, kept if they fit.
        let mut keep: Vec<(u8, Role, Vec<u8>)> = Vec::new();
        for (m, other) in members.iter().enumerate() {
            let m = u8::try_from(m).unwrap_or(0);
            let streamed = other.rows_per_row().is_some();
            if m == member || !streamed || keeping.kept.contains_key(&(index, m)) {
                continue;
            }
            let len = other.byte_len();
            // Written already when it comes before this member in the file.
            if *keeping.kept_bytes + kept_cost(len) <= KEPT_BYTES
                && self.comes_after(index, member, m)
            {
                *keeping.kept_bytes += kept_cost(len);
                keep.push((
                    m,
                    other.role,
                    Vec::with_capacity(usize::try_from(len).unwrap_or(0)),
                ));
            }
        }
        let role = wanted.role;
        let scales_alone = keep.is_empty() && matches!(role, Role::Scales { .. });
        let makes_codes =
            role == Role::Codes || keep.iter().any(|&(_, kept, _)| kept == Role::Codes);
        if !makes_codes {
            self.control
                .bytes_total
                .fetch_add(tensor.info.byte_len(), Ordering::Relaxed);
        }
        let mut measured = Measuring {
            within: true,
            ..Measuring::default()
        };
        map_rows_aligned(
            self.model,
            self.files,
            tensor,
            plan.row_multiple(),
            self.control,
            |_, values: &[f32]| {
                let mut streams = Streams::take();
                if scales_alone {
                    plan.quantize_scales(values, &mut streams);
                } else {
                    plan.quantize(values, &mut streams);
                }
                let checked = makes_codes.then(|| plan.check(values, &streams));
                // A pass that makes no codes (scales before their codes in the file: FP8's
                // come first) measures nothing: it looks for NaN and Inf itself.
                let non_finite = match &checked {
                    _ if !self.watch_non_finite => false,
                    Some((sums, _)) => !sums.signal.is_finite(),
                    None => !super::absmax_of(values).1,
                };
                Ok((streams, checked, non_finite))
            },
            |(streams, checked, non_finite)| {
                if non_finite {
                    self.non_finite_seen.store(true, Ordering::Relaxed);
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "a weight holds NaN or Inf",
                    ));
                }
                out.write_all(streams.of(role))?;
                for (_, role, bytes) in &mut keep {
                    bytes.extend_from_slice(streams.of(*role));
                }
                if let Some((sums, within)) = checked {
                    measured.add(&streams, &sums, within);
                }
                streams.give();
                Ok(())
            },
        )?;
        for (m, _, bytes) in keep {
            keeping.kept.insert((index, m), bytes);
        }
        if makes_codes {
            keeping.measured.push((index, measured.finish()));
            if self.watch_non_finite {
                let mut found = self
                    .found_finite
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                found.grow(index as usize + 1);
                found.insert(index as usize);
            }
        }
        Ok(())
    }

    /// Whether member `other` of weight `index` is written after member `member` in the file:
    /// lower dtype rank, or the same rank and a later name.
    fn comes_after(&self, index: u32, member: u8, other: u8) -> bool {
        let (a, b) = (
            self.member(index as usize, member),
            self.member(index as usize, other),
        );
        let (rank_a, rank_b) = (a.dtype.rank(), b.dtype.rank());
        rank_b < rank_a || (rank_b == rank_a && b.suffix > a.suffix)
    }

    /// Reads the members of every quantized weight of a written file back and checks each
    /// against the digest taken when it was made (or, for a member written whole, its bytes as
    /// planned): the errors measured then, which go to `quantized`, are those of the file.
    /// Whether every weight is within half a step everywhere; an error names a member whose
    /// bytes differ.
    fn read_back<'a>(
        &self,
        layout: &FileLayout<'a, ShardSpecs<'a>, impl Metadata<'a>>,
        target: &Path,
        measured: &[(u32, Measured)],
        quantized: &mut Vec<Quantized>,
    ) -> Result<bool> {
        let written = crate::paths::open_file(target).map_err(|e| Error::io(target, e))?;
        let specs = layout.specs();
        let ranges = layout.ranges_in_file();
        let mut all_within = true;
        // Sized exactly: doubling a list of half a million would hold both copies at once.
        quantized.reserve_exact(
            specs
                .entries
                .iter()
                .filter(|entry| matches!(entry, Entry::Member(_, 0)))
                .count(),
        );
        // Members' bytes to check, `(spec, digest)`, read back side by side a batch at a time.
        let mut checks = Vec::with_capacity(READ_BACK_BATCH);
        let verify = |checks: &mut Vec<(usize, u64)>| -> Result<()> {
            use rayon::prelude::*;
            checks.par_iter().try_for_each(|&(spec, expected)| {
                let member = self.name(specs.entries[spec]);
                Digest::check_file(
                    &written,
                    target,
                    ranges[spec],
                    expected,
                    member,
                    self.control,
                )
            })?;
            checks.clear();
            Ok(())
        };
        for (spec, entry) in specs.entries.iter().enumerate() {
            let Entry::Member(index, 0) = *entry else {
                continue;
            };
            let plan = self.plan(index as usize);
            let found = measured.binary_search_by_key(&index, |&(index, _)| index);
            let Some((_, measure)) = found.ok().map(|at| &measured[at]) else {
                return Err(Error::Invalid(format!(
                    "`{}`: its codes were not measured when written",
                    escape(self.model.tensors[index as usize].name())
                )));
            };
            for (m, member) in plan.members().iter().enumerate() {
                let expected = measure
                    .digest(member.role)
                    .unwrap_or_else(|| Digest::of(&plan.whole(member.role)));
                checks.push((spec + m, expected));
            }
            if checks.len() >= READ_BACK_BATCH {
                verify(&mut checks)?;
            }
            all_within &= measure.within;
            quantized.push(Quantized {
                tensor: index as usize,
                error: super::finish(&measure.sums),
            });
        }
        verify(&mut checks)?;
        for weight in &*quantized {
            // Counted as the read of the source it replaces, so the progress still ends full.
            self.control.bytes_done.fetch_add(
                self.model.tensors[weight.tensor].info.byte_len(),
                Ordering::Relaxed,
            );
        }
        Ok(all_within)
    }
}

/// The digest of `len` bytes of `file` from `begin`.
struct ShardSpecs<'a> {
    context: &'a Context<'a>,
    entries: Vec<Entry>,
}

impl Specs for ShardSpecs<'_> {
    fn count(&self) -> usize {
        self.entries.len()
    }

    fn name(&self, index: usize) -> Name<'_> {
        self.context.name(self.entries[index])
    }

    fn dtype(&self, index: usize) -> Dtype {
        match self.entries[index] {
            Entry::Copy(tensor) => self.context.model.tensors[tensor as usize]
                .info
                .dtype
                .known()
                .unwrap_or(Dtype::U8),
            Entry::Member(tensor, member) => self.context.member(tensor as usize, member).dtype,
        }
    }

    fn shape(&self, index: usize) -> Shape {
        match self.entries[index] {
            Entry::Copy(tensor) => self.context.model.tensors[tensor as usize]
                .info
                .shape
                .clone(),
            Entry::Member(tensor, member) => self.context.member(tensor as usize, member).shape,
        }
    }
}

/// Writes the output's index; gives the number of entries.
fn write_index(context: &Context<'_>, output: &Path) -> Result<usize> {
    let model = context.model;
    let mut entries = context.entries(0, model.tensors.len());
    let size = |entry: Entry| match entry {
        Entry::Copy(tensor) => model.tensors[tensor as usize].info.byte_len(),
        Entry::Member(tensor, member) => context.member(tensor as usize, member).byte_len(),
    };
    let total_size = entries.iter().map(|&e| size(e)).sum();
    entries.sort_unstable_by(|&a, &b| context.name(a).cmp(&context.name(b)));
    super::write_index_entries(
        output,
        total_size,
        &entries,
        &|entry| context.name(entry),
        &|entry| {
            model.shards[model.tensors[entry.tensor()].shard]
                .label
                .as_str()
        },
    )?;
    Ok(entries.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::{Fill, SyntheticModel};
    use crate::quantize::Scheme;
    use crate::quantize::tests::{cut_file, flip_a_byte_of};

    #[test]
    fn a_file_altered_before_its_read_back_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        SyntheticModel::new(5)
            .tensor("a.weight", Dtype::Bf16, &[64, 256], normal.clone())
            .tensor("b.weight", Dtype::F32, &[32, 128], normal)
            .write(&source)
            .unwrap();
        let model = Model::open(&source).unwrap();
        let cases = [
            (Scheme::W4A16, "a.weight_packed"),
            (Scheme::W4A16Asym, "b.weight_zero_point"),
            (Scheme::W8A16, "a.weight_scale"),
            (Scheme::Fp8Block, "b.weight"),
            (Scheme::Nvfp4A16, "a.weight_global_scale"),
        ];
        for (scheme, altered) in cases {
            let options = Options {
                scheme,
                ..Options::default()
            };
            let output = dir.path().join(format!("{scheme}.safetensors"));
            let unaltered = quantize(&model, &output, &options, &Control::default()).unwrap();
            assert!(unaltered.verified, "{scheme}");
            let error = quantize_then(&model, &output, &options, &Control::default(), &|path| {
                flip_a_byte_of(path, altered);
            })
            .unwrap_err()
            .to_string();
            assert!(
                error.contains(&format!("`{altered}` read back differs")),
                "{scheme}: {error}"
            );
        }
    }

    /// A model of `weights`, each F32 `[rows, 128]` filled with its values, written to `path`.
    fn model_of(path: &Path, weights: &[(&str, u64, Fill)]) -> Model {
        let mut model = SyntheticModel::new(11);
        for (name, rows, fill) in weights {
            model = model.tensor(name, Dtype::F32, &[*rows, 128], fill.clone());
        }
        model.write(path).unwrap();
        Model::open(path).unwrap()
    }

    /// What [`both_ways`] wrote: the summary of the watched write, both files' bytes.
    #[derive(Debug)]
    struct Both {
        summary: Summary,
        watched: Vec<u8>,
        read_first: Vec<u8>,
    }

    /// Writes `model` under `options` into a new file in the existing `folder` (the codes'
    /// pass watches for NaN and Inf) and into a folder not yet made (every weight read first):
    /// both files, or the first's error, and the first's progress (done, total).
    fn both_ways(model: &Model, folder: &Path, options: &Options) -> (Result<Both>, [u64; 2]) {
        let control = Control::default();
        let watched = folder.join("watched.safetensors");
        let read_first = folder.join("new").join("read-first.safetensors");
        let run = || -> Result<Both> {
            let summary = quantize(model, &watched, options, &control)?;
            let first = quantize(model, &read_first, options, &Control::default())?;
            assert_eq!(summary.verified, first.verified);
            assert_eq!(summary.choices, first.choices);
            Ok(Both {
                summary,
                watched: std::fs::read(&watched).unwrap(),
                read_first: std::fs::read(&read_first).unwrap(),
            })
        };
        let result = run();
        let progress =
            [&control.bytes_done, &control.bytes_total].map(|count| count.load(Ordering::Relaxed));
        (result, progress)
    }

    /// The weights a stopped write found finite are not read again for NaN and Inf: one whose
    /// file ends early is left unread, and those read are kept or not as their values say.
    #[test]
    fn weights_found_finite_are_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        let model = model_of(
            &source,
            &[
                ("b.weight", 32, Fill::Values(vec![0.5, f64::NAN])),
                ("c.weight", 16, Fill::Values(vec![0.25, -1.0])),
                ("a.weight", 64, Fill::Values(vec![2.0, 3.0])),
            ],
        );
        let files = vec![crate::paths::open_file(&source).unwrap()];
        let by_name = |name: &str| model.tensors.iter().position(|t| t.name() == name).unwrap();
        let [a, b, c] = ["a.weight", "b.weight", "c.weight"].map(by_name);
        let last = (0..3).max_by_key(|&i| model.file_range(&model.tensors[i]).0);
        assert_eq!(last, Some(c));
        let (start, len) = model.file_range(&model.tensors[c]);
        cut_file(&source, start + len / 2);
        let options = Options {
            scheme: Scheme::W4A16,
            non_finite: NonFinite::Skip,
            ..Options::default()
        };
        let read = |found: &FixedBitSet| {
            let mut choices = vec![Choice::Quantize; 3];
            let mut absmax = vec![0.0; 3];
            let control = Control::default();
            read_largest(
                &model,
                &files,
                &unread(&choices, found),
                &mut choices,
                &mut absmax,
                &options,
                &control,
            )
            .map(|()| (choices, absmax))
        };
        let mut found = FixedBitSet::with_capacity(3);
        found.insert(c);
        let (choices, absmax) = read(&found).unwrap();
        assert_eq!(
            [choices[a], choices[b], choices[c]],
            [
                Choice::Quantize,
                Choice::Keep(Kept::NonFinite),
                Choice::Quantize
            ]
        );
        assert_eq!([absmax[a], absmax[c]], [3.0, 0.0]);
        assert!(read(&FixedBitSet::new()).is_err());
    }

    /// Without a first read of the weights, a single file's codes' pass watches for NaN and
    /// Inf: a clean model is written in one go; one holding them (or values whose squares pass
    /// `f32`'s range, which are finite) is read for them, then written again. Either way the
    /// file is the one written when every weight is read first, nothing is written when such a
    /// weight stops everything, and the progress ends full.
    #[test]
    fn non_finite_weights_found_while_writing() {
        let dir = tempfile::tempdir().unwrap();
        let normal = Fill::Normal {
            mean: 0.0,
            std: 0.02,
        };
        let clean = model_of(
            &dir.path().join("clean.safetensors"),
            &[
                ("a.weight", 64, normal.clone()),
                ("b.weight", 32, normal.clone()),
            ],
        );
        let huge = model_of(
            &dir.path().join("huge.safetensors"),
            &[
                ("a.weight", 64, normal.clone()),
                ("h.weight", 16, Fill::Values(vec![1e20, -3e19, 0.5, 2.0])),
            ],
        );
        let poisoned = model_of(
            &dir.path().join("poisoned.safetensors"),
            &[
                ("a.weight", 64, normal.clone()),
                ("b.weight", 32, Fill::Values(vec![0.5, f64::NAN, -1.0])),
                ("c.weight", 16, Fill::Values(vec![f64::INFINITY, 0.25])),
                ("d.weight", 16, normal),
            ],
        );
        let schemes = [
            Scheme::W8A16,
            Scheme::W4A16,
            Scheme::W4A16Asym,
            Scheme::Fp8Dynamic,
            Scheme::Fp8Block,
        ];
        for scheme in schemes {
            let out = tempfile::tempdir().unwrap();
            let stop = Options {
                scheme,
                ..Options::default()
            };
            let skip = Options {
                non_finite: NonFinite::Skip,
                ..stop.clone()
            };
            // Each model, the weights it keeps, and the first weight read for NaN and Inf once
            // the write has begun (it and those after it are): values near 1e20, whose squares
            // `f32` does not hold, are not taken for them.
            for (model, kept, read) in [(&clean, 0, 4), (&huge, 0, 4), (&poisoned, 2, 1)] {
                let (written, [done, total]) = both_ways(model, out.path(), &skip);
                let both = written.unwrap();
                assert!(both.watched == both.read_first, "{scheme}");
                assert!(both.summary.verified, "{scheme}");
                let non_finite = both
                    .summary
                    .choices
                    .iter()
                    .filter(|&&c| c == Choice::Keep(Kept::NonFinite))
                    .count();
                assert_eq!(non_finite, kept, "{scheme}");
                assert_eq!(done, total, "{scheme}: the progress ends full");
                let bytes: u64 = model.tensors.iter().map(|t| t.info.byte_len()).sum();
                let read: u64 = model
                    .tensors
                    .iter()
                    .skip(read)
                    .map(|t| t.info.byte_len())
                    .sum();
                assert!(total >= 2 * bytes + read, "{scheme}");
            }
            let stopped = tempfile::tempdir().unwrap();
            let (written, _) = both_ways(&poisoned, stopped.path(), &stop);
            let error = written.unwrap_err().to_string();
            assert!(
                error.contains("`b.weight` holds NaN or Inf"),
                "{scheme}: {error}"
            );
            let left: Vec<_> = std::fs::read_dir(stopped.path()).unwrap().collect();
            assert!(left.is_empty(), "{scheme}: {left:?}");
        }
    }
}
