#!/usr/bin/env python3
"""Memory and time of stui on hostile input: hostile_memory.py STUI [DIR]

Writes the hostile set (about 800 MB) into DIR (a temporary folder, removed after, by default),
runs `STUI check`, `STUI inspect`, `STUI inspect --json`, `STUI stats`, `STUI stats --json`,
`STUI hash --per-tensor`, `STUI diff` (of the input with itself) and `STUI quantize` (into a
temporary folder) on each input (output discarded), and the explorer in an 80x24 tmux pane until its scan is done (when tmux is
installed), and prints a table of peak resident memory (from wait4), wall time (of the slowest
headless command) and exit codes against the bound: twice the header bytes the file really holds
plus 64 MiB (for `diff`, which reads two headers, twice both). Exits 1 if any run goes over its
bound, is killed by a signal, or exits with a code other than 0, 1 or 2; so CI can run it. Time
per header MiB shows that time stays linear: the 100,000- and 1,000,000-tensor headers should
take about the same for the header commands (the statistics also read every tensor and, with
`--json`, print a histogram of each: 2.4 GB of JSON for the million tensors).
"""
import itertools
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
COMMANDS = [["check"], ["inspect"], ["inspect", "--json"], ["stats"], ["stats", "--json"],
            ["hash", "--per-tensor"]]


def safetensors(path, header: bytes, data: bytes = b"", declared=None):
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header) if declared is None else declared))
        out.write(header)
        out.write(data)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def many_tensors(count, name="t.{}", dtype="U8", size=1, shape="[1]"):
    """`count` tensors of one element named by `name`, in the order of their numbers."""
    parts = ",".join(
        f'"{name.format(i)}":{{"dtype":"{dtype}","shape":{shape},'
        f'"data_offsets":[{i * size},{(i + 1) * size}]}}'
        for i in range(count)
    )
    return ("{" + parts + "}").encode()


def at_limit(names):
    """Empty tensors, one per name, in the shortest entries there are, until the header is close
    to the format's limit of 100,000,000 bytes: the most entries (and tree nodes) a header holds."""
    entries, size = [], 2
    for name in names:
        entry = f'"{name}":{{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'
        if size + len(entry) + 1 > 99_000_000:
            break
        entries.append(entry)
        size += len(entry) + 1
    return ("{" + ",".join(entries) + "}").encode()


def short_names():
    """Every four-character name, in the order of their bytes."""
    alphabet = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
    return ("".join(chars) for chars in itertools.product(alphabet, repeat=4))


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
    # Two tree nodes a tensor, a numbered layer each, and a float to scan: names in numeric order,
    # which is not the order of their bytes (`10` before `9`).
    nested = many_tensors(1_000_000, name="model.layers.{}.w", dtype="F32", size=4)
    add("1,000,000 nested F32 names", "1m-nested.safetensors", nested, b"\0" * 4_000_000)
    # Every tensor a weight to quantize, with a scale to write beside it: as many as fit in the
    # output's header.
    weights = many_tensors(550_000, name="l.{}.weight", dtype="F32", size=4, shape="[1,1]")
    add("550,000 weights to quantize", "weights.safetensors", weights,
        struct.pack("<f", 0.5) * 550_000)
    # A finding for every entry: dtypes the format does not define.
    unknown = many_tensors(1_000_000, dtype="X8")
    add("1,000,000 unknown dtypes", "1m-unknown.safetensors", unknown, b"\0" * 1_000_000)
    # Data in the reverse order of the names: a scan in file order finishes them last to first.
    count = 1_000_000
    reverse = ",".join(
        f'"t.{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{count - 1 - i},{count - i}]}}'
        for i in range(count)
    )
    add("1,000,000 tensors stored in reverse", "1m-reverse.safetensors",
        ("{" + reverse + "}").encode(), b"\0" * count)
    # Near the header limit: the most entries, then the most groups, the longest chains of
    # parts and the deepest branching that 100 MB of header can make.
    add("1.8 million shortest entries", "short.safetensors", at_limit(short_names()))
    add("1.7 million names in pairs", "pairs.safetensors",
        at_limit(f"{name}.{end}" for name in short_names() for end in "xy"))
    add("1.3 million 11-part names", "chains.safetensors",
        at_limit(f"{name}.a.b.c.d.e.f.g.h.i.j" for name in short_names()))
    add("1.1 million names branching at each of 21 parts", "binary.safetensors",
        at_limit(".".join(f"{i:021b}") for i in itertools.count()))
    keys = ",".join(f'"{i:x}":""' for i in range(8_000_000))
    add("8,000,000 metadata keys", "metadata-keys.safetensors",
        ('{"__metadata__":{' + keys + "}}").encode())
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

    for label, name, count, shard in [
        ("index naming 300,000 shards", "many-shards", 300_000, "s{}.safetensors"),
        ("index of 7,000,000 entries", "many-entries", 7_000_000, "s"),
    ]:
        os.mkdir(os.path.join(folder, name))
        index_path = os.path.join(folder, name, "model.safetensors.index.json")
        with open(index_path, "w") as out:
            out.write('{"weight_map":{')
            out.write(",".join(f'"{i:x}":"{shard.format(i)}"' for i in range(count)))
            out.write("}}")
        cases.append((label, index_path, os.path.getsize(index_path)))

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


def quantize(stui, path):
    """Like `measure`, for `stui quantize` into a temporary folder beside nothing else."""
    with tempfile.TemporaryDirectory(prefix="stui-quantize-") as folder:
        return measure([stui, "quantize", "-o", os.path.join(folder, "out.safetensors"), path])


def explore(stui, path):
    """Like `measure`, for the explorer: run in a detached tmux pane until its scan is done (or
    it has left), then quit with `q`."""
    with tempfile.TemporaryDirectory(prefix="stui-explore-") as folder:
        result = os.path.join(folder, "result")
        session = f"stui-hostile-{os.getpid()}"
        wrapper = shlex.join([sys.executable, __file__, "--peak", result, stui, path])
        start = time.monotonic()
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24",
                        wrapper], check=True)
        quit_sent = False
        while not os.path.exists(result) and time.monotonic() - start < 120:
            pane = subprocess.run(["tmux", "capture-pane", "-t", session, "-p"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if not quit_sent and ("scan done" in pane.stdout or "cannot be read" in pane.stdout):
                subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=False)
                quit_sent = True
            time.sleep(0.2)
        subprocess.run(["tmux", "kill-session", "-t", session], stderr=subprocess.DEVNULL,
                       check=False)
        if not os.path.exists(result):
            return time.monotonic() - start, 0, 9  # as if killed: it did not finish
        with open(result) as written:
            peak, status = (int(word) for word in written.read().split())
        return time.monotonic() - start, peak, status


def main(args):
    if args[:1] == ["--build"]:
        json.dump(build(args[1]), sys.stdout)
        return 0
    if args[:1] == ["--peak"]:
        # Inside the tmux pane: run the explorer on this terminal and note its peak and status.
        pid = os.posix_spawn(args[2], args[2:], os.environ)
        _, status, usage = os.wait4(pid, 0)
        with open(args[1] + ".part", "w") as out:
            out.write(f"{usage.ru_maxrss * 1024} {status}")
        os.rename(args[1] + ".part", args[1])
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
    # (column, run, whether its time counts (the explorer's includes waiting on tmux), how many
    # headers it reads: `diff` compares the file with itself, so its bound counts it twice)
    runs = [(f"`{' '.join(c)}` MiB", lambda path, c=c: measure([stui, *c, path]), True, 1)
            for c in COMMANDS]
    runs.append(("`diff` (two headers) MiB", lambda path: measure([stui, "diff", path, path]),
                 True, 2))
    runs.append(("`quantize` MiB", lambda path: quantize(stui, path), True, 1))
    if shutil.which("tmux"):
        runs.append(("explorer MiB", lambda path: explore(stui, path), False, 1))
    names = " | ".join(name for name, _, _, _ in runs)
    print(f"| input | bound MiB | {names} | slowest s | s per header MiB | exit codes |")
    print("| --- " * (len(runs) + 5) + "|")
    for label, path, header in cases:
        bound = 2 * header + 64 * MIB
        peaks, slowest, codes = [], 0.0, []
        for _, run, timed, headers in runs:
            seconds, peak, status = run(path)
            code = os.waitstatus_to_exitcode(status)
            ok = peak <= 2 * headers * header + 64 * MIB and code in (0, 1, 2)
            failed |= not ok
            mark = "" if ok else " **over**" if code in (0, 1, 2) else f" **signal {-code}**"
            peaks.append(f"{peak / MIB:.1f}{mark}")
            if timed:
                slowest = max(slowest, seconds)
            codes.append(str(code))
        per_mib = f"{slowest / (header / MIB):.3f}" if header >= MIB else "-"
        print(f"| {label} | {bound / MIB:.1f} | {' | '.join(peaks)} | {slowest:.2f} | {per_mib} | "
              f"{', '.join(sorted(set(codes)))} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
