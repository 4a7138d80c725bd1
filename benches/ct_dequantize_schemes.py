#!/usr/bin/env python3
"""Every scheme's output through compressed-tensors' own converter: ct_dequantize_schemes.py STUI SOURCE_DIR

Needs torch and compressed-tensors (not part of CI). Quantizes SOURCE_DIR (a model folder with its
config.json) with `STUI quantize --scheme S` for every scheme, dequantizes each output with
`convert_checkpoint(..., CompressedTensorsDequantizer)` on the CPU, and prints, per scheme, the
worst error of any dequantized weight in steps of its grid (the half-step bound: at most 0.5)
and the lowest SNR, with every kept tensor identical. The converter computes in the scale's dtype
(BF16 for a BF16 model), so its values are the exact dequantization rounded to that dtype (the
values `tests/interop/schemes_numpy.py` computes as the loader does: how many differ is printed): the
bound is checked with that rounding allowed (half a unit in the last place of the scale dtype at
the value), and the distance from the exact dequantization (numpy, from the layout) printed in
those units. It also prints how far the converter's SNR of each weight is from the one `stui`
reported when saving it (`--json`), which measures the values as this converter computes them:
a difference beyond 0.001 dB fails too. Exits 1 when a bound fails.
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
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "interop"))
import schemes_numpy  # noqa: E402  the grid steps of each layout

SCHEMES = ["W8A8", "W8A16", "W4A16", "W4A16_ASYM", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16"]


def main():
    stui, source_dir = sys.argv[1], Path(sys.argv[2])
    source = load_file(str(source_dir / "model.safetensors"))
    failed = False
    for scheme in SCHEMES:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "q"
            out.mkdir()
            saved = subprocess.run([stui, "quantize", str(source_dir / "model.safetensors"), "-o",
                                    str(out / "model.safetensors"), "--scheme", scheme, "--json"],
                                   check=True, stdout=subprocess.PIPE)
            reported = {w["name"]: w["snr_db"] for w in json.loads(saved.stdout)["quantized"]}
            dense_dir = Path(tmp) / "dense"
            dequantizer = CompressedTensorsDequantizer(str(out), dtype=torch.float64)
            convert_checkpoint(str(out), str(dense_dir), dequantizer, max_workers=1, device="cpu")
            dense = load_file(str(dense_dir / "model.safetensors"))
            header, meta, body = schemes_numpy.read(str(out / "model.safetensors"))
            config = json.loads(meta["quantization_config"])
            worst_steps, worst_rounding, lowest_snr, count = 0.0, 0.0, float("inf"), 0
            snr_gap, differs = 0.0, 0
            for name, x in source.items():
                x = x.to(torch.float64).numpy()
                y = dense[name].to(torch.float64).numpy()
                if name + "_scale" not in header:
                    failed |= not np.array_equal(x, y)
                    continue
                back, step, loaded = schemes_numpy.dequantize(header, body, name, config)
                differs += int(np.count_nonzero(y != loaded))
                # Half a unit in the last place at the value of the type the converter computes
                # in: the scales' (8 significant bits for BF16, 11 for F16, 24 for F32), BF16 for
                # NVFP4 whatever the model's type; subnormal values have the smallest normal's.
                scale_dtype = header[name + "_scale"]["dtype"]
                if scale_dtype == "F8_E4M3":
                    scale_dtype = "BF16"
                digits, lowest = {"BF16": (8, -126), "F16": (11, -14), "F32": (24, -126),
                                  "F64": (53, -1022)}[scale_dtype]
                exponent = np.floor(np.log2(np.maximum(np.abs(back), 1e-300)))
                half_ulp = np.exp2(np.maximum(exponent, lowest) - digits)
                rounding = float(np.max(np.abs(y - back) / half_ulp))
                beyond = np.abs(x - y) > 0.5 * step + half_ulp + np.abs(x) * 2.0**-22
                worst_rounding = max(worst_rounding, rounding)
                worst_steps = max(worst_steps, float(np.max((np.abs(x - y) - half_ulp).clip(0) / step)))
                failed |= bool(np.any(beyond))
                snr = 10 * np.log10(np.sum(x * x) / np.sum((x - y) ** 2))
                lowest_snr = min(lowest_snr, snr)
                snr_gap = max(snr_gap, abs(snr - reported[name]))
                count += 1
            ok = worst_steps <= 0.5 + 1e-4 and snr_gap <= 1e-3
            failed |= not ok
            print(f"{scheme:<12} {count} weights  worst {worst_steps:.4f} steps beyond the dtype's rounding"
                  f"  converter vs exact {worst_rounding:.2f} half-ulps  lowest SNR {lowest_snr:.2f} dB"
                  f"  SNR vs stui's {snr_gap:.6f} dB  values unlike numpy's loader {differs}"
                  f"  {'ok' if ok else 'BEYOND THE BOUND'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
