#!/usr/bin/env bash
# The offline CLI on a large input: `mutate`, `mutate --diff` and `check` on a generated YAML
# stream of small Jobs (50 MB by default), each run timed with its peak resident memory.
# Prints documents per second and peak RSS against the targets (at least 5,000 documents/s
# and under 300 MB, `--diff` included). See docs/cli.md#large-inputs.
#
# Needs python3 and GNU time (/usr/bin/time). Not part of `cargo test` or CI.
#
#   perf/cli/run.sh                   # 50 MB input, the release build of this checkout
#   MEGABYTES=10 perf/cli/run.sh
#   BASELINE=/path/to/old/gpu-guard perf/cli/run.sh   # a before/after in one run
#
# Environment: MEGABYTES (50), CARGO_TARGET_DIR (target), CLI_OUT (a temp dir: the input and
# the outputs), BASELINE (another gpu-guard binary, run on the same input after this one).
set -euo pipefail

cd "$(dirname "$0")/../.."
MEGABYTES=${MEGABYTES:-50}
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${CLI_OUT:-$(mktemp -d /tmp/gpu-guard-cli.XXXXXX)}
mkdir -p "$OUT"
[ -x /usr/bin/time ] || { echo "needs GNU time (/usr/bin/time; Debian package time)" >&2; exit 1; }

cargo build --release --bin gpu-guard
INPUT="$OUT/jobs.yaml"
python3 perf/cli/jobs.py "$MEGABYTES" > "$INPUT"
DOCUMENTS=$(grep -c '^kind: Job$' "$INPUT")
echo "input: $INPUT, $(du -m "$INPUT" | cut -f1) MB, $DOCUMENTS Jobs"

measure() { # name binary args...
    local name=$1 binary=$2
    shift 2
    /usr/bin/time -f '%e %M' -o "$OUT/time" "$binary" "$@" -f "$INPUT" \
        > "$OUT/$name.out" 2> "$OUT/$name.err" || true
    read -r seconds kilobytes < <(tail -n 1 "$OUT/time")
    python3 - "$name" "$seconds" "$kilobytes" "$DOCUMENTS" <<'PY'
import sys
name, seconds, kilobytes, documents = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rate = documents / seconds if seconds > 0 else float("inf")
mib = kilobytes / 1024
verdict = "ok" if rate >= 5000 and mib < 300 else "MISSES TARGET"
print(f"{name:<28} {seconds:7.2f} s {rate:9.0f} documents/s {mib:8.1f} MiB peak RSS  {verdict}")
PY
}

for binary in "$TARGET/release/gpu-guard" ${BASELINE:+"$BASELINE"}; do
    label=$([ "$binary" = "$TARGET/release/gpu-guard" ] && echo this || echo baseline)
    measure "$label mutate" "$binary" mutate
    measure "$label mutate --diff" "$binary" mutate --diff
    measure "$label check" "$binary" check
done
echo "outputs and stderr in $OUT"
