use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;
use stui::cli::{Cli, ColorMode};

fn main() -> ExitCode {
    return_large_frees_to_the_system();
    let cli = Cli::parse();
    if cli.command.is_none()
        && let Some(path) = &cli.path
        && (cli.tui || std::io::stdout().is_terminal())
    {
        let color = match cli.color {
            ColorMode::Always => true,
            ColorMode::Never => false,
            ColorMode::Auto => std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        };
        let options = stui::tui::Options {
            color,
            log: cli.log.clone(),
            diff: cli.diff.clone(),
            fetch_limit: cli.fetch_limit.0,
            raw: cli.raw,
        };
        return match stui::tui::run(path, &options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("stui: {error:#}");
                ExitCode::from(2)
            }
        };
    }
    // Without a terminal, `stui PATH` prints the report that `stui inspect PATH` (or, with
    // --diff B, `stui diff PATH B`) prints.
    let explorer_replaced = cli.command.is_none() && cli.path.is_some();
    let replacement = if cli.diff.is_some() {
        "diff"
    } else {
        "inspect"
    };
    let mut stdout = std::io::stdout().lock();
    match stui::commands::run(cli, &mut stdout) {
        Ok(outcome) => {
            if explorer_replaced {
                eprintln!(
                    "stui: standard output is not a terminal, so this is the report of \
                     `stui {replacement}`; --tui opens the explorer"
                );
            }
            ExitCode::from(outcome.exit_code())
        }
        Err(error) => {
            eprintln!("stui: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// glibc serves blocks under its mmap threshold from heaps that keep what is freed, and raises
/// the threshold (up to 32 MiB) each time a mapped block is freed; after the first large lists of
/// a big model are freed, the next ones stay resident when freed too. Fixing the threshold hands
/// every freed block over 1 MiB back to the system, which keeps the memory bound of SECURITY.md.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(unsafe_code, reason = "a call into the C library")]
fn return_large_frees_to_the_system() {
    // SAFETY: mallopt only sets an allocator parameter, and no other thread is running yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_large_frees_to_the_system() {}

/// The threshold [`return_large_frees_to_the_system`] sets: blocks from this size are mapped on
/// their own, in fresh pages.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const LARGE_BLOCK: usize = 1 << 20;

/// The system's allocator, asking the kernel to back large blocks with huge pages (where it
/// gives transparent huge pages on request, the common setting). Opening a model of 100,000
/// tensors fills lists of many MiB at once: with a 4 KiB page per fault, the faults took a
/// quarter of the time, the threads' faults waiting on each other's maps and unmaps.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
struct HugePagesForLargeBlocks;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOCATOR: HugePagesForLargeBlocks = HugePagesForLargeBlocks;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(unsafe_code, reason = "an allocator wraps the system's")]
mod huge_pages {
    use super::{HugePagesForLargeBlocks, LARGE_BLOCK};
    use std::alloc::{GlobalAlloc, Layout, System};

    // SAFETY: every block comes from `System` and goes back to it unchanged; the advice only
    // changes which pages back a block, never what it holds.
    unsafe impl GlobalAlloc for HugePagesForLargeBlocks {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let block = unsafe { System.alloc(layout) };
            advise(block, layout.size());
            block
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let block = unsafe { System.alloc_zeroed(layout) };
            advise(block, layout.size());
            block
        }

        unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(block, layout) }
        }

        unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let block = unsafe { System.realloc(block, layout, new_size) };
            advise(block, new_size);
            block
        }
    }

    /// Asks for huge pages over the whole huge pages that `len` bytes from `block` cover.
    fn advise(block: *mut u8, len: usize) {
        const HUGE_PAGE: usize = 2 << 20;
        if block.is_null() || len < LARGE_BLOCK {
            return;
        }
        let start = block.addr().next_multiple_of(HUGE_PAGE);
        let end = (block.addr() + len) / HUGE_PAGE * HUGE_PAGE;
        if start < end {
            let first = block.wrapping_add(start - block.addr());
            // SAFETY: the range lies within a block this allocator just handed out; the result
            // is ignored, as a kernel without huge pages simply keeps small ones.
            unsafe {
                libc::madvise(first.cast(), end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
}
