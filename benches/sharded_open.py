#!/usr/bin/env python3
"""Times opening a sharded model: sharded_open.py [--runs N] MODEL_DIR LABEL=COMMAND ...

The baseline is measured in this process: the index read with `json`, then every shard opened with
`safetensors.safe_open` and each tensor's name and shape read (the keys-and-shapes loop a Python
tool runs), interpreter start-up and imports not counted. The commands (whole processes, output
discarded, split on spaces) run in turn with it, round after round, after one unrecorded warm-up
round, so drift on a shared machine hits them alike. Prints the median, min and max wall time of
each and its median as a ratio of the baseline's, and the median CPU time (user and system, all
threads) and its ratio. Run it with a Python that has `safetensors` and
`numpy`.
"""
import json
import os
import statistics
import sys
import time

from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whole_process import run_once  # noqa: E402


def python_loop(folder):
    start, cpu = time.monotonic(), time.process_time()
    with open(os.path.join(folder, "model.safetensors.index.json")) as index:
        shards = sorted(set(json.load(index)["weight_map"].values()))
    count = 0
    for shard in shards:
        with safe_open(os.path.join(folder, shard), "numpy") as file:
            for name in file.keys():
                file.get_slice(name).get_shape()
                count += 1
    return time.monotonic() - start, time.process_time() - cpu, count


def main(args):
    runs = 11
    if args[:1] == ["--runs"]:
        runs, args = int(args[1]), args[2:]
    if len(args) < 1 or any("=" not in a for a in args[1:]):
        print(__doc__)
        return 2
    folder = args[0]
    commands = [(a.split("=", 1)[0], a.split("=", 1)[1].split()) for a in args[1:]]
    baseline = "python safe_open loop"
    results = {label: [] for label in [baseline] + [label for label, _ in commands]}
    tensors = 0
    for round_index in range(runs + 1):
        elapsed, cpu, tensors = python_loop(folder)
        if round_index > 0:
            results[baseline].append((elapsed, cpu))
        for label, argv in commands:
            wall, cpu, _ = run_once(argv)
            if round_index > 0:
                results[label].append((wall, cpu))
    print(f"{tensors} tensors, {runs} rounds")
    base = statistics.median(s[0] for s in results[baseline])
    base_cpu = statistics.median(s[1] for s in results[baseline])
    print(f"{'command':<28}{'median s':>10}{'min s':>9}{'max s':>9}{'ratio':>8}{'cpu s':>9}{'cpu ratio':>10}")
    for label, samples in results.items():
        walls = [s[0] for s in samples]
        median, cpu = statistics.median(walls), statistics.median(s[1] for s in samples)
        print(f"{label:<28}{median:>10.4f}{min(walls):>9.4f}{max(walls):>9.4f}{median / base:>8.2f}"
              f"{cpu:>9.4f}{cpu / base_cpu:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
