//! One function per subcommand: open the model, run the shared engine, print through
//! [`crate::report`].

use crate::cli::{CheckArgs, Cli, Command, InspectArgs};
use crate::error::Result;
use crate::finding::Severity;
use crate::format::Model;
use crate::report::{Check, Inspect, Listing};
use crate::tree::LayerTree;
use std::io::{self, Write};

/// How a command ended, as the process exit code tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing wrong: exit code 0.
    Clean,
    /// The model has problems: exit code 1.
    Problems,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Clean => 0,
            Outcome::Problems => 1,
        }
    }
}

/// Runs what the command line asks, writing to `out`.
pub fn run<W: Write>(cli: Cli, out: &mut W) -> anyhow::Result<Outcome> {
    let result = match cli.command {
        Some(Command::Inspect(args)) => inspect(&args, out),
        Some(Command::Check(args)) => check(&args, out),
        None => match cli.path {
            Some(path) => {
                let args = InspectArgs {
                    path,
                    json: false,
                    flat: false,
                    expand: false,
                    filter: None,
                };
                inspect(&args, out)
            }
            None => anyhow::bail!("no model given; see `stui --help`"),
        },
    };
    match result {
        Err(Failure::Output(error)) if error.kind() == io::ErrorKind::BrokenPipe => {
            Ok(Outcome::Clean)
        }
        Err(Failure::Output(error)) => {
            Err(anyhow::Error::new(error).context("cannot write output"))
        }
        Err(Failure::Stui(error)) => Err(error.into()),
        Ok(outcome) => Ok(outcome),
    }
}

/// Why a command stopped: stui's own errors, or the output going away.
enum Failure {
    Stui(crate::error::Error),
    Output(io::Error),
}

impl From<crate::error::Error> for Failure {
    fn from(error: crate::error::Error) -> Self {
        Failure::Stui(error)
    }
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Output(error)
    }
}

fn open(path: &std::path::Path) -> Result<Model> {
    Model::open(path)
}

fn inspect<W: Write>(args: &InspectArgs, out: &mut W) -> Result<Outcome, Failure> {
    let model = open(&args.path)?;
    let needle = args.filter.as_deref().map(str::to_lowercase);
    let tree = LayerTree::build(&model.tensors, |tensor| {
        needle
            .as_deref()
            .is_none_or(|needle| contains_ignore_case(tensor.name(), needle))
    });
    let report = Inspect {
        model: &model,
        tree: &tree,
        filter: args.filter.as_deref(),
    };
    let mut out = io::BufWriter::with_capacity(1 << 16, out);
    if args.json {
        report.write_json(&mut out)?;
    } else {
        let listing = match (args.flat, args.expand) {
            (true, _) => Listing::Flat,
            (false, true) => Listing::Expanded,
            (false, false) => Listing::Tree,
        };
        report.write_text(&mut out, listing)?;
    }
    out.flush()?;
    let outcome = if has_errors(&model) {
        Outcome::Problems
    } else {
        Outcome::Clean
    };
    skip_freeing(model);
    skip_freeing(tree);
    Ok(outcome)
}

fn check<W: Write>(args: &CheckArgs, out: &mut W) -> Result<Outcome, Failure> {
    let model = open(&args.path)?;
    let report = Check {
        model: &model,
        findings: &model.findings,
    };
    let mut out = io::BufWriter::new(out);
    if args.json {
        report.write_json(&mut out)?;
    } else {
        report.write_text(&mut out)?;
    }
    out.flush()?;
    let failed = if args.strict {
        !model.is_valid()
    } else {
        has_errors(&model)
    };
    skip_freeing(model);
    Ok(if failed {
        Outcome::Problems
    } else {
        Outcome::Clean
    })
}

/// The command is done and the process exits next: freeing a large model's names one by one
/// would cost about as long as reading them, and the system reclaims the memory anyway.
fn skip_freeing<T>(value: T) {
    std::mem::forget(value);
}

fn has_errors(model: &Model) -> bool {
    model.findings.iter().any(|f| f.severity == Severity::Error)
}

/// Case-insensitive substring test; `needle` must already be lowercase.
fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    if haystack.is_ascii() && needle.is_ascii() {
        haystack
            .as_bytes()
            .windows(needle.len().max(1))
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
            || needle.is_empty()
    } else {
        haystack.to_lowercase().contains(needle)
    }
}
