#!/usr/bin/env python3
"""Times whole commands side by side:
whole_process.py [--runs N] [--settle FOLDER] LABEL=COMMAND ...

Runs the commands in turn, round after round (so drift on a shared machine hits them alike),
after one unrecorded warm-up round, and prints for each the median, min and max wall time, the
median CPU time and the peak resident memory, and its median wall time as a ratio of the first
command's. Output is discarded. Commands are split on spaces (no shell).

--settle FOLDER: before each command, untimed, removes the files in FOLDER (the outputs of the
commands before), syncs and waits a second, so that no command pays for the write-back or the
freed blocks of the one before it.
"""
import os
import statistics
import subprocess
import sys
import time


def settle(folder):
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            os.remove(path)
    os.sync()
    time.sleep(1)


def run_once(argv):
    start = time.monotonic()
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(child.pid, 0)
    return time.monotonic() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main(args):
    runs, folder = 11, None
    while args[:1] in (["--runs"], ["--settle"]):
        if args[0] == "--runs":
            runs = int(args[1])
        else:
            folder = args[1]
        args = args[2:]
    if not args or any("=" not in a for a in args):
        print(__doc__)
        return 2
    commands = [(a.split("=", 1)[0], a.split("=", 1)[1].split()) for a in args]
    results = {label: [] for label, _ in commands}
    for round_index in range(runs + 1):
        for label, argv in commands:
            if folder is not None:
                settle(folder)
            sample = run_once(argv)
            if round_index > 0:
                results[label].append(sample)
    base = statistics.median(s[0] for s in results[commands[0][0]])
    print(f"{'command':<28}{'median s':>10}{'min s':>9}{'max s':>9}{'cpu s':>9}{'peak MiB':>10}{'ratio':>8}")
    for label, _ in commands:
        walls = [s[0] for s in results[label]]
        median = statistics.median(walls)
        cpu = statistics.median(s[1] for s in results[label])
        peak = max(s[2] for s in results[label])
        print(f"{label:<28}{median:>10.4f}{min(walls):>9.4f}{max(walls):>9.4f}{cpu:>9.4f}"
              f"{peak:>10.1f}{median / base:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
