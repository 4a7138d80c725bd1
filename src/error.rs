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
        crate::format::folder::models_inside(&crate::text::escape_path(.folder), .inside)
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
