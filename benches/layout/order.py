#!/usr/bin/env python3
"""Turns callgrind runs of the release binary into lld's symbol ordering file.

    order.py LINK_MAP OUTPUT STEADY_FILE... [--startup STARTUP_FILE...]

LINK_MAP is lld's `-Map` of the binary that ran (GPU_GUARD_LINK_MAP, see build.rs); each
callgrind file comes from `valgrind --tool=callgrind --dump-instr=yes --dump-line=no
--compress-pos=no --compress-strings=no`: STEADY_FILEs of the work after start-up, STARTUP_FILEs
of start-up (dumped with `callgrind_control -d` once ready). Every input code section of the map
in which an instruction ran is named once, by its first symbol: first what ran after start-up,
hottest (most instructions run) first, so the request path is packed together; then what ran
only at start-up, hottest first.
Prints how much code ran against the whole, how much of what ran it could name, and how many
names of the list being replaced the binary still has.
"""

import bisect
import re
import sys

# VMA LMA Size Align, then one space and the output section, 9 spaces and an input section
# (`file:(name)`), or 17 spaces and a symbol (demangled by default: read names from sections).
LINE = re.compile(r"^\s*([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\d+ ( *)(\S.*?)\s*$")
HOT_COLD = (".text.unlikely.", ".text.hot.", ".text.startup.", ".text.exit.", ".text.split.")


def section_symbol(section):
    """The symbol a function section is named after (`.text.<symbol>`), or None."""
    for prefix in HOT_COLD + (".text.",):
        if section.startswith(prefix) and len(section) > len(prefix):
            return section[len(prefix):]
    return None


def read_map(path):
    """Input code sections: [start, size, symbol or None], sorted by start."""
    sections, current, in_text = [], None, False
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            match = LINE.match(line)
            if not match:
                continue
            start, size = int(match.group(1), 16), int(match.group(2), 16)
            depth, rest = len(match.group(3)), match.group(4)
            if depth == 0:  # an output section
                in_text = rest == ".text"
                current = None
            elif not in_text:
                continue
            elif depth == 8 and rest.endswith(")") and ":(" in rest:  # an input section
                name = rest[rest.rindex(":(") + 2 : -1]
                current = [start, size, section_symbol(name)] if size else None
                if current:
                    sections.append(current)
            elif depth == 16 and current is not None and current[2] is None:
                # A section of several functions (C and assembly): named by its first symbol,
                # which C does not mangle.
                current[2] = rest
    sections.sort()
    return sections


def read_callgrind(path, costs):
    """Adds the self cost (Ir) of each instruction address to `costs`."""
    skip_next = False
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if line.startswith("calls="):
                skip_next = True  # the next cost line is the call's inclusive cost
                continue
            if not line.startswith("0x"):
                continue
            if skip_next:
                skip_next = False
                continue
            address, _, cost = line.partition(" ")
            costs[int(address, 16)] = costs.get(int(address, 16), 0) + int(cost.split()[0] or 0)


def main():
    args = sys.argv[1:]
    startup_at = args.index("--startup") if "--startup" in args else len(args)
    steady_files, startup_files = args[2:startup_at], args[startup_at + 1 :]
    if len(args) < 3 or not steady_files:
        sys.exit(__doc__)
    map_path, output = args[0], args[1]
    sections = read_map(map_path)
    if not sections:
        sys.exit(f"{map_path}: no .text input sections (is it lld's -Map output?)")
    starts = [section[0] for section in sections]
    text_start, text_end = starts[0], sections[-1][0] + sections[-1][1]

    def heat_of(files):
        """Instructions run per section index, and the addresses that are in no section."""
        costs = {}
        for path in files:
            read_callgrind(path, costs)
        # Callgrind names addresses of a position-independent binary by their offset in it
        # (bias 0); allow for a loaded address too.
        def inside(bias):
            return sum(1 for address in costs if text_start <= address - bias < text_end)
        bias = max((0, 0x108000, 0x400000, 0x555555554000), key=inside)
        heat, outside = {}, 0
        for address, cost in costs.items():
            address -= bias
            at = bisect.bisect_right(starts, address) - 1
            if at < 0 or address >= sections[at][0] + sections[at][1]:
                outside += 1  # another object: libc, the loader, vDSO
                continue
            heat[at] = heat.get(at, 0) + cost
        return heat, outside

    steady, outside = heat_of(steady_files)
    startup, _ = heat_of(startup_files)
    try:  # how much of the list in use this binary still has: a measure of its staleness
        with open(output, encoding="utf-8") as previous:
            old = [line.strip() for line in previous if line.strip()]
        known = {section[2] for section in sections}
        print(f"the previous list: {sum(name in known for name in old)} of {len(old)} names "
              f"are in this binary")
    except FileNotFoundError:
        pass
    order, seen = [], set()
    for heat in (steady, startup):
        for _cost, at in sorted((-cost, at) for at, cost in heat.items()):
            name = sections[at][2]
            if name and name not in seen:
                seen.add(name)
                order.append(at)
    with open(output, "w", encoding="utf-8") as out:
        for at in order:
            out.write(sections[at][2] + "\n")
    kib = lambda indexes: sum(sections[at][1] for at in indexes) / 1024
    ran = set(steady) | set(startup)
    total = sum(section[1] for section in sections)
    print(f"code that ran: {len(ran)} of {len(sections)} functions, {kib(ran):.0f} KiB of "
          f"{total / 1024:.0f} KiB; after start-up: {len(steady)} functions, {kib(steady):.0f} "
          f"KiB; named: {len(order)}; addresses in other objects: {outside}")


if __name__ == "__main__":
    main()
