//! Identity: SHA-256 of files and of each tensor's bytes, and a structural ID that names a
//! model's layout whatever its values and its metadata.
//!
//! The structural ID is the SHA-256 of this text, in UTF-8, and hex-encoded:
//!
//! ```text
//! safetensors-structure-v1\n
//! NAME\0DTYPE\0SHAPE\0BYTES\n        one line per tensor, in byte order of NAME
//! ```
//!
//! where DTYPE is the dtype name in lowercase (`bf16`), SHAPE the dimensions in decimal joined by
//! `,` (empty for a scalar), and BYTES the tensor's byte length in decimal. Two files with the
//! same tensors and different values, or with their header entries in another order, share it.

use crate::format::{Model, read_exact_at};
use crate::paths::open_file;
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Bytes hashed at a time.
const CHUNK: usize = 8 << 20;

/// A digest in lowercase hexadecimal, as `sha256sum` prints it.
pub fn hex(digest: &[u8]) -> String {
    use std::fmt::Write as _;
    digest
        .iter()
        .fold(String::with_capacity(64), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

/// The SHA-256 of a whole file, as `sha256sum` prints it.
pub fn file_sha256(path: &Path) -> io::Result<String> {
    let mut file = open_file(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(hex(&hasher.finalize()));
        }
        hasher.update(&buffer[..read]);
    }
}

/// The SHA-256 of every tensor's bytes, computed in parallel, in the model's tensor order; or
/// the first tensor that could not be read, and why.
pub fn tensor_sha256s(model: &Model) -> Result<Vec<[u8; 32]>, (usize, io::Error)> {
    let files: Vec<io::Result<File>> = model.shards.iter().map(|s| open_file(&s.path)).collect();
    // Filled in place: collecting results would gather them in pieces and copy them once more.
    let mut digests = vec![[0u8; 32]; model.tensors.len()];
    digests
        .par_iter_mut()
        .zip(&model.tensors)
        .enumerate()
        .try_for_each(|(index, (digest, tensor))| {
            *digest = tensor_sha256(model, &files, tensor).map_err(|error| (index, error))?;
            Ok(())
        })?;
    Ok(digests)
}

fn tensor_sha256(
    model: &Model,
    files: &[io::Result<File>],
    tensor: &crate::format::Tensor,
) -> io::Result<[u8; 32]> {
    let file = files[tensor.shard]
        .as_ref()
        .map_err(|e| io::Error::new(e.kind(), e.to_string()))?;
    let (start, len) = model.file_range(tensor);
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; CHUNK.min(usize::try_from(len).unwrap_or(CHUNK))];
    let mut done = 0u64;
    while done < len {
        let count = usize::try_from((len - done).min(CHUNK as u64)).unwrap_or(CHUNK);
        read_exact_at(file, &mut buffer[..count], start + done)?;
        hasher.update(&buffer[..count]);
        done += count as u64;
    }
    Ok(hasher.finalize().into())
}

/// The model's structural ID (see the module documentation for the exact bytes hashed).
pub fn structural_id(model: &Model) -> String {
    // Indexes rather than references: half the memory for a header of a million tensors.
    let mut order: Vec<u32> = (0..model.tensors.len())
        .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
        .collect();
    let name = |i: &u32| model.tensors[*i as usize].name().as_bytes();
    // In parallel: beside the other work on a model's opening, whichever core is free sorts.
    rayon::slice::ParallelSliceMut::par_sort_unstable_by(&mut order[..], |a, b| {
        crate::text::byte_order(name(a), name(b))
    });
    let mut hasher = Sha256::new();
    hasher.update(b"safetensors-structure-v1\n");
    let mut line = String::with_capacity(256);
    let mut digits = itoa::Buffer::new();
    for index in order {
        let info = &model.tensors[index as usize].info;
        line.clear();
        line.push_str(&info.name);
        line.push('\0');
        line.extend(info.dtype.name().chars().map(|c| c.to_ascii_lowercase()));
        line.push('\0');
        for (i, dim) in info.shape.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            line.push_str(digits.format(dim));
        }
        line.push('\0');
        line.push_str(digits.format(info.byte_len()));
        line.push('\n');
        hasher.update(line.as_bytes());
    }
    hex(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::{Fill, SyntheticModel};
    use crate::format::Dtype;

    fn model(seed: u64, fill: Fill, dir: &Path, name: &str) -> Model {
        let path = dir.join(name);
        SyntheticModel::new(seed)
            .tensor("b", Dtype::F32, &[2, 3], fill.clone())
            .tensor("a", Dtype::Bf16, &[4], fill)
            .metadata("note", name)
            .write(&path)
            .unwrap();
        Model::open(&path).unwrap()
    }

    #[test]
    fn the_structural_id_ignores_values_and_metadata_but_not_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let one = model(
            1,
            Fill::Normal {
                mean: 0.0,
                std: 1.0,
            },
            dir.path(),
            "one.safetensors",
        );
        let two = model(2, Fill::Zeros, dir.path(), "two.safetensors");
        assert_eq!(structural_id(&one), structural_id(&two));
        let path = dir.path().join("three.safetensors");
        SyntheticModel::new(1)
            .tensor("b", Dtype::F32, &[3, 2], Fill::Zeros)
            .tensor("a", Dtype::Bf16, &[4], Fill::Zeros)
            .write(&path)
            .unwrap();
        assert_ne!(
            structural_id(&one),
            structural_id(&Model::open(&path).unwrap())
        );
    }

    #[test]
    fn hashes_are_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            file_sha256(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
