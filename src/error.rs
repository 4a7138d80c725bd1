//! Errors that stop stui from doing what was asked. Problems inside a model file are not errors
//! but findings ([`crate::finding`]).

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", crate::text::escape_path(.path))]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: no .safetensors file or index in this folder", crate::text::escape_path(.0))]
    NoModel(PathBuf),
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub fn io(path: &Path, source: io::Error) -> Self {
        Error::Io {
            path: path.to_owned(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
