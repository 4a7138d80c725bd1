#!/usr/bin/env python3
"""stui's output beside llm-compressor's for the same source: compare_llmcompressor.py STUI FIXTURES

FIXTURES is tests/fixtures/quant (the source model and llm-compressor's `model_free_ptq` outputs,
ct-*). Needs numpy only. For each scheme: the tensors (names, dtypes, shapes) each writes, the
`config_groups` and `format` of each `quantization_config`, and each weight's SNR, both outputs
dequantized exactly from their layouts by schemes_numpy.py.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "interop"))
import schemes_numpy  # noqa: E402

PAIRS = [("W8A16", "ct-w8a16"), ("W4A16", "ct-w4a16"), ("W4A16_ASYM", "ct-w4a16-asym"),
         ("FP8_DYNAMIC", "ct-fp8-dynamic"), ("FP8_BLOCK", "ct-fp8-block"), ("NVFP4A16", "ct-nvfp4a16")]


def snrs(source, path, config):
    header, _, body = schemes_numpy.read(path)
    source_header, _, source_body = source
    out = {}
    for name in source_header:
        if name + "_scale" in header:
            x = schemes_numpy.floats(*schemes_numpy.raw(source_header, source_body, name))
            back, _ = schemes_numpy.dequantize(header, body, name, config)
            out[name] = 10 * np.log10(np.sum(x * x) / np.sum((x - back) ** 2))
    return header, out


def main():
    stui, fixtures = sys.argv[1], Path(sys.argv[2])
    source_path = fixtures / "source" / "model.safetensors"
    source = schemes_numpy.read(str(source_path))
    for scheme, folder in PAIRS:
        theirs_config = json.loads((fixtures / folder / "config.json").read_text())["quantization_config"]
        with tempfile.TemporaryDirectory() as tmp:
            ours_path = Path(tmp) / "model.safetensors"
            subprocess.run([stui, "quantize", str(source_path), "-o", str(ours_path), "--scheme", scheme],
                           check=True, stdout=subprocess.DEVNULL)
            ours_config = json.loads(schemes_numpy.read(str(ours_path))[1]["quantization_config"])
            ours_header, ours = snrs(source, str(ours_path), ours_config)
        theirs_header, theirs = snrs(source, str(fixtures / folder / "model.safetensors"), theirs_config)
        layout = lambda h: {k: (v["dtype"], v["shape"]) for k, v in h.items()}
        a, b = layout(ours_header), layout(theirs_header)
        differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        same_groups = ours_config["config_groups"] == theirs_config["config_groups"]
        same_keys = sorted(ours_config) == sorted(theirs_config)
        common = sorted(set(ours) & set(theirs))
        margins = [ours[k] - theirs[k] for k in common]
        print(f"{scheme:<12} tensors differing: {differing or 'none'}")
        print(f"{'':<12} config keys same: {same_keys}, config_groups same: {same_groups}, format same: "
              f"{ours_config['format'] == theirs_config['format']}")
        print(f"{'':<12} {len(common)} weights: SNR stui - llm-compressor min {min(margins):+.3f} dB, "
              f"mean {np.mean(margins):+.3f} dB (stui {min(ours[k] for k in common):.2f}..{max(ours[k] for k in common):.2f},"
              f" llm-compressor {min(theirs[k] for k in common):.2f}..{max(theirs[k] for k in common):.2f})")


if __name__ == "__main__":
    main()
