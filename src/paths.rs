//! What is at a path, looked at before anything opens it.
//!
//! Every file stui reads is opened through [`open_file`], and every path it is given is first
//! looked at by [`look_at`]: a named pipe with no writer would block `open` forever, a device
//! reads as an endless or an empty stream, and a socket cannot be opened at all. Each gets an
//! error naming what the path is, at once.

use std::fs::{self, File, FileType, OpenOptions};
use std::io;
use std::path::Path;

/// What a path stui can use holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file (through any symbolic links).
    File,
    /// A folder (through any symbolic links).
    Folder,
}

/// Looks at what is at `path`, following symbolic links, without opening it: a regular file or
/// a folder. Anything else is an error whose message says what the path is (a named pipe, a
/// socket, a device, a symbolic link to nothing), with [`io::ErrorKind::NotFound`] when nothing
/// is there.
pub fn look_at(path: &Path) -> io::Result<Kind> {
    match fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(Kind::File),
        Ok(meta) if meta.is_dir() => Ok(Kind::Folder),
        Ok(meta) => Err(not_a_file(meta.file_type())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            Err(dangling_link(path).unwrap_or(error))
        }
        Err(error) => Err(error),
    }
}

/// Looks at `path` as [`look_at`] does, and requires a regular file: a folder is an error too.
pub fn look_at_file(path: &Path) -> io::Result<()> {
    match look_at(path)? {
        Kind::File => Ok(()),
        Kind::Folder => Err(a_folder()),
    }
}

/// Looks at a path stui is about to write: `None` when nothing is there yet, else what
/// [`look_at`] finds (a symbolic link to nothing is an error: writing would create its target).
pub fn look_at_output(path: &Path) -> io::Result<Option<Kind>> {
    match look_at(path) {
        Ok(kind) => Ok(Some(kind)),
        Err(error) if error.kind() == io::ErrorKind::NotFound && dangling_link(path).is_none() => {
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// Looks at a file stui is about to write, as [`look_at_output`] does, and says whether one is
/// there already; a folder is an error too.
pub fn look_at_output_file(path: &Path) -> io::Result<bool> {
    match look_at_output(path)? {
        None => Ok(false),
        Some(Kind::File) => Ok(true),
        Some(Kind::Folder) => Err(a_folder()),
    }
}

/// Looks at a folder stui is about to write into, as [`look_at_output`] does, and says whether
/// one is there already; a regular file is an error too.
pub fn look_at_output_folder(path: &Path) -> io::Result<bool> {
    match look_at_output(path)? {
        None => Ok(false),
        Some(Kind::Folder) => Ok(true),
        Some(Kind::File) => Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "a regular file, not a folder",
        )),
    }
}

/// Opens the regular file at `path` for reading, never blocking: anything else is an error from
/// [`look_at_file`]. The file is checked again once open, in case the path changed in between.
pub fn open_file(path: &Path) -> io::Result<File> {
    look_at_file(path)?;
    let mut options = OpenOptions::new();
    options.read(true);
    // Should the path have become a named pipe since it was looked at, the open returns at once
    // rather than wait for a writer; on a regular file the flag changes nothing.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        &mut options,
        libc::O_NONBLOCK | libc::O_NOCTTY,
    );
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if meta.is_file() {
        Ok(file)
    } else {
        Err(not_a_file(meta.file_type()))
    }
}

fn a_folder() -> io::Error {
    io::Error::new(io::ErrorKind::IsADirectory, "a folder, not a regular file")
}

/// The error for a path that is there but is neither a regular file nor a folder.
fn not_a_file(file_type: FileType) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}, not a regular file", describe(file_type)),
    )
}

#[cfg(unix)]
fn describe(file_type: FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "a named pipe (FIFO)"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_dir() {
        "a folder"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn describe(file_type: FileType) -> &'static str {
    if file_type.is_dir() {
        "a folder"
    } else {
        "a special file"
    }
}

/// When `path` is a symbolic link whose target does not exist, the error that says so.
fn dangling_link(path: &Path) -> Option<io::Error> {
    let meta = fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_symlink() {
        return None;
    }
    let target = fs::read_link(path).ok()?;
    Some(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "a symbolic link to {}, which does not exist",
            crate::text::escape_path(&target)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_folders_are_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.safetensors");
        std::fs::write(&file, b"12345678").unwrap();
        assert_eq!(look_at(&file).unwrap(), Kind::File);
        assert_eq!(look_at(dir.path()).unwrap(), Kind::Folder);
        assert!(open_file(&file).is_ok());
        let error = open_file(dir.path()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::IsADirectory);
        assert_eq!(error.to_string(), "a folder, not a regular file");
        assert!(look_at_output_file(&file).unwrap());
        assert!(look_at_output_folder(dir.path()).unwrap());
        let error = look_at_output_file(dir.path()).unwrap_err();
        assert_eq!(error.to_string(), "a folder, not a regular file");
        let error = look_at_output_folder(&file).unwrap_err();
        assert_eq!(error.to_string(), "a regular file, not a folder");
    }

    #[test]
    fn nothing_there_is_not_found_and_fine_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert_eq!(
            look_at(&missing).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(look_at_output(&missing).unwrap(), None);
        assert!(!look_at_output_file(&missing).unwrap());
        assert!(!look_at_output_folder(&missing).unwrap());
    }

    #[cfg(unix)]
    #[test]
    fn a_link_to_nothing_names_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link.safetensors");
        std::os::unix::fs::symlink("gone.safetensors", &link).unwrap();
        let error = look_at(&link).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            error.to_string(),
            "a symbolic link to gone.safetensors, which does not exist"
        );
        assert!(
            look_at_output(&link).is_err(),
            "writing would create gone.safetensors"
        );
    }

    #[cfg(unix)]
    #[test]
    fn devices_and_sockets_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        for (path, what) in [
            (
                Path::new("/dev/null"),
                "a character device, not a regular file",
            ),
            (
                Path::new("/dev/zero"),
                "a character device, not a regular file",
            ),
            (&socket, "a socket, not a regular file"),
        ] {
            assert_eq!(look_at(path).unwrap_err().to_string(), what);
            assert_eq!(open_file(path).unwrap_err().to_string(), what);
            assert_eq!(look_at_output(path).unwrap_err().to_string(), what);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_named_pipe_with_no_writer_is_named_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.safetensors");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let what = "a named pipe (FIFO), not a regular file";
        assert_eq!(look_at(&fifo).unwrap_err().to_string(), what);
        assert_eq!(open_file(&fifo).unwrap_err().to_string(), what);
    }
}
