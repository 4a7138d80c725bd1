#!/usr/bin/env python3
"""Writes a compressed-tensors W4A16 mixture of experts as sharded files whose headers are real and
whose data is sparse (holes: no disk space, reads give zeros) but for each weight's
`weight_shape`, the member whose values a reader needs to know the weight.

usage: make_w4a16_moe_layout.py OUT_DIR [--shards 16]

The layout of Qwen3-30B-A3B quantized by llm-compressor's W4A16 preset (48 layers, 128 experts of
width 768 each, hidden 2048, 32 query heads and 4 key-value heads of 128, vocabulary 151,936;
lm_head, embeddings, norms and routers kept in BF16): every Linear as `weight_packed` I32
[out, in/8], `weight_scale` BF16 [out, in/128] and `weight_shape` I64 [2]. Each shard's tensors
are placed as the safetensors library places them (by dtype, the widest alignment first, then by
name), so a shard's `weight_shape` members lie side by side at the start of its data.
"""
import json
import os
import struct
import sys

out = sys.argv[1]
shards = int(sys.argv[sys.argv.index("--shards") + 1]) if "--shards" in sys.argv else 16
os.makedirs(out, exist_ok=True)
H, I_MOE, EXPERTS, LAYERS, VOCAB, HEADS, KV, HEAD_DIM = 2048, 768, 128, 48, 151936, 32, 4, 128
config = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H,
    "intermediate_size": 6144, "moe_intermediate_size": I_MOE, "num_hidden_layers": LAYERS,
    "num_experts": EXPERTS, "num_experts_per_tok": 8, "num_attention_heads": HEADS,
    "num_key_value_heads": KV, "head_dim": HEAD_DIM, "vocab_size": VOCAB, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "decoder_sparse_step": 1, "mlp_only_layers": [],
    "quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(LAYERS)],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
            "dynamic": False, "observer": "minmax"}, "input_activations": None, "output_activations": None}},
    },
}
SIZE = {"BF16": 2, "I32": 4, "I64": 8}
ORDER = {"I64": 0, "I32": 1, "BF16": 2}  # the safetensors library's order: widest dtype first
tensors, shapes = [], {}


def linear(name, rows, cols):
    tensors.append((f"{name}.weight_packed", "I32", [rows, cols // 8]))
    tensors.append((f"{name}.weight_scale", "BF16", [rows, cols // 128]))
    tensors.append((f"{name}.weight_shape", "I64", [2]))
    shapes[f"{name}.weight_shape"] = (rows, cols)


tensors.append(("model.embed_tokens.weight", "BF16", [VOCAB, H]))
for i in range(LAYERS):
    p = f"model.layers.{i}"
    tensors.append((f"{p}.input_layernorm.weight", "BF16", [H]))
    tensors.append((f"{p}.post_attention_layernorm.weight", "BF16", [H]))
    a = f"{p}.self_attn"
    linear(f"{a}.q_proj", HEADS * HEAD_DIM, H)
    linear(f"{a}.k_proj", KV * HEAD_DIM, H)
    linear(f"{a}.v_proj", KV * HEAD_DIM, H)
    linear(f"{a}.o_proj", H, HEADS * HEAD_DIM)
    tensors.append((f"{a}.q_norm.weight", "BF16", [HEAD_DIM]))
    tensors.append((f"{a}.k_norm.weight", "BF16", [HEAD_DIM]))
    tensors.append((f"{p}.mlp.gate.weight", "BF16", [EXPERTS, H]))
    for e in range(EXPERTS):
        linear(f"{p}.mlp.experts.{e}.gate_proj", I_MOE, H)
        linear(f"{p}.mlp.experts.{e}.up_proj", I_MOE, H)
        linear(f"{p}.mlp.experts.{e}.down_proj", H, I_MOE)
tensors.append(("model.norm.weight", "BF16", [H]))
tensors.append(("lm_head.weight", "BF16", [VOCAB, H]))

per = -(-len(tensors) // shards)
weight_map, total = {}, 0
for s in range(shards):
    part = sorted(tensors[s * per:(s + 1) * per], key=lambda t: (ORDER[t[1]], t[0]))
    name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    header, offset, values = {}, 0, []
    for tname, dtype, shape in part:
        n = SIZE[dtype]
        for d in shape:
            n *= d
        header[tname] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        if tname in shapes:
            values.append((offset, struct.pack("<2q", *shapes[tname])))
        offset += n
        total += n
        weight_map[tname] = name
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        start = 8 + len(text)
        for at, data in values:
            f.seek(start + at)
            f.write(data)
        f.truncate(start + offset)
with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
print(f"{len(tensors)} tensors, {len(shapes)} quantized weights in {shards} shards, {total / 2**30:.1f} GiB")
