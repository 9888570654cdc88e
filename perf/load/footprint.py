#!/usr/bin/env python3
"""The code a webhook request runs, from callgrind files (docs/DEVELOPMENT.md#code-footprint).

    footprint.py NAME=BIG:SMALL [NAME=BIG:SMALL ...] [--ratio R] [--top N]

Each BIG and SMALL is a callgrind file (`--dump-instr=yes --dump-line=no --compress-pos=no
--compress-strings=no`) of the same server on the same connections, BIG with R times the
requests of SMALL (perf/load/footprint.sh makes them). A function whose instruction count
grows with the requests (more than 0.6 R from SMALL to BIG) runs per request; the rest ran per
connection or once. Prints, per server, the distinct 64-byte lines of per-request code (what a
request fetches again when its caches went cold between requests) and their instructions, by
crate and by function. The crate of a generic function is the crate of its first type
(`<k8s_openapi::...::Toleration as serde::Deserialize>` is k8s_openapi's; a serde visitor,
`PhantomData<T> as DeserializeSeed`, is counted under core).
"""

import argparse
import collections
import re


def load(path):
    """Per function: the set of 64-byte code lines it ran, and its own instructions."""
    lines = collections.defaultdict(set)
    instructions = collections.Counter()
    function = None
    skip_call_cost = False
    with open(path, errors="replace") as file:
        for raw in file:
            line = raw.rstrip("\n")
            if skip_call_cost:  # the line after calls= is the callee's inclusive cost
                skip_call_cost = False
                continue
            if line.startswith("fn="):
                function = line[3:]
            elif line.startswith("calls="):
                skip_call_cost = True
            elif line.startswith("0x") and function is not None:
                fields = line.split()
                try:
                    address = int(fields[0], 16)
                    count = int(fields[1]) if len(fields) > 1 else 0
                except ValueError:
                    continue
                lines[function].add(address >> 6)
                instructions[function] += count
    return lines, instructions


def crate(function):
    name = function
    for _ in range(6):
        inner = re.match(r"(?:core::ptr::drop_in_place|alloc::\w+::\w+)<(.*)>$", name)
        if inner:
            name = inner.group(1)
        elif name.startswith("<"):
            name = re.sub(r"^&(mut )?", "", name[1:])
        else:
            break
    path = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", name)
    return path.group(1) if path else name.split("(")[0][:40]


def per_request(big, small, ratio):
    big_lines, big_counts = load(big)
    _, small_counts = load(small)
    functions = {
        function: (big_lines[function], big_counts[function])
        for function in big_lines
        if big_counts[function] > 0.6 * ratio * max(small_counts.get(function, 0), 1)
        or small_counts.get(function, 0) == 0
    }
    return functions


def kib(lines):
    return len(lines) * 64 / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=BIG.callgrind:SMALL.callgrind")
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    servers = {}
    for run in args.runs:
        name, files = run.split("=", 1)
        big, small = files.split(":", 1)
        servers[name] = per_request(big, small, args.ratio)

    by_crate = {}
    for name, functions in servers.items():
        crates = collections.defaultdict(set)
        for function, (lines, _) in functions.items():
            crates[crate(function)] |= lines
        by_crate[name] = crates
        total = set().union(*(lines for lines, _ in functions.values())) if functions else set()
        print(f"{name}: {kib(total):.0f} KiB of code a request ({len(total)} lines)")

    names = list(servers)
    print("\nKiB a request by crate: " + "  ".join(f"{name:>10}" for name in names))
    every = set().union(*(set(crates) for crates in by_crate.values()))
    first = by_crate[names[-1]]
    for krate in sorted(every, key=lambda c: -kib(first.get(c, set())))[: args.top * 2]:
        cells = "  ".join(f"{kib(by_crate[name].get(krate, set())):10.1f}" for name in names)
        print(f"{krate[:40]:40} {cells}")

    for name, functions in servers.items():
        print(f"\n{name}: the largest per-request functions (KiB, instructions)")
        ranked = sorted(functions.items(), key=lambda item: -len(item[1][0]))
        for function, (lines, count) in ranked[: args.top]:
            print(f"{kib(lines):6.1f} {count:12d}  {function[:160]}")


if __name__ == "__main__":
    main()
