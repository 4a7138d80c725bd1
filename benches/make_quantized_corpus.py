#!/usr/bin/env python3
"""compressed-tensors W4A16 and FP8_BLOCK versions of a BF16 Llama checkpoint, numpy only.

usage: make_quantized_corpus.py SRC.safetensors OUT_DIR [--scheme=W4A16|FP8_BLOCK|all]
       make_quantized_corpus.py --check SRC.safetensors

SRC is `llama-like-bf16.safetensors` from ../shared/bench/make_corpus.py. Writes, for each
scheme, OUT_DIR/<src stem>-<scheme>/ with model.safetensors and config.json, in the layout
llm-compressor writes for the preset with ignore=["lm_head"]:

  W4A16      every `*_proj.weight` of the decoder layers as `weight_packed` I32
             [out, in/8] (int4 codes + 8, eight per word, LSB first), `weight_scale` BF16
             [out, in/128] (symmetric, group 128), `weight_shape` I64 [2];
  FP8_BLOCK  every `*_proj.weight` as `weight` F8_E4M3 [out, in] with `weight_scale` BF16
             [ceil(out/128), ceil(in/128)] (128x128 blocks).

Embeddings, norms and lm_head are copied unchanged (as from llm-compressor's oneshot, which
targets Linear modules; its model_free_ptq would quantize embed_tokens too). The arithmetic is compressed-tensors'
own, step for step in BF16 as it runs on a BF16 weight (min/max observer, scale =
absmax / (range/2) rounded to BF16, x / scale rounded to BF16, clamp, round half to even or
cast to E4M3 with round half to even), so the output is byte-identical to the producer's.
Rows are processed 128 at a time; what is held at once is one weight's quantized output
(at most 12 MB for FP8 of a 5632x2048 weight), whatever the model size.

--check runs compressed-tensors itself (needs torch, llmcompressor, compressed-tensors) on
slices of SRC (including one holding the planted NaN and Inf values) and compares its
tensors byte for byte with this script's.
"""
import json
import os
import struct
import sys
import time

import numpy as np

ROWS = 128
GROUP = 128
BLOCK = 128
BF16_EPS = np.float32(2.0 ** -7)  # torch.finfo(torch.bfloat16).eps, the scale put in for a zero scale

# ---------------------------------------------------------------- safetensors I/O


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def tensor_view(mm, data_start, info):
    start, end = info["data_offsets"]
    dtype = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16}[info["dtype"]]
    return mm[data_start + start: data_start + end].view(dtype).reshape(info["shape"])


DTYPE_SIZE = {"BF16": 2, "F32": 4, "F16": 2, "I32": 4, "I64": 8, "F8_E4M3": 1, "U8": 1}


def write_safetensors(path, specs, producer):
    """specs: [(name, dtype, shape)] in file order; producer(name) yields the bytes of that
    tensor in pieces. Written to a temporary file renamed into place."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in specs:
        size = int(np.prod(shape, dtype=np.int64)) * DTYPE_SIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape in specs:
            start = f.tell()
            for piece in producer(name):
                f.write(piece)
            begin, end = header[name]["data_offsets"]
            assert f.tell() - start == end - begin, name
    os.replace(tmp, path)


# ---------------------------------------------------------------- BF16 arithmetic


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x, nan_bits=0xFFFF):
    """Round to nearest even, as torch rounds a float32 result into a bfloat16 tensor.
    torch's NaN bits depend on its kernel path: 0xFFFF in a [128, 8] scale tensor, 0x7FC0
    in a [1, 8] one (see --check); NaN scales are written as 0xFFFF."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    out[np.isnan(x)] = nan_bits
    return out


def bf16_round(x):
    return bf16_to_f32(f32_to_bf16(x))


def e4m3_table():
    """The 127 non-negative finite E4M3 (fn) values, indexed by their code."""
    codes = np.arange(127)
    exp, man = codes >> 3, codes & 7
    return np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))


E4M3 = e4m3_table()


def to_e4m3(y):
    """float32 values already clamped to [-448, 448] (or NaN) -> E4M3 codes, round half
    to even (torch's float -> float8_e4m3fn cast)."""
    a = np.abs(y).astype(np.float64)
    nan = np.isnan(a)
    a[nan] = 0.0
    hi = np.searchsorted(E4M3, a, side="left")
    lo = np.maximum(hi - 1, 0)
    d_hi, d_lo = E4M3[hi] - a, a - E4M3[lo]
    code = np.where(d_lo < d_hi, lo, hi)
    tie = (d_lo == d_hi) & (hi != lo)
    code = np.where(tie, np.where(lo % 2 == 0, lo, hi), code).astype(np.uint8)
    code = code | (np.signbit(y).astype(np.uint8) << np.uint8(7))
    code[nan] = 0x7F  # what compressed-tensors' cast gives for the NaN of x / NaN scale
    return code


def sym_scale(absmax, half_range):
    """compressed-tensors calculate_qparams, symmetric, in BF16: absmax / (range / 2)."""
    scale = bf16_round(absmax / np.float32(half_range))
    return np.where(scale == 0, BF16_EPS, scale).astype(np.float32)


def absmax_of(x, axes):
    """max(|min(x, 0)|, max(x, 0)) over axes, NaN-propagating like torch.amin/amax."""
    mn = np.minimum(x.min(axis=axes), 0)
    mx = np.maximum(x.max(axis=axes), 0)
    return np.maximum(np.abs(mn), np.abs(mx)).astype(np.float32)


# ---------------------------------------------------------------- the two schemes


def w4a16_rows(bits):
    """BF16 bits [r, in] -> (packed I32 [r, in/8], scale BF16 bits [r, in/128])."""
    r, n = bits.shape
    x = bf16_to_f32(bits).reshape(r, n // GROUP, GROUP)
    scale = sym_scale(absmax_of(x, 2), 7.5)  # int4: range 15
    with np.errstate(invalid="ignore", divide="ignore"):
        q = bf16_round(x / scale[:, :, None])
    q = np.rint(np.clip(q, -8, 7))
    q[np.isnan(q)] = 0
    u = (q.astype(np.int32) + 8).astype(np.uint32).reshape(r, n // 8, 8)
    shifts = (np.arange(8, dtype=np.uint32) * np.uint32(4))
    words = np.bitwise_or.reduce(u << shifts, axis=2)
    return words.view(np.int32), f32_to_bf16(scale)


def fp8_block_rows(bits):
    """BF16 bits [r <= 128, in] -> (E4M3 codes [r, in], scale BF16 bits [1, ceil(in/128)])."""
    r, n = bits.shape
    x = bf16_to_f32(bits)
    nb = -(-n // BLOCK)
    pad = nb * BLOCK - n
    padded = np.pad(x, ((0, 0), (0, pad))) if pad else x
    blocks = padded.reshape(r, nb, BLOCK)
    scale = sym_scale(absmax_of(blocks, (0, 2)), 448.0)  # E4M3: range 896
    per_col = np.repeat(scale, BLOCK)[:n]
    with np.errstate(invalid="ignore", divide="ignore"):
        y = bf16_round(x / per_col[None, :])
    y = np.clip(y, -448.0, 448.0)
    return to_e4m3(y), f32_to_bf16(scale)[None, :]


def quantize_weight(scheme, bits):
    """Whole weight (or slice) -> {member suffix: ndarray}; row blocks of 128."""
    out_rows, n = bits.shape
    if scheme == "W4A16":
        packed = np.empty((out_rows, n // 8), np.int32)
        scales = np.empty((out_rows, n // GROUP), np.uint16)
        for r0 in range(0, out_rows, ROWS):
            packed[r0:r0 + ROWS], scales[r0:r0 + ROWS] = w4a16_rows(np.asarray(bits[r0:r0 + ROWS]))
        return {"weight_packed": packed, "weight_scale": scales,
                "weight_shape": np.array([out_rows, n], np.int64)}
    codes = np.empty((out_rows, n), np.uint8)
    scales = np.empty((-(-out_rows // BLOCK), -(-n // BLOCK)), np.uint16)
    for b, r0 in enumerate(range(0, out_rows, BLOCK)):
        codes[r0:r0 + BLOCK], scales[b:b + 1] = fp8_block_rows(np.asarray(bits[r0:r0 + BLOCK]))
    return {"weight": codes, "weight_scale": scales}


def is_quantized(name, shape):
    return name.startswith("model.layers.") and name.endswith("_proj.weight") and len(shape) == 2


def member_specs(scheme, prefix, shape):
    out_rows, n = shape
    if scheme == "W4A16":
        return [(prefix + "weight_packed", "I32", (out_rows, n // 8)),
                (prefix + "weight_scale", "BF16", (out_rows, n // GROUP)),
                (prefix + "weight_shape", "I64", (2,))]
    return [(prefix + "weight", "F8_E4M3", (out_rows, n)),
            (prefix + "weight_scale", "BF16", (-(-out_rows // BLOCK), -(-n // BLOCK)))]


def quantization_config(scheme):
    """The quantization_config model_free_ptq (compressed-tensors 0.19) writes for the preset."""
    null_args = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None,
                 "num_bits": 8, "observer": None, "observer_kwargs": {}, "scale_dtype": None,
                 "strategy": None, "symmetric": True, "type": "int", "zp_dtype": None}
    if scheme == "W4A16":
        group = {"format": "pack-quantized", "input_activations": None, "output_activations": None,
                 "targets": ["Linear"],
                 "weights": {**null_args, "group_size": GROUP, "num_bits": 4, "strategy": "group"}}
        fmt = "pack-quantized"
    else:
        group = {"format": "float-quantized",
                 "input_activations": {**null_args, "dynamic": True, "group_size": 128,
                                       "strategy": "group", "type": "float"},
                 "output_activations": None, "targets": ["Linear"],
                 "weights": {**null_args, "block_structure": [BLOCK, BLOCK], "strategy": "block",
                             "type": "float"}}
        fmt = "float-quantized"
    return {"config_groups": {scheme: group}, "format": fmt, "global_compression_ratio": None,
            "ignore": ["lm_head"], "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed", "transform_config": {}, "version": "0.19.0"}


def llama_config(header):
    """A LlamaForCausalLM config.json for make_corpus.py's Llama-like file (head_dim 64)."""
    embed = header["model.embed_tokens.weight"]["shape"]
    layers = 1 + max(int(k.split(".")[2]) for k in header if k.startswith("model.layers."))
    inter = header["model.layers.0.mlp.gate_proj.weight"]["shape"][0]
    kv = header["model.layers.0.self_attn.k_proj.weight"]["shape"][0]
    head_dim = 64
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
            "hidden_size": embed[1], "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": embed[1] // head_dim, "num_key_value_heads": kv // head_dim,
            "head_dim": head_dim, "vocab_size": embed[0], "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False}


def write_scheme(src, out_dir, scheme):
    header, data_start = read_header(src)
    mm = np.memmap(src, dtype=np.uint8, mode="r")
    specs, source_of, dense = [], {}, set()
    for name in sorted(header):
        info = header[name]
        if is_quantized(name, info["shape"]):
            prefix = name[: -len("weight")]
            for spec in member_specs(scheme, prefix, info["shape"]):
                specs.append(spec)
                source_of[spec[0]] = name
        else:
            specs.append((name, info["dtype"], tuple(info["shape"])))
            source_of[name] = name
            dense.add(name)
    specs.sort(key=lambda s: s[0])
    cache = {}

    def produce(name):
        src_name = source_of[name]
        bits = tensor_view(mm, data_start, header[src_name])
        if name in dense:  # copied unchanged
            flat = bits.reshape(-1).view(np.uint8)
            for i in range(0, flat.size, 1 << 24):
                yield flat[i:i + (1 << 24)].tobytes()
            return
        if src_name not in cache:
            cache.clear()
            cache[src_name] = quantize_weight(scheme, bits)
        yield cache[src_name][name[len(src_name) - len("weight"):]].tobytes()

    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), specs, produce)
    config = llama_config(header)
    config["quantization_config"] = quantization_config(scheme)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------- check against the producer

CHECK_SLICES = [  # (tensor, rows, columns)
    ("model.layers.0.self_attn.k_proj.weight", 256, 2048),
    ("model.layers.0.mlp.down_proj.weight", 256, 5632),
    ("model.layers.0.mlp.gate_proj.weight", 200, 2048),     # a partial row block
    ("model.layers.1.mlp.down_proj.weight", 128, 1024),     # NaN at 0, +Inf at 777, -Inf at 778
]


def check(src):
    import torch
    from llmcompressor.entrypoints.model_free.converter import ModelFreePtqConverter
    from llmcompressor.entrypoints.model_free.validate import validate_config

    header, data_start = read_header(src)
    mm = np.memmap(src, dtype=np.uint8, mode="r")
    failures = 0
    for scheme in ("W4A16", "FP8_BLOCK"):
        config = validate_config(None, scheme, ["lm_head"])
        for name, rows, cols in CHECK_SLICES:
            bits = np.ascontiguousarray(tensor_view(mm, data_start, header[name])[:rows, :cols])
            ours = quantize_weight(scheme, bits)
            weight = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
            theirs = ModelFreePtqConverter(config).process({name: weight})
            prefix = name[: -len("weight")]
            for member, mine in sorted(ours.items()):
                ref = theirs[prefix + member]
                ref_bytes = ref.contiguous().view(torch.uint8).numpy().tobytes() \
                    if ref.dtype in (torch.bfloat16, torch.float8_e4m3fn) else ref.numpy().tobytes()
                same = ref_bytes == mine.tobytes() and tuple(ref.shape) == mine.shape
                verdict = "identical"
                if not same and ref.dtype == torch.bfloat16 and tuple(ref.shape) == mine.shape:
                    # NaN payloads differ between torch's kernel paths: compare NaN as NaN
                    theirs_f = bf16_to_f32(np.frombuffer(ref_bytes, np.uint16))
                    mine_f = bf16_to_f32(mine.reshape(-1))
                    nan = np.isnan(theirs_f)
                    if np.array_equal(nan, np.isnan(mine_f)) and \
                            np.array_equal(theirs_f[~nan].view(np.uint32), mine_f[~nan].view(np.uint32)):
                        same = True
                        verdict = f"identical but for the bits of {int(nan.sum())} NaN"
                if not same:
                    differ = int((np.frombuffer(ref_bytes, np.uint8) != mine.view(np.uint8).reshape(-1)).sum()) \
                        if len(ref_bytes) == mine.nbytes else "all"
                    verdict = f"DIFFERENT ({differ} bytes)"
                print(f"{scheme:9} {name}[:{rows}, :{cols}] {member:14} {str(ref.dtype):20} "
                      f"{tuple(ref.shape)}: {verdict}")
                failures += not same
            extra = sorted(set(theirs) - {prefix + m for m in ours})
            if extra:
                print(f"  compressed-tensors also wrote: {extra}")
                failures += 1
    print("all identical" if failures == 0 else f"{failures} member(s) differ")
    return 1 if failures else 0


def main(argv):
    if argv[:1] == ["--check"] and len(argv) == 2:
        return check(argv[1])
    args = [a for a in argv if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    if len(args) != 2 or opts.get("scheme", "all") not in ("W4A16", "FP8_BLOCK", "all"):
        print(__doc__)
        return 2
    src, out = args
    stem = os.path.basename(src).removesuffix(".safetensors")
    schemes = ["W4A16", "FP8_BLOCK"] if opts.get("scheme", "all") == "all" else [opts["scheme"]]
    for scheme in schemes:
        folder = os.path.join(out, f"{stem}-{scheme.lower().replace('_', '-')}")
        start = time.monotonic()
        write_scheme(src, folder, scheme)
        size = os.path.getsize(os.path.join(folder, "model.safetensors"))
        print(f"{folder}: {size / 2**20:.1f} MiB in {time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
