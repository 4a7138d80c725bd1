#!/usr/bin/env python3
"""Dequantizes a stui quantize output from its compressed-tensors layout with numpy alone and
checks it against the source: schemes_numpy.py SOURCE OUTPUT

Needs numpy and safetensors only. The Python `safetensors` package must list every tensor of the
output with the dtype and shape of its header. Each quantized weight (`P.weight_packed`,
`P.weight` in F8_E4M3 or I8, with `P.weight_scale`, ...) is dequantized from its members as the
layouts define them (the scheme read from `quantization_config` in the metadata) and compared
with the source weight: every value of the grid (codes times scales as stored, exactly) within
half a step of the source, and the SNR printed per weight of the values as compressed-tensors'
decompressor gives them (each product rounded to the scales' type; NVFP4's worked out in F32 and
rounded to BF16). Exits 1 on any failure.
"""
import json
import struct
import sys

import numpy as np
from safetensors import safe_open

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {}) or {}
    body = data[8 + n :]
    return header, meta, body


def raw(header, body, name):
    entry = header[name]
    start, end = entry["data_offsets"]
    return entry["dtype"], entry["shape"], body[start:end]


def floats(dtype, shape, buf):
    if dtype == "F32":
        values = np.frombuffer(buf, "<f4").astype(np.float64)
    elif dtype == "F64":
        values = np.frombuffer(buf, "<f8").copy()
    elif dtype == "F16":
        values = np.frombuffer(buf, "<f2").astype(np.float64)
    elif dtype == "BF16":
        bits = np.frombuffer(buf, "<u2").astype(np.uint32) << 16
        values = bits.view(np.float32).astype(np.float64)
    elif dtype == "F8_E4M3":
        values = e4m3(np.frombuffer(buf, np.uint8))
    else:
        raise SystemExit(f"unexpected float dtype {dtype}")
    return values.reshape(shape)


def to_bf16(values):
    """float64 values that F32 holds rounded to BF16, ties to even."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32).astype(np.float64)


def as_loaded(values, dtype):
    """Exact products of codes and scales of `dtype` as the loader computes them, in that type."""
    if dtype == "BF16":
        return to_bf16(values)
    if dtype == "F16":
        return values.astype(np.float16).astype(np.float64)
    if dtype == "F32":
        return values.astype(np.float32).astype(np.float64)
    return values


def e4m3(codes):
    codes = codes.astype(np.int64)
    exponent = (codes >> 3) & 15
    mantissa = (codes & 7).astype(np.float64)
    magnitude = np.where(
        exponent == 0, mantissa * 2.0**-9, (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    )
    return np.where(codes & 0x80, -magnitude, magnitude)


def e4m3_step(codes):
    exponent = (codes.astype(np.int64) >> 3) & 15
    return 2.0 ** (np.maximum(exponent, 1) - 10)


def unpack_rows(words, bits, count):
    """Codes from a little-endian stream of 32-bit words per row: code i at bit i*bits."""
    words = words.astype(np.uint32)
    per_word = 32 // bits
    codes = np.stack([(words >> (k * bits)) & ((1 << bits) - 1) for k in range(per_word)], -1)
    return codes.reshape(words.shape[0], -1)[:, :count].astype(np.int64)


def dequantize(header, body, stem, config):
    group = next(iter(config["config_groups"].values()))
    weights = group["weights"]
    fmt = config["format"]
    bits = weights["num_bits"]
    if fmt == "pack-quantized":
        _, shape, buf = raw(header, body, stem + "_shape")
        out, columns = np.frombuffer(buf, "<i8").tolist()
        _, pshape, buf = raw(header, body, stem + "_packed")
        codes = unpack_rows(np.frombuffer(buf, "<i4").view(np.uint32).reshape(pshape), bits, columns)
        q = codes - (1 << (bits - 1))
        scale_dtype = raw(header, body, stem + "_scale")[0]
        scale = floats(*raw(header, body, stem + "_scale"))
        g = weights["group_size"]
        s = np.repeat(scale, g, axis=1)[:, :columns]
        if weights["symmetric"]:
            zero = np.zeros_like(s)
        else:
            _, zshape, buf = raw(header, body, stem + "_zero_point")
            zwords = np.frombuffer(buf, "<i4").view(np.uint32).reshape(zshape)
            # Packed down the rows: unpack each column's words along dim 0.
            zcodes = unpack_rows(zwords.T.copy(), bits, out).T - (1 << (bits - 1))
            zero = np.repeat(zcodes, g, axis=1)[:, :columns].astype(np.float64)
        back = (q - zero) * s
        return back, s, as_loaded(back, scale_dtype)
    if fmt == "float-quantized":
        dtype, shape, buf = raw(header, body, stem)
        codes = np.frombuffer(buf, np.uint8).reshape(shape)
        scale_dtype = raw(header, body, stem + "_scale")[0]
        scale = floats(*raw(header, body, stem + "_scale"))
        if weights["strategy"] == "block":
            r, c = weights["block_structure"]
            s = np.repeat(np.repeat(scale, r, axis=0), c, axis=1)[: shape[0], : shape[1]]
        else:
            s = np.broadcast_to(scale, shape)
        back = e4m3(codes) * s
        return back, e4m3_step(codes) * s, as_loaded(back, scale_dtype)
    if fmt == "nvfp4-pack-quantized":
        _, pshape, buf = raw(header, body, stem + "_packed")
        packed = np.frombuffer(buf, np.uint8).reshape(pshape).astype(np.int64)
        nibbles = np.stack([packed & 15, packed >> 4], -1).reshape(pshape[0], -1)
        magnitude = E2M1[nibbles & 7]
        values = np.where(nibbles & 8, -magnitude, magnitude)
        step = np.select([(nibbles & 7) < 4, (nibbles & 7) < 6], [0.5, 1.0], 2.0)
        scale = floats(*raw(header, body, stem + "_scale"))
        (global_scale,) = np.frombuffer(raw(header, body, stem + "_global_scale")[2], "<f4")
        s = np.repeat(scale.astype(np.float32) / global_scale, 16, axis=1).astype(np.float64)
        back = values * s
        # Worked out in F32 (`to_bf16` rounds the exact product to it first), then BF16.
        return back, step * s, to_bf16(back)
    if fmt == "int-quantized":
        _, shape, buf = raw(header, body, stem)
        q = np.frombuffer(buf, np.int8).reshape(shape).astype(np.float64)
        scale_dtype = raw(header, body, stem + "_scale")[0]
        scale = floats(*raw(header, body, stem + "_scale"))
        s = np.broadcast_to(scale.reshape(-1, 1) if scale.size > 1 else scale, shape)
        return q * s, s, as_loaded(q * s, scale_dtype)
    raise SystemExit(f"unknown format {fmt}")


def main():
    source_path, output_path = sys.argv[1:3]
    header, meta, body = read(output_path)
    with safe_open(output_path, framework="numpy") as f:
        listed = {k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.keys()}
    for name, entry in header.items():
        dtype, shape = listed[name]
        if shape != entry["shape"]:
            raise SystemExit(f"{name}: the safetensors package reads shape {shape}")
    if set(listed) != set(header):
        raise SystemExit("the safetensors package lists other tensors")
    config = json.loads(meta["quantization_config"])
    source, _, source_body = read(source_path)
    checked = 0
    for name in source:
        if name + "_scale" not in header:
            if floats(*raw(header, body, name)).tobytes() != floats(*raw(source, source_body, name)).tobytes():
                raise SystemExit(f"{name}: kept, but not as it was")
            continue
        x = floats(*raw(source, source_body, name))
        back, step, loaded = dequantize(header, body, name, config)
        error = np.abs(x - back)
        bound = 0.5 * step + np.abs(x) * 2.0**-22 + 1e-38
        worst = float(np.max(error / np.maximum(step, 1e-300)))
        snr = 10 * np.log10(np.sum(x * x) / max(np.sum((x - loaded) ** 2), 1e-300))
        print(f"{name}  snr {snr:.4f} dB  worst {worst:.4f} steps")
        if np.any(error > bound):
            raise SystemExit(f"{name}: {int(np.sum(error > bound))} values beyond half a step")
        checked += 1
    print(f"checked {checked} quantized weights of {config['format']}")


if __name__ == "__main__":
    main()
