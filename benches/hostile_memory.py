#!/usr/bin/env python3
"""Memory and time of the headless commands on hostile input: hostile_memory.py STUI [DIR]

Writes the hostile set (about 300 MB) into DIR (a temporary folder, removed after, by default),
runs `STUI check`, `STUI inspect`, `STUI inspect --json`, `STUI stats` and `STUI stats --json`
on each file (output discarded), and prints a table of peak resident memory (from
wait4), wall time and exit code against the bound: twice the header bytes the file really holds
plus 64 MiB. Exits 1 if any run goes over its bound, is killed by a signal, or exits with a code
other than 0, 1 or 2; so CI can run it. Time per header MiB shows that time stays linear: the
100,000- and 1,000,000-tensor headers should take about the same for the header commands (the
statistics also read every tensor and, with `--json`, print a histogram of each: 2.4 GB of JSON
for the million tensors).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
COMMANDS = [["check"], ["inspect"], ["inspect", "--json"], ["stats"], ["stats", "--json"]]


def safetensors(path, header: bytes, data: bytes = b"", declared=None):
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header) if declared is None else declared))
        out.write(header)
        out.write(data)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def many_tensors(count):
    parts = ",".join(
        f'"t.{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(count)
    )
    return ("{" + parts + "}").encode()


def build(folder):
    """The hostile set: (label, path given to stui, header bytes the file holds)."""
    cases = []

    def add(label, name, header, data=b"", declared=None):
        path = os.path.join(folder, name)
        safetensors(path, header, data, declared)
        held = min(len(header), declared if declared is not None else len(header))
        cases.append((label, path, held))

    add("header length u64::MAX", "u64max.safetensors", b'{"a":1}', declared=2**64 - 1)
    add("header length past the end", "past-end.safetensors", b'{"a":', declared=1 << 20)
    deep = b'{"a":' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    add("10,000-deep nesting", "deep.safetensors", deep)
    overflow = json.dumps({"a": entry("F32", [2**32, 2**32, 2**32], 0, 4)}).encode()
    add("shape product overflows u64", "overflow.safetensors", overflow, b"\0" * 4)
    rank = json.dumps({"a": entry("U8", [1] * 100_000, 0, 1)}).encode()
    add("rank-100,000 shape", "rank.safetensors", rank, b"\0")
    add("100,000 tensors", "100k.safetensors", many_tensors(100_000), b"\0" * 100_000)
    add("1,000,000 tensors", "1m.safetensors", many_tensors(1_000_000), b"\0" * 1_000_000)
    big = json.dumps({"__metadata__": {"big": "v" * 99_000_000}, "a": entry("U8", [1], 0, 1)})
    add("99 MB metadata value", "big-value.safetensors", big.encode(), b"\0")
    name = json.dumps({"n" * MIB: entry("U8", [1], 0, 1)}).encode()
    add("1 MiB name", "long-name.safetensors", name, b"\0")

    shards = os.path.join(folder, "shards")
    os.mkdir(shards)
    index = {"metadata": {}, "weight_map": {f"t.{i}": f"shard-{i}.safetensors" for i in range(10_000)}}
    index_path = os.path.join(shards, "model.safetensors.index.json")
    with open(index_path, "w") as out:
        json.dump(index, out)
    cases.append(("index naming 10,000 shards", index_path, os.path.getsize(index_path)))

    escape = os.path.join(folder, "escape")
    os.mkdir(escape)
    index_path = os.path.join(escape, "model.safetensors.index.json")
    with open(index_path, "w") as out:
        json.dump({"weight_map": {"a": "../u64max.safetensors"}}, out)
    cases.append(("shard path outside its folder", index_path, os.path.getsize(index_path)))

    loop = os.path.join(folder, "loop")
    os.mkdir(loop)
    os.symlink("b.safetensors", os.path.join(loop, "a.safetensors"))
    os.symlink("a.safetensors", os.path.join(loop, "b.safetensors"))
    os.symlink(".", os.path.join(loop, "self"))
    cases.append(("symlink loop in a folder", loop, 0))
    return cases


def measure(argv):
    """Wall time, peak resident bytes and wait status of one run. The peak cannot be less than
    this Python process's own resident size (about 14 MiB), which the child holds until it execs;
    above that it is stui's."""
    null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    start = time.monotonic()
    pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=null)
    _, status, usage = os.wait4(pid, 0)
    return time.monotonic() - start, usage.ru_maxrss * 1024, status


def main(args):
    if args[:1] == ["--build"]:
        json.dump(build(args[1]), sys.stdout)
        return 0
    if not args:
        print(__doc__)
        return 2
    stui = args[0]
    if len(args) > 1:
        folder = args[1]
        os.makedirs(folder, exist_ok=True)
    else:
        temporary = tempfile.TemporaryDirectory(prefix="stui-hostile-")
        folder = temporary.name
    # Built by another process, so that this one stays small.
    built = subprocess.run([sys.executable, __file__, "--build", folder], check=True,
                           stdout=subprocess.PIPE)
    cases = json.loads(built.stdout)
    failed = False
    names = " | ".join(f"`{' '.join(c)}` MiB" for c in COMMANDS)
    print(f"| input | bound MiB | {names} | slowest s | s per header MiB | exit codes |")
    print("| --- " * (len(COMMANDS) + 5) + "|")
    for label, path, header in cases:
        bound = 2 * header + 64 * MIB
        peaks, slowest, codes = [], 0.0, []
        for command in COMMANDS:
            seconds, peak, status = measure([stui, *command, path])
            code = os.waitstatus_to_exitcode(status)
            ok = peak <= bound and code in (0, 1, 2)
            failed |= not ok
            mark = "" if ok else " **over**" if code in (0, 1, 2) else f" **signal {-code}**"
            peaks.append(f"{peak / MIB:.1f}{mark}")
            slowest = max(slowest, seconds)
            codes.append(str(code))
        per_mib = f"{slowest / (header / MIB):.3f}" if header >= MIB else "-"
        print(f"| {label} | {bound / MIB:.1f} | {' | '.join(peaks)} | {slowest:.2f} | {per_mib} | "
              f"{', '.join(sorted(set(codes)))} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
