use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;
use stui::cli::{Cli, ColorMode};

fn main() -> ExitCode {
    return_large_frees_to_the_system();
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(message) = stui::commands::mistyped_command(&args) {
        eprintln!("stui: {message}");
        return ExitCode::from(2);
    }
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
            variant: cli.variant.clone(),
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
