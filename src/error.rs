//! Errors that stop stui from doing what was asked. Problems inside a model file are not errors
//! but findings ([`crate::finding`]).

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The I/O error is part of the message rather than a `source`, so that a printed chain
    /// names it once.
    #[error("{}: {error}", crate::text::escape_path(.path))]
    Io { path: PathBuf, error: io::Error },
    /// A folder without a model of its own; `inside` names its subfolders that hold one.
    #[error(
        "{}: no .safetensors file or index in this folder{}",
        crate::text::escape_path(.folder),
        models_inside(&crate::text::escape_path(.folder), .inside)
    )]
    NoModel {
        folder: PathBuf,
        inside: Vec<String>,
    },
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub fn io(path: &Path, error: io::Error) -> Self {
        Error::Io {
            path: path.to_owned(),
            error,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a folder without a model says of its subfolders that hold one (nothing when none do).
pub fn models_inside(shown: &str, inside: &[String]) -> String {
    subfolders_hold_models(shown, inside, "").map_or_else(String::new, |said| format!("; {said}"))
}

/// The subfolders `inside` the folder `shown` that hold models, `aside` said of them; `None`
/// when there are none.
pub fn subfolders_hold_models(shown: &str, inside: &[String], aside: &str) -> Option<String> {
    match inside {
        [] => None,
        [only] => Some(format!(
            "its folder `{0}` holds a model{aside}: open it by its path, {shown}/{0}",
            crate::text::escape(only)
        )),
        [first, ..] => Some(format!(
            "its folders {} hold models{aside}: open one by its path, e.g. {shown}/{}",
            crate::text::listed_in_backticks(inside, 4),
            crate::text::escape(first)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subfolders_with_models_are_named_one_or_many() {
        assert_eq!(
            models_inside("hf://org/name", &["vae".into()]),
            "; its folder `vae` holds a model: open it by its path, hf://org/name/vae"
        );
        assert_eq!(
            models_inside("x", &["a".into(), "b".into()]),
            "; its folders `a`, `b` hold models: open one by its path, e.g. x/a"
        );
        assert_eq!(models_inside("x", &[]), "");
    }
}
