#!/usr/bin/env python3
"""What a user would write instead of `stui quantize --scheme S`, in Python with numpy: the
baseline of the quantize benchmarks (BENCHMARKS.md). py_quant_schemes.py SCHEME SOURCE OUT [--sync]

Round to nearest, vectorized over whole tensors, as the presets compute it (scales from absmax,
no search), in the same compressed-tensors layout: every 2-D float `*.weight` but embeddings,
norms and `lm_head` quantized, the rest copied; `save_file`, then, with `--sync`, `fsync` of the
output (as `stui quantize` syncs its own). Reads F32 or BF16 by hand (numpy has no BF16: BF16
tensors copied are written as U16, the same bytes). Prints `RESULT <scheme> seconds=<s>`, the
timer started after imports.
"""
import json
import os
import struct
import sys
import time

import numpy as np
from safetensors.numpy import save_file

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def load(path):
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    header = json.loads(bytes(data[8 : 8 + n]))
    header.pop("__metadata__", None)
    for name, entry in header.items():
        start, end = entry["data_offsets"]
        raw = data[8 + n + start : 8 + n + end]
        if entry["dtype"] == "BF16":
            values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif entry["dtype"] == "F32":
            values = raw.view(np.float32)
        else:
            values = raw
        yield name, entry["dtype"], values.reshape(entry["shape"])


def bf16(x):
    """float32 values rounded to BF16, as uint16."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def e4m3(x):
    """float32 values (|x| <= 448) to E4M3 bytes, round to nearest even."""
    sign = (x < 0).astype(np.uint8) << 7
    a = np.abs(x).astype(np.float32)
    sub = np.rint(a * 512).astype(np.uint8)
    bits = a.view(np.uint32)
    rounded = bits + 0x7FFFF + ((bits >> 20) & 1)
    exponent = (rounded >> 23).astype(np.int32) - 120
    normal = ((np.clip(exponent, 0, 15) << 3) | ((rounded >> 20) & 7)).astype(np.uint8)
    return sign | np.where(a < 2.0**-6, sub, np.minimum(normal, 0x7E))


def from_e4m3(b):
    b = b.astype(np.int32)
    e, m = (b >> 3) & 15, (b & 7).astype(np.float32)
    v = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e - 7).astype(np.float32))
    return np.where(b & 0x80, -v, v).astype(np.float32)


def pack(codes, bits):
    """Rows of codes (< 2^bits) packed into int32 words, code i at bit i*bits."""
    per = 32 // bits
    rows, cols = codes.shape
    codes = codes.astype(np.uint32).reshape(rows, cols // per, per)
    shifts = (np.arange(per, dtype=np.uint32) * bits)
    return np.bitwise_or.reduce(codes << shifts, axis=2).view(np.int32)


def quantize(scheme, x, out, name):
    rows, cols = x.shape
    if scheme in ("W8A16", "W4A16", "W4A16_ASYM"):
        bits = 8 if scheme == "W8A16" else 4
        half = 2 ** (bits - 1)
        g = x.reshape(rows, cols // 128, 128)
        if scheme == "W4A16_ASYM":
            lo, hi = np.minimum(g.min(2), 0), np.maximum(g.max(2), 0)
            s = (hi - lo) / (2 * half - 1)
            s = np.where(s == 0, 1, s)
            zp = np.clip(np.rint(-half - lo / s), -half, half - 1)
        else:
            s = np.abs(g).max(2) / (half - 0.5)
            s = np.where(s == 0, 1, s)
            zp = np.zeros_like(s)
        q = np.clip(np.rint(g / s[..., None]) + zp[..., None], -half, half - 1)
        out[name + "_packed"] = pack((q + half).reshape(rows, cols), bits)
        out[name + "_scale"] = bf16(s)
        out[name + "_shape"] = np.array([rows, cols], dtype=np.int64)
        if scheme == "W4A16_ASYM":
            out[name + "_zero_point"] = pack((zp + half).T, bits).T.copy()
    elif scheme in ("FP8_DYNAMIC", "FP8_BLOCK"):
        if scheme == "FP8_DYNAMIC":
            s = np.abs(x).max(1, keepdims=True) / 448
            full = s
        else:
            pr, pc = -rows % 128, -cols % 128
            padded = np.pad(x, ((0, pr), (0, pc)))
            blocks = padded.reshape((rows + pr) // 128, 128, (cols + pc) // 128, 128)
            s = np.abs(blocks).max((1, 3)) / 448
            full = np.repeat(np.repeat(s, 128, 0), 128, 1)[:rows, :cols]
        full = np.where(full == 0, 1, full)
        out[name] = e4m3(np.clip(x / full, -448, 448))
        out[name + "_scale"] = bf16(s)
    elif scheme == "W8A8":
        s = np.abs(x).max(1, keepdims=True) / 127
        s = np.where(s == 0, 1, s)
        out[name] = np.clip(np.rint(x / s), -127, 127).astype(np.int8)
        out[name + "_scale"] = bf16(s)
    elif scheme == "NVFP4A16":
        amax = np.abs(x).max()
        gs = np.float32(448 * 6 / amax) if amax > 0 else np.float32(1)
        g = x.reshape(rows, cols // 16, 16)
        scale = e4m3(np.minimum(np.abs(g).max(2) / 6 * gs, 448))
        eff = from_e4m3(scale) / gs
        v = g / np.where(eff == 0, 1, eff)[..., None]
        a = np.abs(v)
        code = np.searchsorted(np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32), a)
        code = (code | ((v < 0) << 3)).astype(np.uint8).reshape(rows, cols)
        out[name + "_packed"] = code[:, 0::2] | (code[:, 1::2] << 4)
        out[name + "_scale"] = scale
        out[name + "_global_scale"] = np.array([gs], dtype=np.float32)
    else:
        raise SystemExit(f"unknown scheme {scheme}")


def main():
    scheme, source, target = sys.argv[1:4]
    sync = sys.argv[4:] == ["--sync"]
    start = time.perf_counter()
    out = {}
    for name, dtype, values in load(source):
        lower = name.lower()
        chosen = (dtype in ("BF16", "F32") and values.ndim == 2 and name.endswith(".weight")
                  and "embed" not in lower and "norm" not in lower and "lm_head" not in lower
                  and (scheme.startswith("FP8") or scheme == "W8A8" or values.shape[1] % 128 == 0))
        if chosen:
            quantize(scheme, np.asarray(values, dtype=np.float32), out, name)
        elif dtype == "BF16":
            out[name] = np.asarray(values).view(np.uint16).copy()
        else:
            out[name] = np.asarray(values).copy()
    save_file(out, target)
    if sync:
        descriptor = os.open(target, os.O_RDONLY)
        os.fsync(descriptor)
        os.close(descriptor)
    print(f"RESULT {scheme} seconds={time.perf_counter() - start:.3f}")


if __name__ == "__main__":
    main()
