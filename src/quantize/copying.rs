//! Tensors copied whole into a file beside the stream that writes the rest: a thread of their
//! own writes them at their places while the stream skips over them.

use super::{CHUNK, Control};
use crate::format::writer::{FileLayout, Metadata, Specs, WriteBehind, start_disk_write};
use crate::format::{Model, Tensor, copy_range_at, read_exact_at, write_all_at};
use crate::text::escape;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Where the bytes of a tensor of a file being written come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// Made by the stream that writes the file in order.
    Streamed,
    /// Copied whole from the model's tensor of this index, beside the stream.
    Copied(usize),
    /// In the file already, where an earlier write that stopped part of the way left it.
    InPlace,
}

/// When the copies of a write are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Copies {
    /// By a thread of their own while the stream moves on past them.
    Beside,
    /// Those placed from this offset in the data on once the stream has written the rest, the
    /// others beside it.
    AfterFrom(u64),
}

/// Writes `layout` into `out`, each tensor as `placement` says: those streamed by
/// `write_tensor`, those copied as `copies` says, those in place not at all. Written in the
/// file's order, the copies (most often at its end) kept one thread busy while the others had
/// nothing left to do. Comes back with how many of the copies, in the file's order, were made:
/// all of them unless the write failed.
pub(super) fn write_copying_beside<'a, S: Specs + ?Sized, M: Metadata<'a>>(
    layout: &FileLayout<'a, S, M>,
    out: &mut BufWriter<WriteBehind<'_>>,
    (placement, copies): (impl Fn(usize) -> Placement, Copies),
    (model, files, control): (&Model, &[File], &Control),
    mut write_tensor: impl FnMut(usize, &mut BufWriter<WriteBehind<'_>>) -> io::Result<()>,
) -> (io::Result<()>, usize) {
    crate::format::writer::allocate(out.get_ref().file(), layout.file_len());
    let data_start = crate::format::LENGTH_PREFIX + layout.header_len();
    let places: Vec<(usize, u64)> = layout
        .placed()
        .filter_map(|(spec, [begin, _])| match placement(spec) {
            Placement::Copied(index) => Some((index, data_start + begin)),
            Placement::Streamed | Placement::InPlace => None,
        })
        .collect();
    let specs = layout.specs();
    let stop = AtomicBool::new(false);
    let mut stream = |out: &mut BufWriter<WriteBehind<'_>>| {
        layout.write(out, |spec, out| {
            if stop.load(Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "stopped"));
            }
            if placement(spec) == Placement::Streamed {
                return write_tensor(spec, out);
            }
            out.flush()?;
            out.get_mut().skip(specs.byte_len(spec).unwrap_or(0));
            Ok(())
        })
    };
    let file = out.get_ref().file();
    let split = match copies {
        Copies::Beside => places.len(),
        Copies::AfterFrom(cut) => places.partition_point(|&(_, at)| at < data_start + cut),
    };
    let (beside, after) = places.split_at(split);
    let (written, made_beside) = if beside.is_empty() {
        (stream(out), 0)
    } else {
        std::thread::scope(|scope| {
            let copying =
                scope.spawn(|| copy_into_places(model, files, beside, file, control, &stop));
            let streamed = stream(out);
            if streamed.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            let (copied_all, copies_made) = copying
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            // Whichever side failed first stopped the other, which then has no error of its own.
            (copied_all.and(streamed), copies_made)
        })
    };
    if written.is_err() || after.is_empty() {
        return (written, made_beside);
    }
    let (copied_all, made_after) = copy_into_places(model, files, after, file, control, &stop);
    (copied_all, made_beside + made_after)
}

/// Copies each `(tensor, offset)` of `places` (in the file's order) into `out` at its offset,
/// tensors whose bytes lie back to back in their source, as their places do, in one run (a model
/// of half a million tiny tensors made as many reads and writes otherwise). Stops early, with no
/// error, once `stop` is set; sets it when it fails. Comes back with how many of `places` it
/// copied.
fn copy_into_places(
    model: &Model,
    files: &[File],
    places: &[(usize, u64)],
    out: &File,
    control: &Control,
    stop: &AtomicBool,
) -> (io::Result<()>, usize) {
    let mut through = Copier::new();
    let mut first = 0;
    let copied = loop {
        let Some(&(index, at)) = places.get(first) else {
            break Ok(());
        };
        let shard = model.tensors[index].shard;
        let (start, mut len) = model.file_range(&model.tensors[index]);
        let mut end = first + 1;
        while let Some(&(next, next_at)) = places.get(end) {
            let (next_start, next_len) = model.file_range(&model.tensors[next]);
            if model.tensors[next].shard != shard
                || next_start != start + len
                || next_at != at + len
            {
                break;
            }
            len += next_len;
            end += 1;
        }
        let span = &places[first..end];
        let result = copy_span(
            &files[shard],
            (start, len),
            out,
            at,
            control,
            stop,
            &mut through,
        )
        .map_err(|(failed_at, error)| {
            // The tensor the failed read was in.
            let failed = span
                .iter()
                .map(|&(index, _)| &model.tensors[index])
                .rfind(|t| model.file_range(t).0 <= failed_at)
                .unwrap_or(&model.tensors[index]);
            with_tensor_named(model, failed, error)
        });
        if let Err(error) = result {
            break Err(error);
        }
        first = end;
    };
    let result = match copied {
        Err(_) if stop.load(Ordering::Relaxed) => Ok(()),
        Err(error) => {
            stop.store(true, Ordering::Relaxed);
            Err(error)
        }
        Ok(()) => Ok(()),
    };
    (result, first)
}

/// Copies `len` bytes of `source` from `start` into `out` at `at`, a run at a time; an error
/// comes with the offset in `source` of the run it stopped at.
fn copy_span(
    source: &File,
    (start, len): (u64, u64),
    out: &File,
    at: u64,
    control: &Control,
    stop: &AtomicBool,
    copier: &mut Copier,
) -> Result<(), (u64, io::Error)> {
    let mut done = 0;
    while done < len {
        let mut copy_run = || -> io::Result<usize> {
            control.check()?;
            if stop.load(Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "stopped"));
            }
            let count = usize::try_from((len - done).min(CHUNK)).map_err(io::Error::other)?;
            let run = copier.copy(source, start + done, out, at + done, count)?;
            if run >= 1 << 20 {
                start_disk_write(out, at + done, run as u64);
            }
            Ok(run)
        };
        let count = copy_run().map_err(|error| (start + done, error))?;
        done += count as u64;
        control
            .bytes_done
            .fetch_add(count as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Copies runs of bytes from file to file inside the kernel while the system allows it, and
/// through a buffer of its own once it does not. (Copying 262 MB of a model's embeddings took
/// 0.08 processor seconds inside the kernel, and from as much to seven times that through a
/// buffer, as writing into the page cache ran.)
struct Copier {
    in_kernel: bool,
    buffer: Vec<u8>,
}

impl Copier {
    fn new() -> Self {
        Copier {
            in_kernel: true,
            buffer: Vec::new(),
        }
    }

    /// Copies up to `count` bytes of `source` from `start` into `out` at `at`: how many it
    /// copied, at least one where `count` is not zero.
    fn copy(
        &mut self,
        source: &File,
        start: u64,
        out: &File,
        at: u64,
        count: usize,
    ) -> io::Result<usize> {
        if self.in_kernel {
            match copy_range_at(source, start, out, at, count) {
                Err(error) if error.kind() == io::ErrorKind::Unsupported => self.in_kernel = false,
                copied => return copied,
            }
        }
        self.buffer.resize(count, 0);
        read_exact_at(source, &mut self.buffer, start)?;
        write_all_at(out, &self.buffer, at)?;
        Ok(count)
    }
}

/// `error` in copying `tensor`, said with the tensor's name and source file (a cancellation
/// or a stop as it is: not the copy's own failure).
fn with_tensor_named(model: &Model, tensor: &Tensor, error: io::Error) -> io::Error {
    if error.kind() == io::ErrorKind::Interrupted {
        return error;
    }
    let source = model.shard_of(tensor).path.display().to_string();
    io::Error::new(
        error.kind(),
        format!(
            "copying `{}` from {}: {error}",
            escape(tensor.name()),
            escape(&source)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source_bytes(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i * 7 + i / 251).to_le_bytes()[0])
            .collect()
    }

    /// Copies `len` bytes from `start` of a file of `source_len` bytes into a fresh file at
    /// `at`, in the kernel or through the buffer: the copied file, or the error.
    fn copied(
        in_kernel: bool,
        source_len: usize,
        start: u64,
        at: u64,
        len: usize,
    ) -> io::Result<Vec<u8>> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("source"), source_bytes(source_len)).unwrap();
        let source = File::open(dir.path().join("source")).unwrap();
        let out = File::create(dir.path().join("out")).unwrap();
        let mut copier = Copier {
            in_kernel,
            buffer: Vec::new(),
        };
        let mut done = 0;
        while done < len {
            done += copier.copy(
                &source,
                start + done as u64,
                &out,
                at + done as u64,
                len - done,
            )?;
        }
        drop(out);
        Ok(std::fs::read(dir.path().join("out")).unwrap())
    }

    #[test]
    fn copies_in_the_kernel_and_through_a_buffer_alike() {
        let source = source_bytes(300_000);
        for in_kernel in [true, false] {
            let out = copied(in_kernel, source.len(), 1_234, 5_000, 250_000).unwrap();
            assert_eq!(out.len(), 255_000, "{in_kernel}");
            assert!(out[..5_000].iter().all(|&b| b == 0), "{in_kernel}");
            assert_eq!(out[5_000..], source[1_234..251_234], "{in_kernel}");
        }
    }

    #[test]
    fn a_source_that_ends_first_is_an_early_end_either_way() {
        for in_kernel in [true, false] {
            let error = copied(in_kernel, 10_000, 4_000, 0, 8_000).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{in_kernel}");
        }
    }
}
