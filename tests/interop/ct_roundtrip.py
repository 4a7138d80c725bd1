#!/usr/bin/env python3
"""stui's int8 output through compressed-tensors' own checkpoint converter: ct_roundtrip.py STUI

Needs a Python with torch, compressed-tensors and numpy (`pip install torch compressed-tensors
numpy`, several GB: not part of CI). Writes a small Llama-shaped F32 model with its config.json,
quantizes it with `STUI quantize` per channel and per tensor, dequantizes each output with
`convert_checkpoint(..., CompressedTensorsDequantizer)` on the CPU, and checks every dequantized
weight within half a scale of the source and every kept tensor identical. Exits 1 otherwise.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from compressed_tensors.entrypoints.convert import convert_checkpoint
from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
    CompressedTensorsDequantizer,
)
from safetensors.numpy import load_file, save_file

HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 64, 128, 2, 256


def write_model(folder: Path) -> Path:
    rng = np.random.default_rng(7)
    tensors = {
        "model.embed_tokens.weight": rng.normal(0, 0.02, (VOCAB, HIDDEN)),
        "model.norm.weight": np.ones(HIDDEN),
        "lm_head.weight": rng.normal(0, 0.02, (VOCAB, HIDDEN)),
    }
    projections = {
        "self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, HIDDEN),
        "self_attn.v_proj": (HIDDEN, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
        "mlp.gate_proj": (INTERMEDIATE, HIDDEN), "mlp.up_proj": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTERMEDIATE),
    }
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        for name, shape in projections.items():
            tensors[f"{prefix}{name}.weight"] = rng.normal(0, 0.05, shape)
        tensors[prefix + "input_layernorm.weight"] = np.ones(HIDDEN)
        tensors[prefix + "post_attention_layernorm.weight"] = np.ones(HIDDEN)
    path = folder / "model.safetensors"
    save_file({k: v.astype(np.float32) for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": VOCAB, "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return path


def round_trip(stui: str, source: Path, work: Path, granularity: str) -> str:
    out, dense_dir = work / f"int8-{granularity}", work / f"dense-{granularity}"
    out.mkdir()
    subprocess.run([stui, "quantize", f"--{granularity}", str(source), "-o", str(out / "model.safetensors")],
                   check=True, stdout=subprocess.DEVNULL)
    dequantizer = CompressedTensorsDequantizer(str(out), dtype=torch.float32)
    convert_checkpoint(str(out), str(dense_dir), dequantizer, max_workers=1, device="cpu")
    original = load_file(str(source))
    quantized = load_file(str(out / "model.safetensors"))
    dense = load_file(str(dense_dir / "model.safetensors"))
    assert set(dense) == set(original), sorted(set(dense) ^ set(original))
    worst = 0.0
    for name, x in original.items():
        y = dense[name]
        assert y.shape == x.shape, (name, y.shape, x.shape)
        if name + "_scale" in quantized:
            scale = quantized[name + "_scale"].astype(np.float64)
            error = float((np.abs(x.astype(np.float64) - y.astype(np.float64)) / scale).max())
            # Half a scale, plus the float32 rounding of the converter's own `q * scale`.
            assert error <= 0.5 + 1e-5, (name, error)
            worst = max(worst, error)
        else:
            assert np.array_equal(x, y), name
    kept = sum(1 for name in original if name + "_scale" not in quantized)
    return f"{granularity}: {len(original) - kept} weights within {worst:.6f} of a scale, {kept} kept identical"


def main(args):
    if len(args) != 1:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        (work / "source").mkdir()
        source = write_model(work / "source")
        for granularity in ("per-channel", "per-tensor"):
            print(round_trip(args[0], source, work, granularity))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
