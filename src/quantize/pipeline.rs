//! The writer of every scheme but W8A8: where it must (NVFP4, a sharded output) a first pass for
//! each weight's largest magnitude (and NaN or Inf), then each output file written in the
//! reference layout, each member of a quantized weight streamed a run of rows at a time from its
//! source. The pass that makes a weight's codes also dequantizes them and measures the error
//! against the source rows in hand, and takes a digest of every member's bytes it made; the file
//! written is then read back and each member's bytes checked against that digest, so the errors
//! reported are those of the file written while the source is read once or twice, not three
//! times. Without a first pass, the codes' pass watches for NaN and Inf (see [`quantize_then`]).
//!
//! The members of a weight are placed apart in the file (by dtype rank, then name), and the
//! writer reaches the first of them first: the pass that makes it makes the weight's later
//! members too, so that the weight is read once. Those later members are kept for their place
//! while they fit in [`KEPT_BYTES`], so that memory does not grow with the model, and written
//! into their places beside the stream otherwise (FP8's and NVFP4's codes, which come after
//! their scales and are too large to keep).

use super::copying::{Copies, Placement, write_copying_beside};
use super::digest::Digest;
use super::scheme::{ErrorSums, Member, Plan, Role, Scheme, Streams};
use super::{
    Choice, Control, Kept, NonFinite, Options, Quantized, Summary, Writer, Written,
    largest_magnitudes, map_rows_aligned, output_metadata, prepare,
};
use crate::error::{Error, Result};
use crate::format::writer::{
    AtomicFile, FileLayout, Metadata, Name, Specs, WriteBehind, start_disk_write,
};
use crate::format::{Dtype, Model, Shape, Tensor};
use crate::text::escape;
use fixedbitset::FixedBitSet;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

/// What keeping a small member of `len` bytes costs in memory: its bytes, and its entry and
/// allocation (the scales of a tiny weight are a few bytes, and half a million of them were
/// counted as a megabyte while they took over 40).
fn kept_cost(len: u64) -> u64 {
    len + 96
}

/// Members read back side by side at most.
const READ_BACK_BATCH: usize = 4096;

/// Bytes of members kept between the pass that makes them and the place they are written.
const KEPT_BYTES: u64 = 32 << 20;

fn fits(tensor: &Tensor, options: &Options) -> bool {
    super::compare::scheme_quantizes(options.scheme, options.group_size, tensor)
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
    quantize_then(model, output, options, control, (&|_| {}, KEPT_BYTES))
}

/// [`quantize`], running `before_read_back` on each file written before it is read back, with
/// `kept_room` bytes for members kept ahead of their place (see [`Context::made_beside`]).
///
/// A tensor holding NaN or Inf must be known before a file is written: it is kept or stops
/// everything, and its place in the file depends on it. NVFP4 reads every weight first anyway,
/// for the largest magnitude its global scale needs, and finds them then. The other schemes
/// write a single file at once and watch for them as they go (see `Context::watch_non_finite`).
/// A write that meets one stops; the weight is read to tell NaN or Inf from values whose squares
/// only pass the measure's range, kept as it is (or everything stops), and the write goes on
/// over what it had written, passing over what stays in place (see [`Partial`]). After
/// [`WATCHED_STOPS`] stops, or at finite values, every weight not yet found finite is read for
/// NaN and Inf (as NVFP4 reads it) and the write goes on without watching. For a sharded
/// output every weight is read first as for NVFP4: a write that stopped in a later file would
/// make the files before it again (nothing is put in place before every file is written).
fn quantize_then(
    model: &Model,
    output: &Path,
    options: &Options,
    control: &Control,
    (before_read_back, kept_room): (&(dyn Fn(&Path) + Sync), u64),
) -> Result<Summary> {
    let (sharded, targets, files) = prepare(model, output)?;
    let mut choices = super::choose_all(model, &files, options, control, |t| fits(t, options))?;
    let read_first = options.scheme == Scheme::Nvfp4A16 || targets.len() > 1;
    let planned = writing(model, &choices);
    control.bytes_total.fetch_add(planned, Ordering::Relaxed);
    let mut absmax = vec![0.0; model.tensors.len()];
    if read_first {
        read_largest(
            model,
            &files,
            &unread(&choices, &FixedBitSet::new()),
            &mut choices,
            &mut absmax,
            options,
            control,
        )?;
        // A weight found holding NaN or Inf is copied rather than quantized and read back.
        control
            .bytes_total
            .fetch_sub(planned - writing(model, &choices), Ordering::Relaxed);
    }
    super::quantizes_some(&choices, options)?;
    let _folder = super::ready_folder(&targets)?;
    let write = |choices: &[Choice], absmax: &[f64], watch_non_finite, resume: Option<_>| {
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
            kept_room,
            watch_non_finite,
            write_ahead: !watch_non_finite || resume.is_none(),
            non_finite_in: OnceLock::new(),
            found_finite: Mutex::new(FixedBitSet::new()),
            partial: Mutex::new(resume),
        };
        let written = super::write_outputs(
            model,
            output,
            (sharded, &targets),
            &ignore,
            options,
            &context,
        );
        let stopped = unpoisoned(context.partial);
        (written, stopped, unpoisoned(context.found_finite))
    };
    let mut watch = !read_first;
    let mut found_finite = FixedBitSet::new();
    let mut resume = None;
    let mut stops = 0;
    let written = loop {
        let (written, stopped, found) = write(&choices, &absmax, watch, resume.take());
        let Some(partial) = stopped else {
            break written?;
        };
        found_finite.union_with(&found);
        let weight = partial.stopped_at;
        resume = Some(partial);
        stops += 1;
        read_largest(
            model,
            &files,
            &[weight],
            &mut choices,
            &mut absmax,
            options,
            control,
        )?;
        if stops >= WATCHED_STOPS || choices[weight] == Choice::Quantize {
            found_finite.grow(weight + 1);
            found_finite.insert(weight);
            read_largest(
                model,
                &files,
                &unread(&choices, &found_finite),
                &mut choices,
                &mut absmax,
                options,
                control,
            )?;
            watch = false;
        }
        super::quantizes_some(&choices, options)?;
    };
    Ok(written.summary(model, targets, options, choices))
}

/// The bytes a write of `model` as `choices` say reads: each weight quantized read for its codes
/// and read back (counted as the source's read it replaces), each tensor kept copied. A pass for
/// scales written before their codes is counted when it runs.
fn writing(model: &Model, choices: &[Choice]) -> u64 {
    model
        .tensors
        .iter()
        .zip(choices)
        .map(|(t, c)| match c {
            Choice::Quantize => 2 * t.info.byte_len(),
            Choice::Keep(_) => t.info.byte_len(),
        })
        .sum()
}

fn unpoisoned<T>(mutex: Mutex<T>) -> T {
    mutex
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Stops of a watched write (each at a weight holding NaN or Inf) after which every weight not
/// yet found finite is read for them: a diverged model, NaN in every weight, would otherwise
/// stop at each, and each stop copies the tensors kept whole again.
const WATCHED_STOPS: usize = 4;

/// The weights `choices` quantizes but those `found_finite`: those to read for NaN and Inf
/// (the schemes that watch for them use no largest magnitude of the others).
fn unread(choices: &[Choice], found_finite: &FixedBitSet) -> Vec<usize> {
    (0..choices.len())
        .filter(|&index| choices[index] == Choice::Quantize && !found_finite.contains(index))
        .collect()
}

/// Reads each of `wanted` (weights `choices` quantizes) for its largest magnitude, into
/// `absmax`; one holding NaN or Inf is kept as it is or stops everything, as `options` say. The
/// bytes read are added to the progress's total.
fn read_largest(
    model: &Model,
    files: &[File],
    wanted: &[usize],
    choices: &mut [Choice],
    absmax: &mut [f64],
    options: &Options,
    control: &Control,
) -> Result<()> {
    let bytes: u64 = wanted
        .iter()
        .map(|&index| model.tensors[index].info.byte_len())
        .sum();
    control.bytes_total.fetch_add(bytes, Ordering::Relaxed);
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
    /// Bytes of members kept ahead of their place at most: [`KEPT_BYTES`] but in tests.
    kept_room: u64,
    /// Whether writing stops at a weight holding NaN or Inf (in the codes' pass, a sum of squares
    /// that is not finite, which values beyond `f32`'s squares also give), setting
    /// `non_finite_in` to it.
    watch_non_finite: bool,
    /// Whether members too large to keep for their place are written there ahead of the stream
    /// (see [`Context::made_beside`]): but in a watched write that goes on after a stop.
    write_ahead: bool,
    non_finite_in: OnceLock<u32>,
    /// The weights whose codes were made while watching, none of whose values is NaN or Inf.
    found_finite: Mutex<FixedBitSet>,
    /// The file a write that stopped left to go on from: given to the write, and left by it.
    partial: Mutex<Option<Partial>>,
}

/// What a watched write that stopped at a weight holding NaN or Inf leaves for the next one to go
/// on from. The next write plans its file with the weight kept, pads its header so that the most
/// bytes made stay where they are (see [`in_place`]), and passes over them; it writes the rest:
/// the weights not yet made, those whose bytes moved (most often only the small members before
/// the codes), and the tensors kept whole, copied again. (Writing the whole file again, after
/// reading every other weight for NaN and Inf, had cost a model with two such weights a quarter
/// of the save's time.)
struct Partial {
    writing: Writing,
    /// The weight the write stopped at.
    stopped_at: usize,
    header_len: u64,
    /// The file's entries before the one it stopped in, in its order: each with its offset in
    /// the data and whether it is made (a copy made beside the stream may not be yet).
    before_stop: Vec<(Entry, u64, bool)>,
}

/// A file being written: the temporary file, the small members made ahead and kept for their
/// place, and each weight's measure, by weight.
struct Writing {
    file: AtomicFile,
    kept: HashMap<(u32, u8), Vec<u8>>,
    measured: Vec<(u32, Measured)>,
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
        let mut layout = FileLayout::plan(&specs, Some(metadata))?;
        let (
            Writing {
                file,
                kept,
                measured,
            },
            in_place,
            resumed,
        ) = self.start_or_go_on(target, &mut layout, first..end)?;
        let mut keeping = Keeping::new(kept, measured);
        let placement = |spec: usize| {
            if in_place.contains(spec) {
                return Placement::InPlace;
            }
            match specs.entries[spec] {
                Entry::Copy(index) => Placement::Copied(index as usize),
                Entry::Member(..) => Placement::Streamed,
            }
        };
        let (mut streaming, mut copies_made) = (None, 0);
        let places = layout.ranges_in_file();
        let streamed = file.write(|out| {
            // A write that goes on after a stop has met NaN or Inf once and may meet them
            // again, which would move the copies made beside it past the first tensor still to
            // stream (in a BF16 model those after the codes, by dtype) to be made once more:
            // made after the stream, they are made once. (On the benchmark model, whose two
            // weights holding NaN stop its write twice, a W4A16_ASYM save took 10% less CPU
            // time.)
            let first_streamed = layout
                .placed()
                .find(|&(spec, _)| placement(spec) == Placement::Streamed)
                .map(|(_, [begin, _])| begin);
            let copies = match first_streamed {
                Some(begin) if resumed => Copies::AfterFrom(begin),
                _ => Copies::Beside,
            };
            let (streamed, copies) = write_copying_beside(
                &layout,
                out,
                (placement, copies),
                (model, self.files, self.control),
                |spec, out| {
                    streaming = Some(spec);
                    let Entry::Member(index, member) = specs.entries[spec] else {
                        return Ok(());
                    };
                    // The places of the weight's members, which come one after another.
                    let places = &places[spec - usize::from(member)..];
                    if keeping.write_made(index, member, places, out)? {
                        return Ok(());
                    }
                    self.write_member(index, member, out, (&mut keeping, places))
                },
            );
            copies_made = copies;
            streamed
        });
        if let Err(error) = streamed {
            if let (Some(&weight), Some(stopped_in), io::ErrorKind::Interrupted) =
                (self.non_finite_in.get(), streaming, error.kind())
            {
                let writing = Writing {
                    file,
                    kept: keeping.kept,
                    measured: keeping.measured,
                };
                self.leave(Partial {
                    writing,
                    stopped_at: weight as usize,
                    header_len: layout.header_len(),
                    before_stop: before_stop(&layout, stopped_in, placement, copies_made),
                });
            }
            return Err(Error::io(target, error));
        }
        if resumed {
            file.set_len(layout.file_len())?;
        }
        let mut quantized = Vec::new();
        (self.before_read_back)(file.temporary_path());
        let differs = layout.differences(file.reopen()?, target)?.is_some();
        let mut measured = keeping.measured;
        measured.sort_unstable_by_key(|&(index, _)| index);
        let written = file.reopen()?;
        let read_back = self.read_back(&layout, &written, target, &measured, &mut quantized)?;
        Ok(Written {
            quantized,
            bytes: layout.file_len(),
            verified: !differs && read_back,
            staged: vec![file.stage()?],
        })
    }
}

/// The entries of `layout` before `stopped_in`, with their offsets and whether each is made: all
/// but the copies past the first `copies_made`.
fn before_stop<'a>(
    layout: &FileLayout<'a, ShardSpecs<'a>, impl Metadata<'a>>,
    stopped_in: usize,
    placement: impl Fn(usize) -> Placement,
    copies_made: usize,
) -> Vec<(Entry, u64, bool)> {
    let mut copies = 0;
    layout
        .placed()
        .take_while(|&(spec, _)| spec != stopped_in)
        .map(|(spec, [begin, _])| {
            let made = match placement(spec) {
                Placement::Streamed | Placement::InPlace => true,
                Placement::Copied(_) => {
                    copies += 1;
                    copies <= copies_made
                }
            };
            (layout.specs().entries[spec], begin, made)
        })
        .collect()
}

/// The specs of `layout`, a stopped write's file planned again with the weight it stopped at
/// kept, that `partial` left in place: the tensors made that both files place at the same
/// offset in the file. The weight's members taken out move those after them: the header is
/// padded to the length that keeps the most bytes of members in place, which cost a read and
/// their codes to make again (a weight's small members come first in the file, by dtype, and a
/// header 16 bytes longer leaves all the codes made after them where they are), then the most
/// bytes of tensors copied whole, which the kernel copies again at little cost. The length stays
/// a multiple of 8, so that every tensor stays aligned as the reference writer aligns it.
fn in_place<'a>(
    layout: &mut FileLayout<'a, ShardSpecs<'a>, impl Metadata<'a>>,
    partial: &Partial,
) -> FixedBitSet {
    // Bytes made by the stream, then bytes copied, by shift.
    let mut bytes_by_shift: HashMap<i128, [u64; 2]> = HashMap::new();
    for (spec, shift) in made_and_moved(layout, partial) {
        let copied = usize::from(matches!(layout.specs().entries[spec], Entry::Copy(_)));
        bytes_by_shift.entry(shift).or_default()[copied] +=
            layout.specs().byte_len(spec).unwrap_or(0);
    }
    let mut shifts: Vec<(i128, [u64; 2])> = bytes_by_shift.into_iter().collect();
    shifts.sort_unstable_by_key(|&(shift, bytes)| (std::cmp::Reverse(bytes), shift));
    let chosen = shifts.into_iter().map(|(shift, _)| shift).find(|&shift| {
        let header_len = i128::from(partial.header_len) + shift;
        u64::try_from(header_len).is_ok_and(|len| layout.pad_header_to(len))
    });
    let mut in_place = FixedBitSet::with_capacity(layout.specs().entries.len());
    for (spec, shift) in made_and_moved(layout, partial) {
        in_place.set(spec, Some(shift) == chosen);
    }
    in_place
}

/// Each spec of `layout` that `partial` made, with how far its offset in the data moved back
/// from where `partial` has it: both files hold the same entries in the same order from the
/// start but for those of the weight kept, as far as the stopped write went.
fn made_and_moved<'l, 'a>(
    layout: &'l FileLayout<'a, ShardSpecs<'a>, impl Metadata<'a>>,
    partial: &'l Partial,
) -> impl Iterator<Item = (usize, i128)> + 'l {
    let entries = &layout.specs().entries;
    let weight = partial.stopped_at;
    let mut before = partial
        .before_stop
        .iter()
        .filter(move |(entry, ..)| entry.tensor() != weight);
    layout
        .placed()
        .filter(move |&(spec, _)| entries[spec].tensor() != weight)
        .map_while(move |(spec, [begin, _])| {
            let &(entry, was_at, made) = before.next()?;
            let shift = i128::from(was_at) - i128::from(begin);
            (entry == entries[spec]).then_some((spec, made, shift))
        })
        .filter_map(|(spec, made, shift)| made.then_some((spec, shift)))
}

impl Context<'_> {
    /// Leaves what a stopped write made for the next to go on from.
    fn leave(&self, partial: Partial) {
        *self
            .partial
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(partial);
    }

    /// The file of the model's tensors `tensors` to write into `target` as `layout` plans it:
    /// a new one, or the one a stopped write left (see [`Partial`]), `layout`'s header then padded
    /// to leave the most of it in place. With the specs in place, and whether it went on.
    fn start_or_go_on<'a>(
        &self,
        target: &Path,
        layout: &mut FileLayout<'a, ShardSpecs<'a>, impl Metadata<'a>>,
        tensors: std::ops::Range<usize>,
    ) -> Result<(Writing, FixedBitSet, bool)> {
        let stopped = self
            .partial
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(partial) = stopped else {
            let weights = self.choices[tensors]
                .iter()
                .filter(|&&choice| choice == Choice::Quantize)
                .count();
            let writing = Writing {
                file: AtomicFile::create(target)?,
                kept: HashMap::new(),
                // By weight, sized exactly, and sorted once written: a table of half a million
                // weights took twice the room.
                measured: Vec::with_capacity(weights),
            };
            return Ok((writing, FixedBitSet::new(), false));
        };
        let in_place = in_place(layout, &partial);
        let mut writing = partial.writing;
        let entries = &layout.specs().entries;
        // A weight whose codes are neither in place nor kept for later makes them again, and is
        // measured again.
        let made = self.codes_made(entries, &in_place, &writing.kept);
        writing
            .measured
            .retain(|&(index, _)| made.contains(index as usize));
        self.control.bytes_total.store(
            self.control.bytes_done.load(Ordering::Relaxed)
                + self.work_left(entries, &in_place, &made),
            Ordering::Relaxed,
        );
        Ok((writing, in_place, true))
    }

    /// The weights among `entries` whose codes are `in_place` or `kept` for later.
    fn codes_made(
        &self,
        entries: &[Entry],
        in_place: &FixedBitSet,
        kept: &HashMap<(u32, u8), Vec<u8>>,
    ) -> FixedBitSet {
        let mut made = FixedBitSet::with_capacity(self.model.tensors.len());
        for (spec, &entry) in entries.iter().enumerate() {
            if let Entry::Member(index, member) = entry
                && self.member(index as usize, member).role == Role::Codes
                && (in_place.contains(spec) || kept.contains_key(&(index, member)))
            {
                made.insert(index as usize);
            }
        }
        made
    }

    /// The bytes the write of a file of `entries` reads but for those `in_place`: each tensor
    /// copied, each weight whose codes are not `made`, and every weight's read back.
    fn work_left(&self, entries: &[Entry], in_place: &FixedBitSet, made: &FixedBitSet) -> u64 {
        let len = |index: u32| self.model.tensors[index as usize].info.byte_len();
        entries
            .iter()
            .enumerate()
            .map(|(spec, &entry)| match entry {
                Entry::Copy(index) if !in_place.contains(spec) => len(index),
                Entry::Member(index, 0) if made.contains(index as usize) => len(index),
                Entry::Member(index, 0) => 2 * len(index),
                Entry::Copy(_) | Entry::Member(..) => 0,
            })
            .sum()
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

/// What the writing of a file keeps from one member to the next: the members made ahead, kept
/// (and their bytes, in all `kept_bytes`) or written at their places (`ahead`), and each
/// weight's measure.
struct Keeping {
    kept: HashMap<(u32, u8), Vec<u8>>,
    kept_bytes: u64,
    ahead: HashSet<(u32, u8)>,
    measured: Vec<(u32, Measured)>,
}

impl Keeping {
    /// What a write that stopped kept (see [`Partial`]); the members it wrote ahead, at their
    /// places in its own layout, are made again.
    fn new(kept: HashMap<(u32, u8), Vec<u8>>, measured: Vec<(u32, Measured)>) -> Keeping {
        let kept_bytes = kept
            .values()
            .map(|bytes| kept_cost(bytes.len() as u64))
            .sum();
        Keeping {
            kept,
            kept_bytes,
            ahead: HashSet::new(),
            measured,
        }
    }

    /// Writes member `member` of weight `index` (whose members are at `places` in the file) if
    /// the pass that made another made it: its bytes kept, or passed over where that pass wrote
    /// them. Whether it was.
    fn write_made(
        &mut self,
        index: u32,
        member: u8,
        places: &[(u64, u64)],
        out: &mut BufWriter<WriteBehind<'_>>,
    ) -> io::Result<bool> {
        if let Some(bytes) = self.kept.remove(&(index, member)) {
            self.kept_bytes -= kept_cost(bytes.len() as u64);
            out.write_all(&bytes)?;
            return Ok(true);
        }
        if self.ahead.remove(&(index, member)) {
            out.flush()?;
            out.get_mut().skip(places[usize::from(member)].1);
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether member `member` of weight `index` was made by the pass that made another.
    fn made(&self, index: u32, member: u8) -> bool {
        self.kept.contains_key(&(index, member)) || self.ahead.contains(&(index, member))
    }

    /// The members `made` by the pass that made another member of weight `index`, whose
    /// members are at `places` in the file: kept, or sent on to the disk from their places.
    fn take(
        &mut self,
        index: u32,
        made: Vec<(u8, Role, Ahead)>,
        places: &[(u64, u64)],
        file: &File,
    ) {
        for (member, _, ahead) in made {
            match ahead {
                Ahead::Kept(bytes) => {
                    self.kept.insert((index, member), bytes);
                }
                Ahead::At(_) => {
                    // Sent as the stream sends what it writes: left to the stream, the codes of
                    // every weight went at once when it passed over them.
                    let (at, len) = places[usize::from(member)];
                    start_disk_write(file, at, len);
                    self.ahead.insert((index, member));
                }
            }
        }
    }
}

/// A member made ahead of its place in the stream, by the pass that makes another.
enum Ahead {
    /// Its bytes, kept until the stream reaches it.
    Kept(Vec<u8>),
    /// Written straight into its place, from this offset in the file on.
    At(u64),
}

impl Context<'_> {
    /// Writes member `member` of quantized weight `index`, streaming the weight; the other
    /// streamed members it yields that come later in the file are kept for later while they
    /// fit, and written into their places otherwise: made again when the stream reached them,
    /// they had cost a second read of every weight whose codes came after its scales (FP8,
    /// NVFP4) once the room to keep them was full. The pass that makes the codes written
    /// measures them.
    fn write_member(
        &self,
        index: u32,
        member: u8,
        out: &mut BufWriter<WriteBehind<'_>>,
        (keeping, places): (&mut Keeping, &[(u64, u64)]),
    ) -> io::Result<()> {
        let tensor = &self.model.tensors[index as usize];
        let plan = self.plan(index as usize);
        let members = plan.members();
        let wanted = &members[usize::from(member)];
        if wanted.rows_per_row().is_none() {
            return out.write_all(&plan.whole(wanted.role));
        }
        let mut keep = self.made_beside(index, member, &members, (keeping, places));
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
                    let _ = self.non_finite_in.set(index);
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "a weight holds NaN or Inf",
                    ));
                }
                out.write_all(streams.of(role))?;
                for (_, role, ahead) in &mut keep {
                    let bytes = streams.of(*role);
                    match ahead {
                        Ahead::Kept(kept) => kept.extend_from_slice(bytes),
                        Ahead::At(at) => {
                            crate::format::write_all_at(out.get_ref().file(), bytes, *at)?;
                            *at += bytes.len() as u64;
                        }
                    }
                }
                if let Some((sums, within)) = checked {
                    measured.add(&streams, &sums, within);
                }
                streams.give();
                Ok(())
            },
        )?;
        keeping.take(index, keep, places, out.get_ref().file());
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

    /// The streamed members of weight `index` (`members`, at `places` in the file) that the pass
    /// making member `member` makes too: those not yet made that come after it in the file, kept
    /// while they fit in the room for them, written at their places otherwise but after a
    /// watched write's stop.
    fn made_beside(
        &self,
        index: u32,
        member: u8,
        members: &[Member],
        (keeping, places): (&mut Keeping, &[(u64, u64)]),
    ) -> Vec<(u8, Role, Ahead)> {
        let mut made = Vec::new();
        for (m, other) in members.iter().enumerate() {
            let m = u8::try_from(m).unwrap_or(0);
            let streamed = other.rows_per_row().is_some();
            if m == member || !streamed || keeping.made(index, m) {
                continue;
            }
            // One before this member in the file is written already.
            if !self.comes_after(index, member, m) {
                continue;
            }
            let len = other.byte_len();
            let ahead = if keeping.kept_bytes + kept_cost(len) <= self.kept_room {
                keeping.kept_bytes += kept_cost(len);
                Ahead::Kept(Vec::with_capacity(usize::try_from(len).unwrap_or(0)))
            } else if !self.write_ahead {
                // A stop at a weight holding NaN or Inf moves the places of the members after
                // it, and any written there are made again. A watched write writes ahead until
                // its first stop, then makes them when the stream reaches them: the model holds
                // such weights and may stop again. (Written ahead through both of its stops, an
                // FP8_DYNAMIC save of the benchmark model took 20% more CPU time; not written
                // ahead at all, a clean model's FP8_BLOCK save 25% more.)
                continue;
            } else {
                Ahead::At(places[usize::from(m)].0)
            };
            made.push((m, other.role, ahead));
        }
        made
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
        written: &File,
        target: &Path,
        measured: &[(u32, Measured)],
        quantized: &mut Vec<Quantized>,
    ) -> Result<bool> {
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
                    written,
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
    use crate::quantize::tests::{
        a_failed_sharded_save_leaves_nothing_in_place, cut_file, flip_a_byte_of, two_shards,
    };

    #[test]
    fn a_failed_sharded_save_of_each_scheme_leaves_nothing_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let model = two_shards(&dir.path().join("model"));
        for (scheme, member) in [
            (Scheme::W4A16, "b.weight_packed"),
            (Scheme::Fp8Block, "b.weight"),
            (Scheme::Nvfp4A16, "b.weight_packed"),
        ] {
            let options = Options {
                scheme,
                ..Options::default()
            };
            a_failed_sharded_save_leaves_nothing_in_place(member, &|output, hook| {
                quantize_then(
                    &model,
                    output,
                    &options,
                    &Control::default(),
                    (hook, KEPT_BYTES),
                )
            });
        }
    }

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
            (Scheme::Nvfp4A16, "a.weight_packed"),
        ];
        // Members kept for their place, and written there ahead of the stream.
        for ((scheme, altered), room) in cases.into_iter().flat_map(|c| [(c, KEPT_BYTES), (c, 0)]) {
            let options = Options {
                scheme,
                ..Options::default()
            };
            let output = dir.path().join(format!("{scheme}.safetensors"));
            let unaltered = quantize(&model, &output, &options, &Control::default()).unwrap();
            assert!(unaltered.verified, "{scheme}");
            let flip = |path: &Path| flip_a_byte_of(path, altered);
            let error = quantize_then(
                &model,
                &output,
                &options,
                &Control::default(),
                (&flip, room),
            )
            .unwrap_err()
            .to_string();
            assert!(
                error.contains(&format!("`{altered}` read back differs")),
                "{scheme} {room}: {error}"
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

    /// The weights of a model all holding NaN, more than a watched write stops at.
    const DIVERGED: [&str; 6] = [
        "b.weight", "c.weight", "d.weight", "e.weight", "f.weight", "g.weight",
    ];

    /// The header's JSON and the data of a file's bytes.
    fn header_and_data(bytes: &[u8]) -> (serde_json::Value, &[u8]) {
        let (prefix, rest) = bytes.split_at(8);
        let header_len = usize::try_from(u64::from_le_bytes(prefix.try_into().unwrap())).unwrap();
        let (header, data) = rest.split_at(header_len);
        (serde_json::from_slice(header).unwrap(), data)
    }

    /// Models a watched write meets, each with the weights it keeps, the weights read for NaN
    /// and Inf once the write has begun, and whether its save can be verified: values near 1e20,
    /// whose squares `f32` does not hold, are not taken for NaN or Inf; values near 1e200 are,
    /// and are then read and found finite (no scale holds them).
    fn models_to_watch(dir: &Path) -> [(Model, usize, &'static [&'static str], bool); 5] {
        let normal = Fill::Normal {
            mean: 0.0,
            std: 0.02,
        };
        let clean = model_of(
            &dir.join("clean.safetensors"),
            &[
                ("a.weight", 64, normal.clone()),
                ("b.weight", 32, normal.clone()),
            ],
        );
        let huge = model_of(
            &dir.join("huge.safetensors"),
            &[
                ("a.weight", 64, normal.clone()),
                ("h.weight", 16, Fill::Values(vec![1e20, -3e19, 0.5, 2.0])),
            ],
        );
        let beyond_f64 = dir.join("beyond-f64.safetensors");
        SyntheticModel::new(11)
            .tensor("a.weight", Dtype::F32, &[64, 128], normal.clone())
            .tensor(
                "h.weight",
                Dtype::F64,
                &[16, 128],
                Fill::Values(vec![1e200, -3e199, 0.5, 2.0]),
            )
            .write(&beyond_f64)
            .unwrap();
        let beyond_f64 = Model::open(&beyond_f64).unwrap();
        let poisoned = model_of(
            &dir.join("poisoned.safetensors"),
            &[
                ("a.weight", 64, normal.clone()),
                ("b.weight", 32, Fill::Values(vec![0.5, f64::NAN, -1.0])),
                ("c.weight", 16, Fill::Values(vec![f64::INFINITY, 0.25])),
                ("d.weight", 16, normal.clone()),
            ],
        );
        // More weights holding NaN than the write stops at: the last stop reads the others.
        let mut weights = vec![("a.weight", 16, normal)];
        weights.extend(DIVERGED.map(|name| (name, 8, Fill::Values(vec![f64::NAN, 1.0]))));
        let diverged = model_of(&dir.join("diverged.safetensors"), &weights);
        [
            (clean, 0, &[], true),
            (huge, 0, &[], true),
            (beyond_f64, 0, &["h.weight"], false),
            (poisoned, 2, &["b.weight", "c.weight"], true),
            (diverged, 6, &DIVERGED, true),
        ]
    }

    /// Without a first read of the weights, a single file's codes' pass watches for NaN and
    /// Inf: a clean model is written in one go; one holding them (or values whose squares pass
    /// `f32`'s range, which are finite) stops at each, which is read for them, and the write goes
    /// on from there. Either way the file holds the tensors of the one written when every weight
    /// is read first, byte for byte (its header padded longer when the write went on), nothing is
    /// written when such a weight stops everything, and the progress ends full. NVFP4, which
    /// reads every weight first, keeps the same weights and ends its progress full too.
    #[test]
    fn non_finite_weights_found_while_writing() {
        let dir = tempfile::tempdir().unwrap();
        let models = models_to_watch(dir.path());
        let schemes = [
            Scheme::W8A16,
            Scheme::W4A16,
            Scheme::W4A16Asym,
            Scheme::Fp8Dynamic,
            Scheme::Fp8Block,
            Scheme::Nvfp4A16,
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
            for (model, kept, read, verified) in &models {
                let (kept, verified) = (*kept, *verified);
                let (written, [done, total]) = both_ways(model, out.path(), &skip);
                let both = written.unwrap();
                let (watched, read_first) = (
                    header_and_data(&both.watched),
                    header_and_data(&both.read_first),
                );
                assert_eq!(watched.0, read_first.0, "{scheme}");
                assert!(watched.1 == read_first.1, "{scheme}");
                if read.is_empty() {
                    assert!(both.watched == both.read_first, "{scheme}");
                }
                assert_eq!(both.summary.verified, verified, "{scheme}");
                let non_finite = both
                    .summary
                    .choices
                    .iter()
                    .filter(|&&c| c == Choice::Keep(Kept::NonFinite))
                    .count();
                assert_eq!(non_finite, kept, "{scheme}");
                assert_eq!(done, total, "{scheme}: the progress ends full");
                // Each weight quantized read for its codes and read back, each kept copied.
                let writing: u64 = model
                    .tensors
                    .iter()
                    .zip(&both.summary.choices)
                    .map(|(t, &choice)| match choice {
                        Choice::Quantize => 2 * t.info.byte_len(),
                        Choice::Keep(_) => t.info.byte_len(),
                    })
                    .sum();
                let read: u64 = model
                    .tensors
                    .iter()
                    .filter(|t| read.contains(&t.name()))
                    .map(|t| t.info.byte_len())
                    .sum();
                assert!(total >= writing + read, "{scheme}");
            }
            let stopped = tempfile::tempdir().unwrap();
            let (written, _) = both_ways(&models[3].0, stopped.path(), &stop);
            let error = written.unwrap_err().to_string();
            assert!(
                error.contains("`b.weight` holds NaN or Inf"),
                "{scheme}: {error}"
            );
            let left: Vec<_> = std::fs::read_dir(stopped.path()).unwrap().collect();
            assert!(left.is_empty(), "{scheme}: {left:?}");
        }
    }

    /// Members written into their places ahead of the stream, as every later member is once
    /// the room to keep them is full, give the file that members kept give, byte for byte, and
    /// the same summary: also where a weight holding NaN stops the write after some of them
    /// were written, and the next write goes on from it.
    #[test]
    fn members_written_ahead_are_those_kept() {
        let dir = tempfile::tempdir().unwrap();
        let models = models_to_watch(dir.path());
        let schemes = [
            Scheme::W4A16Asym,
            Scheme::Fp8Dynamic,
            Scheme::Fp8Block,
            Scheme::Nvfp4A16,
        ];
        for scheme in schemes {
            let options = Options {
                scheme,
                non_finite: NonFinite::Skip,
                ..Options::default()
            };
            for (number, (model, ..)) in models.iter().enumerate() {
                let folder = dir.path().join(format!("{scheme}-{number}"));
                let (kept, ahead) = (folder.join("kept"), folder.join("ahead"));
                let save = |room: u64, folder: &Path| {
                    let control = Control::default();
                    let output = folder.join("model.safetensors");
                    let summary =
                        quantize_then(model, &output, &options, &control, (&|_| {}, room));
                    let progress = [&control.bytes_done, &control.bytes_total]
                        .map(|count| count.load(Ordering::Relaxed));
                    (summary, output, progress)
                };
                let (kept, kept_file, [kept_done, kept_total]) = save(KEPT_BYTES, &kept);
                assert_eq!(kept_done, kept_total, "{scheme} {number}: KEPT progress");
                let (ahead, ahead_file, [done, total]) = save(0, &ahead);
                let (kept, ahead) = (kept.unwrap(), ahead.unwrap());
                assert_eq!(kept.verified, ahead.verified, "{scheme} {number}");
                assert_eq!(kept.choices, ahead.choices, "{scheme} {number}");
                let errors = |summary: &Summary| {
                    summary
                        .quantized
                        .iter()
                        .map(|q| (q.tensor, format!("{:?}", q.error)))
                        .collect::<Vec<_>>()
                };
                assert_eq!(errors(&kept), errors(&ahead), "{scheme} {number}");
                assert!(
                    std::fs::read(&kept_file).unwrap() == std::fs::read(&ahead_file).unwrap(),
                    "{scheme} {number}"
                );
                assert_eq!(done, total, "{scheme} {number}: the progress ends full");
            }
        }
    }
}
