//! The writer of every scheme but W8A8: a first pass for each weight's largest magnitude (and
//! NaN or Inf), then each output file written in the reference layout, each member of a quantized
//! weight streamed a run of rows at a time from its source, then every weight read back from the
//! file written, dequantized and compared with its source.
//!
//! The members of a weight are placed apart in the file (by dtype rank, then name), so each is
//! streamed when the writer reaches it: the small members (scales, zero points) worked out while
//! streaming a weight's codes are kept for later when they fit in [`KEPT_BYTES`], and worked out
//! again otherwise, so that memory does not grow with the model.

use super::scheme::{ErrorSums, Member, Plan, Role, Streams};
use super::{
    Choice, Control, Kept, NonFinite, Options, Quantized, Summary, Writer, Written, copy_tensor,
    map_rows_aligned, output_metadata, prepare, tensor_absmax,
};
use crate::error::{Error, Result};
use crate::format::writer::{FileLayout, Metadata, Name, Specs, write_atomically};
use crate::format::{Dtype, Model, Shape, Tensor, read_exact_at};
use crate::recycle::Recycled;
use crate::text::escape;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::Ordering;

/// Buffers of the members read back, handed from one run of rows to the next.
static READ_BACK: Recycled<Vec<u8>> = Recycled::new();

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
    let (sharded, targets, files) = prepare(model, output)?;
    let mut choices = super::choose_all(model, &files, options, control, |t| fits(t, options))?;
    let total: u64 = model
        .tensors
        .iter()
        .zip(&choices)
        .map(|(t, c)| match c {
            Choice::Quantize => 4 * t.info.byte_len(),
            Choice::Keep(_) => t.info.byte_len(),
        })
        .sum();
    control.bytes_total.fetch_add(total, Ordering::Relaxed);
    let mut absmax = vec![0.0; model.tensors.len()];
    for (index, tensor) in model.tensors.iter().enumerate() {
        if choices[index] != Choice::Quantize {
            continue;
        }
        match tensor_absmax(model, &files, tensor, false, control)
            .map_err(|e| Error::io(&model.shard_of(tensor).path, e))?
        {
            Some((largest, _)) => absmax[index] = largest,
            None if options.non_finite == NonFinite::Skip => {
                choices[index] = Choice::Keep(Kept::NonFinite);
            }
            None => {
                return Err(Error::Invalid(format!(
                    "`{}` holds NaN or Inf; quantizing it would spread them (skip such tensors to go on)",
                    escape(tensor.name())
                )));
            }
        }
    }
    super::ready_folder(&targets)?;
    let ignore = super::ignored_modules(model, &choices);
    let config = super::quantization_config(options, &ignore).to_string();
    let context = Context {
        model,
        files: &files,
        choices: &choices,
        absmax: &absmax,
        options,
        config: &config,
        control,
    };
    let written = super::write_outputs(
        model,
        output,
        (sharded, &targets),
        &ignore,
        options,
        &context,
    )?;
    Ok(written.summary(model, targets, options, choices))
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
        let mut entries = Vec::new();
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
        write_atomically(target, |out| {
            layout.write(out, |spec, out| match specs.entries[spec] {
                Entry::Copy(index) => copy_tensor(
                    model,
                    self.files,
                    &model.tensors[index as usize],
                    out,
                    self.control,
                ),
                Entry::Member(index, member) => {
                    if let Some(bytes) = kept.remove(&(index, member)) {
                        kept_bytes -= bytes.len() as u64;
                        return out.write_all(&bytes);
                    }
                    self.write_member(index, member, out, &mut kept, &mut kept_bytes)
                }
            })
        })?;
        let mut quantized = Vec::new();
        let differs = layout.differences(target)?.is_some();
        let read_back = self.read_back(&layout, target, &mut quantized)?;
        Ok(Written {
            quantized,
            bytes: layout.file_len(),
            verified: !differs && read_back,
        })
    }
}

impl Context<'_> {
    /// Writes member `member` of quantized weight `index`, streaming the weight; the other
    /// streamed members it yields are kept for later while they fit.
    fn write_member(
        &self,
        index: u32,
        member: u8,
        out: &mut (impl Write + Send),
        kept: &mut HashMap<(u32, u8), Vec<u8>>,
        kept_bytes: &mut u64,
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
            if m == member || !streamed || kept.contains_key(&(index, m)) {
                continue;
            }
            let len = other.byte_len();
            // Written already when it comes before this member in the file.
            if *kept_bytes + len <= KEPT_BYTES && self.comes_after(index, member, m) {
                *kept_bytes += len;
                keep.push((
                    m,
                    other.role,
                    Vec::with_capacity(usize::try_from(len).unwrap_or(0)),
                ));
            }
        }
        let role = wanted.role;
        let scales_alone = keep.is_empty() && matches!(role, Role::Scales { .. });
        map_rows_aligned(
            self.model,
            self.files,
            tensor,
            plan.row_multiple(),
            self.control,
            |_, values: &[f32]| {
                let mut streams = Streams::default();
                if scales_alone {
                    plan.quantize_scales(values, &mut streams);
                } else {
                    plan.quantize(values, &mut streams);
                }
                Ok(streams)
            },
            |streams| {
                out.write_all(streams.of(role))?;
                for (_, role, bytes) in &mut keep {
                    bytes.extend_from_slice(streams.of(*role));
                }
                Ok(())
            },
        )?;
        for (m, _, bytes) in keep {
            kept.insert((index, m), bytes);
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

    /// Reads every quantized weight of a written file back, dequantizes it and compares it with
    /// its source: whether each is within half a step everywhere; the error of each, as written,
    /// goes to `quantized`.
    fn read_back<'a>(
        &self,
        layout: &FileLayout<'a, ShardSpecs<'a>, impl Metadata<'a>>,
        target: &Path,
        quantized: &mut Vec<Quantized>,
    ) -> Result<bool> {
        let written = crate::paths::open_file(target).map_err(|e| Error::io(target, e))?;
        let data_start = crate::format::LENGTH_PREFIX + layout.header_len();
        let specs = layout.specs();
        let mut begins = vec![0u64; specs.count()];
        for (spec, [begin, _]) in layout.placed() {
            begins[spec] = data_start + begin;
        }
        let mut all_within = true;
        for (spec, entry) in specs.entries.iter().enumerate() {
            let Entry::Member(index, 0) = *entry else {
                continue;
            };
            let tensor = &self.model.tensors[index as usize];
            let mut plan = self.plan(index as usize);
            let members = plan.members();
            let at = |role: Role| {
                members
                    .iter()
                    .position(|m| m.role == role)
                    .map(|m| (&members[m], begins[spec + m]))
            };
            if let Some((_, begin)) = at(Role::GlobalScale) {
                let mut bytes = [0u8; 4];
                read_exact_at(&written, &mut bytes, begin).map_err(|e| Error::io(target, e))?;
                plan.global_scale = f32::from_le_bytes(bytes);
            }
            let streamed: Vec<(&Member, u64)> = members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.rows_per_row().is_some())
                .map(|(m, member)| (member, begins[spec + m]))
                .collect();
            let mut sums = ErrorSums::default();
            let mut within = true;
            map_rows_aligned(
                self.model,
                self.files,
                tensor,
                plan.row_multiple(),
                self.control,
                |first_row, values: &[f32]| {
                    let columns = usize::try_from(plan.columns).unwrap_or(1).max(1);
                    let rows = (values.len() / columns) as u64;
                    let first_row = first_row as u64;
                    let mut streams = Streams::default();
                    for &(member, begin) in &streamed {
                        let per = member.rows_per_row().unwrap_or(1);
                        let member_rows = member.shape.get(0).unwrap_or(1);
                        let first = first_row / per;
                        let count = (first_row + rows).div_ceil(per).min(member_rows) - first;
                        let mut bytes = READ_BACK.take();
                        // Read over in full: resized, not cleared, so that the room a buffer
                        // handed on has is not zeroed again.
                        bytes.resize(
                            usize::try_from(count * member.row_bytes())
                                .map_err(io::Error::other)?,
                            0,
                        );
                        read_exact_at(&written, &mut bytes, begin + first * member.row_bytes())?;
                        if let Some(stream) = streams.of_mut(member.role) {
                            *stream = bytes;
                        }
                    }
                    let checked = plan.check(values, &streams);
                    for stream in [streams.codes, streams.scales, streams.zero_points] {
                        if stream.capacity() > 0 {
                            READ_BACK.give(stream);
                        }
                    }
                    Ok(checked)
                },
                |(chunk, ok)| {
                    sums.merge(&chunk);
                    within &= ok;
                    Ok(())
                },
            )
            .map_err(|e| Error::io(&self.model.shard_of(tensor).path, e))?;
            all_within &= within;
            quantized.push(Quantized {
                tensor: index as usize,
                error: super::finish(&sums),
            });
        }
        Ok(all_within)
    }
}

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
