use clap::Parser;
use std::process::ExitCode;
use stui::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    match stui::commands::run(cli, &mut stdout) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(error) => {
            eprintln!("stui: {error:#}");
            ExitCode::from(2)
        }
    }
}
