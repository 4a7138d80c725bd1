//! A logical weight's members read from the model's files and handed to its kernel: the codes
//! member through a map, the others (scales, zero points: a small fraction of it) copied. A
//! model on the Hub has each member fetched into a temporary file first, a Range request per
//! 12 MiB, and mapped from there: no more than a request's bytes are held in memory.

use super::kernels::{Dequantize, Stored};
use super::{Quantization, Role};
use crate::format::mapped::with_mapped;
use crate::format::remote::RemoteModel;
use crate::format::{Dtype, Model};
use crate::text::escape;

/// Runs `work` on the kernel of logical weight `weight` of `model`; an error says why its
/// values cannot be read (a member that does not fit its layout, a file that cannot be read).
/// A model on the Hub stops fetching between two requests once `stopped` says so.
pub fn with_kernel<T>(
    (model, quantization, weight): (&Model, &Quantization, usize),
    stopped: &dyn Fn() -> bool,
    work: impl FnOnce(&dyn Dequantize) -> T,
) -> Result<T, String> {
    let logical = &quantization.weights[weight];
    if let Some(variant) = quantization.unread_variant(logical.scheme.layout) {
        return Err(format!("stui does not read the values of {variant}"));
    }
    let members = quantization.members(weight);
    let codes = members
        .iter()
        .find(|m| m.role.is_codes())
        .ok_or("the weight has no codes")?;
    let mut others = Vec::with_capacity(members.len());
    for member in members.iter().filter(|m| m.tensor != codes.tensor) {
        let tensor = member.tensor as usize;
        let (dtype, shape) = described(model, tensor)?;
        let bytes = copied(model, tensor, stopped)?;
        others.push((member.role, dtype, shape, bytes));
    }
    let (codes_dtype, codes_shape) = described(model, codes.tensor as usize)?;
    read(model, codes.tensor as usize, stopped, |bytes| {
        let mut stored: Vec<(Role, Stored<'_>)> = others
            .iter()
            .map(|(role, dtype, shape, bytes)| {
                (
                    *role,
                    Stored {
                        bytes,
                        dtype: *dtype,
                        shape,
                    },
                )
            })
            .collect();
        stored.push((
            codes.role,
            Stored {
                bytes,
                dtype: codes_dtype,
                shape: &codes_shape,
            },
        ));
        let kernel =
            super::dequantize::kernel(logical, &stored).map_err(|error| error.to_string())?;
        Ok(work(kernel.as_ref()))
    })
    .and_then(|result| result)
}

/// A member's dtype and shape, when its dtype is one stui reads.
fn described(model: &Model, tensor: usize) -> Result<(Dtype, Vec<u64>), String> {
    let info = &model.tensors[tensor].info;
    let dtype = info
        .dtype
        .known()
        .ok_or_else(|| format!("{}: dtype not read", escape(&info.name)))?;
    Ok((dtype, info.shape.iter().collect()))
}

/// A copy of the bytes of stored tensor `tensor` (a small member: scales, zero points).
fn copied(model: &Model, tensor: usize, stopped: &dyn Fn() -> bool) -> Result<Vec<u8>, String> {
    let Some(remote) = &model.remote else {
        return read(model, tensor, stopped, <[u8]>::to_vec);
    };
    let entry = &model.tensors[tensor];
    let mut bytes = Vec::new();
    remote
        .read_pieces(entry.shard, model.file_range(entry), |piece| {
            unless_stopped(stopped)?;
            bytes.extend_from_slice(piece);
            Ok(())
        })
        .map_err(|e| format!("{}: {e}", escape(&entry.info.name)))?;
    Ok(bytes)
}

/// Runs `work` on the bytes of stored tensor `tensor`.
fn read<T>(
    model: &Model,
    tensor: usize,
    stopped: &dyn Fn() -> bool,
    work: impl FnOnce(&[u8]) -> T,
) -> Result<T, String> {
    let tensor = &model.tensors[tensor];
    let shard = model.shard_of(tensor);
    let name = || escape(&tensor.info.name);
    let (start, len) = model.file_range(tensor);
    let (file, start) = match &model.remote {
        Some(remote) => (
            fetched(remote, tensor.shard, (start, len), stopped)
                .map_err(|e| format!("{}: {e}", name()))?,
            0,
        ),
        None => (
            crate::paths::open_file(&shard.path).map_err(|e| format!("{}: {e}", shard.label))?,
            start,
        ),
    };
    let len = usize::try_from(len).map_err(|e| e.to_string())?;
    with_mapped(&file, start, len, work).map_err(|e| format!("{}: {e}", name()))
}

/// `len` bytes of shard `shard` of a model on the Hub from `start`, fetched into a temporary
/// file that is gone once closed.
fn fetched(
    remote: &RemoteModel,
    shard: usize,
    (start, len): (u64, u64),
    stopped: &dyn Fn() -> bool,
) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    let mut file = tempfile::tempfile()?;
    remote.read_pieces(shard, (start, len), |piece| {
        unless_stopped(stopped)?;
        file.write_all(piece)
    })?;
    Ok(file)
}

/// An error once `stopped` says so, between two requests of a fetch.
fn unless_stopped(stopped: &dyn Fn() -> bool) -> std::io::Result<()> {
    if stopped() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            "stopped",
        ));
    }
    Ok(())
}
