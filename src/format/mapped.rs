//! Reading tensor data: a chunk copied with a positional read into a buffer its thread keeps,
//! larger ranges through short-lived memory maps that survive the file shrinking under them.
//!
//! A chunk of up to [`COPIED`] bytes (a scan's, a quantizer's run) is copied: on the machine
//! measured last, a positional read into a buffer kept from read to read reads the page cache
//! twice as fast as a fresh map, whose page faults and unmapping cost more than the copy (it was
//! the other way round on the machine measured first; BENCHMARKS.md has both). A short read
//! reports a file that ends first.
//!
//! Larger ranges (a whole tensor's bytes), and headers read through [`with_mapped_pages`], which
//! hands their pages back as they are parsed, are mapped, which needs no buffer of their size.
//! But touching a mapped page that the file no longer has (a trainer truncating and
//! rewriting a checkpoint in place) raises SIGBUS, which kills a process by default. So each
//! map registers its address range; a SIGBUS handler that finds the faulting address in a
//! registered range maps a zero page over the faulting page, marks the range, and returns, and
//! the read then reports `UnexpectedEof` instead of its result. A fault anywhere else goes to the
//! handler that was there before (the standard library's, which reports stack overflows).
//!
//! Maps live only while they are read, so the registry holds one range per reading thread. If
//! ever it is full, or the file cannot be mapped, the read falls back to a positional read.

use std::fs::File;
use std::io;
use std::ops::Range;

/// Runs `work` on `len` bytes of `file` from `offset`. A file that ends first gives
/// `UnexpectedEof`, also when a mapped range shrinks while `work` runs (the missing pages then
/// read as zeros, and `work`'s result is dropped).
pub fn with_mapped<T>(
    file: &File,
    offset: u64,
    len: usize,
    work: impl FnOnce(&[u8]) -> T,
) -> io::Result<T> {
    if len <= COPIED {
        return with_copied(file, offset, len, |pages| work(pages.bytes()));
    }
    with_mapped_pages(file, offset, len, |pages| work(pages.bytes()))
}

/// Like [`with_mapped`], for `work` that reads the bytes once from start to end and can hand
/// back the pages it has passed (see [`Pages`]).
pub fn with_mapped_pages<T>(
    file: &File,
    offset: u64,
    len: usize,
    work: impl FnOnce(Pages<'_>) -> T,
) -> io::Result<T> {
    let end = offset
        .checked_add(len as u64)
        .ok_or(io::ErrorKind::InvalidInput)?;
    if len <= SMALL {
        // A map costs two system calls and a TLB flush on every core: more than copying this.
        return with_copied(file, offset, len, work);
    }
    // A map of pages past the end would read them as zeros (through the handler) first.
    if file.metadata()?.len() < end {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    #[cfg(unix)]
    let work = match guarded::with_map(file, offset, len, work) {
        Ok(result) => return result,
        Err(unused) => unused,
    };
    let mut buffer = vec![0u8; len];
    super::read_exact_at(file, &mut buffer, offset)?;
    Ok(work(Pages::of(&buffer)))
}

/// Bytes of a file, and for a large map the means to hand its pages back.
///
/// Pages of a map count in the process's memory while they are mapped in, so a parser that
/// walks 100 MB of header would hold all of it next to what it builds from it. Handing back
/// the pages it has passed frees that memory; reading them again reads the file again. Only
/// maps of more than [`RELEASABLE`] bytes hand pages back; for other bytes [`Pages::release`]
/// does nothing.
#[derive(Clone, Copy, Debug)]
pub struct Pages<'a> {
    bytes: &'a [u8],
    #[cfg(unix)]
    map: Option<&'a memmap2::Mmap>,
}

/// Maps of more than this many bytes can hand their pages back.
pub const RELEASABLE: usize = 16 << 20;

impl<'a> Pages<'a> {
    /// Bytes held in memory: nothing to hand back.
    pub fn of(bytes: &'a [u8]) -> Pages<'a> {
        Pages {
            bytes,
            #[cfg(unix)]
            map: None,
        }
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Whether [`Pages::release`] frees memory.
    pub fn releasable(&self) -> bool {
        #[cfg(unix)]
        return self.map.is_some();
        #[cfg(not(unix))]
        false
    }

    /// Hands back the pages holding `range` (and the rest of the pages its ends fall in).
    pub fn release(&self, range: Range<usize>) {
        #[cfg(unix)]
        if let Some(map) = self.map {
            guarded::release(map, range);
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}

/// A reader's place in [`Pages`] it reads once from start to end, handing back what it has passed
/// a step at a time.
#[derive(Debug)]
pub struct Passing<'a> {
    pages: Pages<'a>,
    released: usize,
}

impl<'a> Passing<'a> {
    /// Bytes passed before their pages are handed back: a system call per step.
    const STEP: usize = 4 << 20;

    pub fn new(pages: Pages<'a>) -> Passing<'a> {
        Passing { pages, released: 0 }
    }

    /// The reader is done with every byte before `at`.
    pub fn reached(&mut self, at: usize) {
        // The page `at` is in goes too, and is mapped in again when read on: once a step.
        if at >= self.released + Self::STEP && self.pages.releasable() {
            self.pages.release(self.released..at);
            self.released = at;
        }
    }
}

/// Reads through [`with_mapped_pages`] of up to this many bytes are copied (see [`with_copied`])
/// instead of mapped.
const SMALL: usize = 16 << 10;

/// Reads of tensor data up to this many bytes ([`with_mapped`]) are copied into the buffer
/// their thread keeps instead of mapped.
pub const COPIED: usize = 16 << 20;

thread_local! {
    /// The buffer each thread copies its reads into, kept from read to read: a fresh one would
    /// be fresh memory, a page fault every 4 KiB. At most [`COPIED`] bytes.
    static COPY: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `work` on a copy of `len` bytes (at most [`COPIED`]) of `file` from `offset`, in the
/// buffer the thread keeps. A file that ends first gives `UnexpectedEof` (a short read).
pub fn with_copied<T>(
    file: &File,
    offset: u64,
    len: usize,
    work: impl FnOnce(Pages<'_>) -> T,
) -> io::Result<T> {
    // Taken, so that a read within `work` finds no buffer and makes its own.
    let mut buffer = COPY.take();
    if buffer.len() < len {
        buffer.resize(len, 0);
    }
    let bytes = &mut buffer[..len];
    let result = super::read_exact_at(file, bytes, offset).map(|()| work(Pages::of(bytes)));
    COPY.set(buffer);
    result
}

#[cfg(unix)]
#[expect(
    unsafe_code,
    reason = "mapping a file, and a signal handler that replaces the pages a shrunken file no longer backs"
)]
mod guarded {
    use std::fs::File;
    use std::io;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Once, OnceLock};

    /// Ranges registered at once; more concurrent reads fall back to positional reads.
    const SLOTS: usize = 256;

    struct Slot {
        taken: AtomicBool,
        /// The mapped range, `start == 0` while the slot holds none.
        start: AtomicUsize,
        end: AtomicUsize,
        faulted: AtomicBool,
    }

    #[expect(
        clippy::declare_interior_mutable_const,
        reason = "the initializer of the registry's array, each slot a fresh value"
    )]
    const EMPTY: Slot = Slot {
        taken: AtomicBool::new(false),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        faulted: AtomicBool::new(false),
    };

    static SLOT_TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
    static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);
    static INSTALL: Once = Once::new();
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    /// The SIGBUS action before ours, for faults outside every registered range.
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

    /// Maps `len` bytes from `offset` and runs `work` on them; `work` handed back unused when
    /// the file cannot be mapped, the registry is full or the handler could not be installed
    /// (the caller then reads another way).
    pub fn with_map<T, F: FnOnce(super::Pages<'_>) -> T>(
        file: &File,
        offset: u64,
        len: usize,
        work: F,
    ) -> Result<io::Result<T>, F> {
        INSTALL.call_once(install);
        if !INSTALLED.load(Ordering::Acquire) {
            return Err(work);
        }
        // SAFETY: the map is read-only and private; if the file changes under it, the bytes
        // `work` sees may change or (past a new end) become zeros through the handler, which
        // is what `faulted` reports. They are plain bytes, valid in any state.
        let releasable = len > super::RELEASABLE;
        // Not populated up front: faulted in as read, while the other threads' maps come and
        // go (populating holds the map lock through the whole range: the BF16 `stats` scan was
        // 14% slower with it, the dequantized ones 4-6%).
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map(file)
        };
        // A file system that cannot map files (some network and FUSE ones) is read another way.
        let Ok(map) = map else {
            return Err(work);
        };
        // Taken after the map, so given back (on a panic too) before the map goes.
        let Some(mut slot) = Taken::any() else {
            return Err(work);
        };
        let pages = super::Pages {
            bytes: &map,
            map: releasable.then_some(&map),
        };
        let value = slot.watch(pages, work);
        Ok(if slot.faulted() {
            Err(io::Error::from(io::ErrorKind::UnexpectedEof))
        } else {
            Ok(value)
        })
    }

    /// A slot taken for one read; given back when dropped, also when `work` panics.
    struct Taken(&'static Slot);

    impl Taken {
        fn any() -> Option<Taken> {
            SLOT_TABLE
                .iter()
                .find(|slot| {
                    slot.taken
                        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                })
                .map(Taken)
        }

        /// Runs `work` on `pages` with their range registered for the handler.
        fn watch<T>(
            &mut self,
            pages: super::Pages<'_>,
            work: impl FnOnce(super::Pages<'_>) -> T,
        ) -> T {
            let start = pages.bytes.as_ptr() as usize;
            self.0.faulted.store(false, Ordering::Relaxed);
            self.0
                .end
                .store(start + pages.bytes.len(), Ordering::Relaxed);
            self.0.start.store(start, Ordering::Release);
            let value = work(pages);
            self.0.start.store(0, Ordering::Release);
            value
        }

        fn faulted(&self) -> bool {
            self.0.faulted.load(Ordering::Acquire)
        }
    }

    impl Drop for Taken {
        fn drop(&mut self) {
            self.0.start.store(0, Ordering::Release);
            self.0.taken.store(false, Ordering::Release);
        }
    }

    /// Drops the pages of `range` from `map`: the next read of them maps them in again from the
    /// page cache (or, past a new end of the file, faults as any read there does).
    pub fn release(map: &memmap2::Mmap, range: std::ops::Range<usize>) {
        let Some(len) = range.end.checked_sub(range.start).filter(|&len| len > 0) else {
            return;
        };
        // SAFETY: the map is a read-only map of a file, never written through, so dropping its
        // pages loses nothing: they read the same bytes from the file when touched again.
        // Failing only keeps the pages, so the error is of no consequence.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, range.start, len)
        };
    }

    fn install() {
        // SAFETY: plain libc calls with valid arguments; PREVIOUS is set before the handler that
        // reads it is installed.
        unsafe {
            if let Ok(page) = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE))
                && page.is_power_of_two()
            {
                PAGE_SIZE.store(page, Ordering::Relaxed);
            }
            let mut previous: libc::sigaction = std::mem::zeroed();
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&raw mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &raw mut previous) != 0 {
                return;
            }
            let _ = PREVIOUS.set(previous);
            if libc::sigaction(libc::SIGBUS, &raw const action, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    }

    extern "C" fn on_sigbus(
        signal: libc::c_int,
        info: *mut libc::siginfo_t,
        context: *mut libc::c_void,
    ) {
        // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler; everything done
        // here (atomics, mmap, sigaction) is safe in a signal handler.
        unsafe {
            let address = (*info).si_addr() as usize;
            for slot in &SLOT_TABLE {
                let start = slot.start.load(Ordering::Acquire);
                if start == 0 || address < start || address >= slot.end.load(Ordering::Relaxed) {
                    continue;
                }
                let page_size = PAGE_SIZE.load(Ordering::Relaxed);
                let page = address & !(page_size - 1);
                let zeros = libc::mmap(
                    page as *mut libc::c_void,
                    page_size,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
                if zeros != libc::MAP_FAILED {
                    slot.faulted.store(true, Ordering::Release);
                    return;
                }
            }
            forward(signal, info, context);
        }
    }

    /// Hands a fault that is not ours to the action that was there before.
    unsafe fn forward(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
        // SAFETY: PREVIOUS holds the action the kernel gave back; its handler has the type its
        // flags say.
        unsafe {
            let previous = PREVIOUS.get();
            let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
            if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
                // Back to the default action; returning re-runs the access, which then kills the
                // process as an unhandled SIGBUS does.
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &raw const default, std::ptr::null_mut());
            } else if previous.is_some_and(|p| p.sa_flags & libc::SA_SIGINFO != 0) {
                let previous: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(handler);
                previous(signal, info, context);
            } else {
                let previous: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                previous(signal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(bytes).unwrap();
        let reader = File::open(file.path()).unwrap();
        (file, reader)
    }

    #[test]
    fn reads_the_bytes_at_any_offset() {
        let bytes: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        let (_keep, file) = file_of(&bytes);
        for (offset, len) in [
            (0, 50_000),
            (1, 7),
            (4095, 2),
            (4097, 20_000),
            (49_999, 1),
            (50_000, 0),
        ] {
            let got = with_mapped(&file, offset, len, <[u8]>::to_vec).unwrap();
            let start = usize::try_from(offset).unwrap();
            assert_eq!(got, bytes[start..start + len]);
        }
    }

    #[test]
    fn pages_handed_back_read_the_same_again() {
        let len = RELEASABLE + 4096 * 3 + 5;
        let bytes: Vec<u8> = (0..len).map(|i| u8::try_from(i % 253).unwrap()).collect();
        let (_keep, file) = file_of(&bytes);
        with_mapped_pages(&file, 3, len - 3, |pages| {
            assert!(pages.releasable());
            let mut passing = Passing::new(pages);
            for at in (0..pages.bytes().len()).step_by(1 << 20) {
                passing.reached(at);
            }
            pages.release(0..pages.bytes().len());
            assert_eq!(pages.bytes(), &bytes[3..]);
        })
        .unwrap();
        with_mapped_pages(&file, 0, RELEASABLE, |pages| assert!(!pages.releasable())).unwrap();
    }

    #[test]
    fn a_range_past_the_end_is_an_eof_error() {
        let (_keep, file) = file_of(&[1, 2, 3]);
        let error = with_mapped(&file, 2, 2, |_| ()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert!(with_mapped(&file, u64::MAX, 2, |_| ()).is_err());
        // Copied, then mapped.
        let bytes = vec![5u8; COPIED + 8192];
        let (_keep, file) = file_of(&bytes);
        for (offset, len) in [(COPIED as u64, SMALL * 2), (8192, COPIED + 4096)] {
            let error = with_mapped(&file, offset, len, |_| ()).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "{len}");
        }
    }

    /// A chunk copied into the thread's buffer, read again from within the work on the first
    /// (which then gets a buffer of its own), and the buffer kept from read to read.
    #[test]
    fn chunks_copied_into_the_threads_buffer_are_the_bytes() {
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
        let (_keep, file) = file_of(&bytes);
        let (outer, inner) = with_mapped(&file, 10, 2_000_000, |outer| {
            let inner = with_mapped(&file, 1_000_000, 1_500_000, <[u8]>::to_vec).unwrap();
            (outer.to_vec(), inner)
        })
        .unwrap();
        assert_eq!(outer, bytes[10..2_000_010]);
        assert_eq!(inner, bytes[1_000_000..2_500_000]);
        let again = with_mapped(&file, 0, 100_000, <[u8]>::to_vec).unwrap();
        assert_eq!(again, bytes[..100_000]);
        assert!(COPY.take().len() >= 2_000_000);
    }

    #[test]
    fn a_file_that_shrinks_during_the_read_gives_an_eof_error_not_a_crash() {
        // Larger than a copied chunk: mapped.
        let len = COPIED + 4096;
        let (keep, file) = file_of(&vec![7u8; len]);
        let result = with_mapped(&file, 0, len, |bytes| {
            keep.as_file().set_len(4096).unwrap();
            // Pages past the new end now read as zeros, through the handler.
            bytes.iter().map(|&b| u64::from(b)).sum::<u64>()
        });
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        // The next read of what is left works.
        assert_eq!(with_mapped(&file, 0, 4096, |b| b[4095]).unwrap(), 7);
    }
}
