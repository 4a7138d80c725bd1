//! Where a model's bytes come from. A model argument names a local path, or a Hub repository
//! (`ORG/NAME[@REVISION][/PATH]`, `hf://…`) found in the local Hugging Face cache. [`crate::format`]
//! reads through what this module resolves and knows nothing else of where the bytes lie.

pub mod header_cache;
pub mod hf_cache;
pub mod hub;

use std::borrow::Cow;
use std::ffi::OsString;
use std::fmt;
use std::path::Path;

/// A Hub repository named on the command line: `ORG/NAME[@REVISION][/PATH]`, or the same after
/// `hf://` (the grammar of `huggingface_hub`'s `hf://` URIs, model repositories only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoRef {
    /// `ORG/NAME`.
    pub id: String,
    /// As given: a branch, a tag, `refs/pr/N` or a commit; `None` means `main`.
    pub revision: Option<String>,
    /// A file or folder inside the repository (`unet`, `transformer/model.safetensors`).
    pub path: Option<String>,
    /// Written with `hf://`: read from the Hub even when the cache holds it.
    pub remote: bool,
}

impl RepoRef {
    /// Reads a model argument as a repository, `None` when it is not one.
    pub fn parse(text: &str) -> Option<RepoRef> {
        let (remote, rest) = match text.strip_prefix("hf://") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let rest = rest.strip_prefix("models/").unwrap_or(rest);
        let (org, rest) = rest.split_once('/')?;
        let name_end = rest.find(['@', '/']).unwrap_or(rest.len());
        let (name, mut rest) = rest.split_at(name_end);
        if !valid_part(org) || !valid_part(name) {
            return None;
        }
        let mut revision = None;
        if let Some(after) = rest.strip_prefix('@') {
            // `refs/pr/N` and `refs/convert/X` are kept whole; any other `/` ends the revision.
            let whole = ["refs/pr/", "refs/convert/"]
                .iter()
                .find_map(|prefix| after.strip_prefix(prefix).map(|tail| (prefix.len(), tail)));
            let end = match whole {
                Some((prefix, tail)) => prefix + tail.find('/').unwrap_or(tail.len()),
                None => after.find('/').unwrap_or(after.len()),
            };
            let text = &after[..end];
            if text.is_empty() {
                return None;
            }
            revision = Some(text.replace("%2F", "/").replace("%2f", "/"));
            rest = &after[end..];
        }
        let path = if rest.is_empty() {
            None
        } else {
            let path = rest.strip_prefix('/')?.trim_end_matches('/');
            (!path.is_empty()).then(|| path.to_owned())
        };
        if path
            .as_deref()
            .is_some_and(|p| p.split('/').any(|part| part.is_empty() || part == ".."))
        {
            return None;
        }
        Some(RepoRef {
            id: format!("{org}/{name}"),
            revision,
            path,
            remote,
        })
    }

    /// The revision asked for, `main` when none was.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }
}

impl fmt::Display for RepoRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)?;
        if let Some(revision) = &self.revision {
            write!(f, "@{revision}")?;
        }
        if let Some(path) = &self.path {
            write!(f, "/{path}")?;
        }
        Ok(())
    }
}

/// A part of a repository id as the Hub allows it: letters, digits, `-`, `_` and `.`, not
/// starting or ending with `-` or `.`, no `--` or `..`, at most 96 characters.
fn valid_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 96
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !part.starts_with(['-', '.'])
        && !part.ends_with(['-', '.'])
        && !part.contains("--")
        && !part.contains("..")
}

/// A model argument as a repository when no local path of that spelling exists (a local path
/// always wins, a dangling link included).
pub fn repo_named(path: &Path) -> Option<RepoRef> {
    if std::fs::symlink_metadata(path).is_ok() {
        return None;
    }
    RepoRef::parse(path.to_str()?)
}

/// The environment as the resolution reads it: a variable set to an empty value counts as unset.
pub trait Environment {
    fn var(&self, name: &str) -> Option<OsString>;
}

/// The process's own environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<OsString> {
        std::env::var_os(name).filter(|value| !value.is_empty())
    }
}

/// `~` at the start of a path from the environment, as the home folder.
fn expand_home<'a>(value: &'a Path, env: &dyn Environment) -> Cow<'a, Path> {
    match (value.strip_prefix("~"), env.var("HOME")) {
        (Ok(rest), Some(home)) => Cow::Owned(Path::new(&home).join(rest)),
        _ => Cow::Borrowed(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(id: &str, revision: Option<&str>, path: Option<&str>, remote: bool) -> RepoRef {
        RepoRef {
            id: id.into(),
            revision: revision.map(Into::into),
            path: path.map(Into::into),
            remote,
        }
    }

    #[test]
    fn reads_the_hf_uri_grammar() {
        for (text, expected) in [
            ("org/name", Some(repo("org/name", None, None, false))),
            (
                "org/name@v1.0",
                Some(repo("org/name", Some("v1.0"), None, false)),
            ),
            (
                "hf://org/name@refs/pr/1/unet",
                Some(repo("org/name", Some("refs/pr/1"), Some("unet"), true)),
            ),
            (
                "hf://models/org/name@my%2Fbranch/a/b.safetensors",
                Some(repo(
                    "org/name",
                    Some("my/branch"),
                    Some("a/b.safetensors"),
                    true,
                )),
            ),
            (
                "org/name/transformer",
                Some(repo("org/name", None, Some("transformer"), false)),
            ),
            ("model.safetensors", None),
            ("/abs/path", None),
            ("./org/name", None),
            ("org/na--me", None),
            ("org/name@", None),
            ("org/name/../x", None),
            ("hf://gpt2", None),
        ] {
            assert_eq!(RepoRef::parse(text), expected, "{text}");
        }
    }
}
