"""The table of perf/load/run.sh: per protocol and phase, the median over rounds of each
server's throughput, latency percentiles and CPU per request, and their ratios to the floor
(gpu-guard's, and the baseline's when there is one): the ratio of the medians, and the median
of the ratios within each round with their range (the servers of a round run minutes apart at
most, so a slow spell of the machine shows in the range instead of in one server's median).

usage: summary.py results.tsv peak-rss.tsv [results.tsv ...]

More results files (other runs of the same binaries, `LOAD_OUT/results.tsv`) pool their rounds
with the first's: the medians and the per-round ratios are then over all of them. Peak RSS is
the first run's.
"""

import json
import statistics
import sys
from collections import defaultdict

CLOCK_TICK_S = 0.01  # /proc/PID/stat counts CPU time in ticks of 10 ms (USER_HZ = 100)


def load(paths):
    rows = defaultdict(list)
    for run, path in enumerate(paths):
        load_run(rows, path, f"{run + 1}." if len(paths) > 1 else "")
    return rows


def load_run(rows, path, run):
    for line in open(path):
        server, protocol, phase, round_, ticks, counted_s, phase_s, file = line.rstrip("\n").split("\t")
        report = json.load(open(file))
        summary = report["summary"]
        percentiles = report["latencyPercentiles"]
        codes = report.get("statusCodeDistribution", {})
        answered = sum(codes.values())
        ok = codes.get("200", 0)
        rows[(protocol, phase, server)].append(
            {
                "round": run + round_,
                "rps": summary["requestsPerSec"],
                "p50": percentiles["p50"] * 1e3,
                "p99": percentiles["p99"] * 1e3,
                "p99.9": percentiles["p99.9"] * 1e3,
                # At a fixed rate, the CPU was counted over the last counted_s of the phase
                # (run.sh: not the connections' TLS handshakes), and the open loop sent that
                # share of the requests in it.
                "cpu_us": int(ticks) * CLOCK_TICK_S * 1e6 / max(answered * int(counted_s) / int(phase_s), 1),
                # oha cuts the requests in flight when a phase's time is up: not the server's.
                "errors": answered
                - ok
                + sum(n for e, n in report.get("errorDistribution", {}).items() if e != "aborted due to deadline"),
            }
        )


def median(values):
    return statistics.median(values) if values else float("nan")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = load([sys.argv[1], *sys.argv[3:]])
    peak_kb = dict(line.split() for line in open(sys.argv[2]))
    servers = [name for name in ["floor", "gpu-guard", "baseline", "floor-settings"] if name in peak_kb]
    metrics = ["rps", "p50", "p99", "p99.9", "cpu_us", "errors"]
    print()
    print("| protocol | phase | server | req/s | p50 ms | p99 ms | p99.9 ms | CPU µs/req | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    phases = {(protocol, phase) for (protocol, phase, _server) in rows}
    for protocol, phase in sorted(phases, key=lambda k: (k[0], k[1] != "max", int(k[1]) if k[1] != "max" else 0)):
        medians = {}
        for server in servers:
            runs = rows.get((protocol, phase, server), [])
            if not runs:
                continue
            medians[server] = values = {m: median([r[m] for r in runs]) for m in metrics}
            spread = {m: (min(r[m] for r in runs), max(r[m] for r in runs)) for m in ["p99", "p99.9"]}
            print(
                f"| {protocol} | {phase} | {server} | {values['rps']:,.0f} | {values['p50']:.2f} "
                f"| {values['p99']:.2f} ({spread['p99'][0]:.1f}-{spread['p99'][1]:.1f}) "
                f"| {values['p99.9']:.2f} ({spread['p99.9'][0]:.1f}-{spread['p99.9'][1]:.1f}) "
                f"| {values['cpu_us']:.0f} | {values['errors']:.0f} |"
            )
        floor = medians.get("floor")
        for server in servers[1:]:
            if floor is None or server not in medians:
                continue
            ratio = {m: medians[server][m] / floor[m] if floor[m] else float("nan") for m in metrics[:5]}
            print(
                f"| {protocol} | {phase} | **{server} / floor** | {ratio['rps']:.2f}× | {ratio['p50']:.2f}× "
                f"| {ratio['p99']:.2f}× | {ratio['p99.9']:.2f}× | {ratio['cpu_us']:.2f}× | |"
            )
            by_round = {r["round"]: r for r in rows[(protocol, phase, "floor")]}
            paired = {m: [] for m in metrics[:5]}
            for run in rows[(protocol, phase, server)]:
                base = by_round.get(run["round"])
                for m in paired:
                    if base and base[m]:
                        paired[m].append(run[m] / base[m])
            if len(paired["rps"]) > 1:
                cell = {m: f"{median(v):.2f}× ({min(v):.2f}-{max(v):.2f})" for m, v in paired.items()}
                print(
                    f"| {protocol} | {phase} | {server} / floor, by round | {cell['rps']} | {cell['p50']} "
                    f"| {cell['p99']} | {cell['p99.9']} | {cell['cpu_us']} | |"
                )
    print()
    floor_kb = int(peak_kb["floor"])
    for server in servers:
        kb = int(peak_kb[server])
        print(f"peak RSS (VmHWM) {server}: {kb / 1024:.1f} MiB ({kb / floor_kb:.2f}× the floor)")
    print(
        "targets (gpu-guard / floor, every phase and protocol): CPU/req <= 1.3x, p99 <= 1.5x, "
        "p99.9 <= 2x, peak RSS <= 2.5x (docs/benchmarks.md)"
    )


if __name__ == "__main__":
    main()
