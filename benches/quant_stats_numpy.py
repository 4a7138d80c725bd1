#!/usr/bin/env python3
"""Baseline: dequantize a compressed-tensors checkpoint with numpy and compute statistics.

usage: quant_stats_numpy.py MODEL.safetensors [--per-tensor]

What a Python user would write to get statistics of the weights a quantized model computes
with: memory-map the file, and for every logical weight dequantize 128 rows at a time and
accumulate min, max, mean and std (float64 sums) of the finite values, counting NaN and Inf
apart. Reads the two layouts make_quantized_corpus.py writes (pack-quantized int4 with group
scales; float-quantized E4M3 with 128x128 block, per-channel or per-tensor scales) and dense
BF16/F16/F32 tensors. Prints one RESULT line: logical elements, seconds after imports, and
elements per second.
"""
import json
import struct
import sys
import time

import numpy as np

ROWS = 128


def e4m3_values():
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    values = (sign * mag).astype(np.float32)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values


E4M3 = e4m3_values()


def bf16(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


class Stats:
    def __init__(self):
        self.n = self.nonfinite = 0
        self.total = self.total_sq = 0.0
        self.lo, self.hi = np.inf, -np.inf

    def add(self, x):
        x = x.reshape(-1)
        finite = np.isfinite(x)
        if not finite.all():
            self.nonfinite += int(x.size - finite.sum())
            x = x[finite]
        if x.size == 0:
            return
        self.n += x.size
        x64 = x.astype(np.float64)
        self.total += float(x64.sum())
        self.total_sq += float(np.dot(x64, x64))
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))

    def summary(self):
        mean = self.total / self.n if self.n else float("nan")
        var = max(self.total_sq / self.n - mean * mean, 0.0) if self.n else float("nan")
        return {"elements": self.n + self.nonfinite, "nonfinite": self.nonfinite, "min": self.lo,
                "max": self.hi, "mean": mean, "std": var ** 0.5}


def view(mm, start, info):
    a, b = info["data_offsets"]
    dtype = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "I32": np.int32,
             "I64": np.int64, "F8_E4M3": np.uint8, "U8": np.uint8}[info["dtype"]]
    return mm[start + a: start + b].view(dtype).reshape(info["shape"])


def as_f32(arr, dtype):
    return bf16(arr) if dtype == "BF16" else arr.astype(np.float32)


def dense_rows(arr, dtype):
    arr2 = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(1, -1)
    for r0 in range(0, arr2.shape[0], ROWS):
        yield as_f32(np.asarray(arr2[r0:r0 + ROWS]), dtype)


def packed_int4_rows(packed, scale, scale_dtype):
    out_rows, words = packed.shape
    n = words * 8
    group = n // scale.shape[1]
    shifts = np.arange(8, dtype=np.uint32) * np.uint32(4)
    for r0 in range(0, out_rows, ROWS):
        w = np.asarray(packed[r0:r0 + ROWS]).view(np.uint32)
        q = ((w[:, :, None] >> shifts) & np.uint32(0xF)).astype(np.float32) - np.float32(8)
        s = as_f32(np.asarray(scale[r0:r0 + ROWS]), scale_dtype)
        yield (q.reshape(len(w), n // group, group) * s[:, :, None]).reshape(len(w), n)


def fp8_rows(weight, scale, scale_dtype):
    out_rows, n = weight.shape
    s_all = as_f32(np.asarray(scale), scale_dtype).reshape(scale.shape if scale.ndim == 2 else (1, -1))
    for r0 in range(0, out_rows, ROWS):
        v = E4M3[np.asarray(weight[r0:r0 + ROWS])]
        r = np.arange(r0, r0 + len(v))
        if s_all.shape == (1, 1):
            s = s_all
        elif s_all.shape == (out_rows, 1):
            s = s_all[r]
        else:  # blocks
            br, bc = -(-out_rows // s_all.shape[0]), -(-n // s_all.shape[1])
            s = np.repeat(s_all[r // br], bc, axis=1)[:, :n]
        yield v * s


def logical_weights(header):
    """(logical name, kind, members) for every tensor group, in name order."""
    names = set(header)
    out = []
    for name in sorted(names):
        if name.endswith(".weight_packed"):
            prefix = name[: -len("weight_packed")]
            out.append((prefix + "weight", "int4-packed", (name, prefix + "weight_scale")))
        elif name.endswith(".weight") and header[name]["dtype"] == "F8_E4M3":
            out.append((name, "fp8", (name, name + "_scale")))
        elif name.endswith((".weight_scale", ".weight_shape", ".weight_zero_point")):
            continue
        else:
            out.append((name, "dense", (name,)))
    return out


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 1:
        print(__doc__)
        return 2
    path = args[0]
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    start = 8 + n
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    t0 = time.monotonic()
    total = 0
    for logical, kind, members in logical_weights(header):
        stats = Stats()
        if kind == "dense":
            info = header[members[0]]
            rows = dense_rows(view(mm, start, info), info["dtype"])
        elif kind == "int4-packed":
            rows = packed_int4_rows(view(mm, start, header[members[0]]),
                                    view(mm, start, header[members[1]]), header[members[1]]["dtype"])
        else:
            rows = fp8_rows(view(mm, start, header[members[0]]),
                            view(mm, start, header[members[1]]), header[members[1]]["dtype"])
        with np.errstate(invalid="ignore", over="ignore"):  # NaN / Inf scales are counted
            for block in rows:
                stats.add(block)
        s = stats.summary()
        total += s["elements"]
        if "--per-tensor" in argv:
            print(f"{logical} {kind} n={s['elements']} nonfinite={s['nonfinite']} min={s['min']:.6g} "
                  f"max={s['max']:.6g} mean={s['mean']:.6g} std={s['std']:.6g}")
    secs = time.monotonic() - t0
    print(f"RESULT quant-stats-numpy elements={total} seconds={secs:.3f} "
          f"elements_per_s={total / secs:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
