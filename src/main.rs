use clap::Parser;
use std::process::ExitCode;
use stui::cli::{Cli, ColorMode};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.command.is_none()
        && let Some(path) = &cli.path
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
        };
        return match stui::tui::run(path, &options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("stui: {error:#}");
                ExitCode::from(2)
            }
        };
    }
    let mut stdout = std::io::stdout().lock();
    match stui::commands::run(cli, &mut stdout) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(error) => {
            eprintln!("stui: {error:#}");
            ExitCode::from(2)
        }
    }
}
