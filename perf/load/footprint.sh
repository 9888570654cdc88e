#!/usr/bin/env bash
# The code a webhook request runs, gpu-guard beside the floor (docs/DEVELOPMENT.md#code-footprint):
# each server under callgrind answers the load test's review on 2 keep-alive connections, once
# with REQUESTS and once with a quarter of them, per protocol; perf/load/footprint.py keeps
# the functions whose counts grow with the requests and prints their distinct 64-byte lines of
# code by crate and by function. At steady rates a request finds its code cold, so these lines,
# not instructions, are what gpu-guard's extra CPU per request over the floor tracks.
#
# Needs valgrind, oha, curl and python3. Not part of `cargo test` or CI. About 15 minutes with the
# two profiling builds, 1 minute without.
#
# Environment: CARGO_TARGET_DIR (target), FOOTPRINT_OUT (a temp dir: callgrind files, logs),
# GPU_GUARD_BIN and FLOOR_BIN (profiling builds to use instead of building them), REQUESTS (400),
# PROTOCOLS ("http1 http2"), BODY (the 7.1 KB GPU Job review), PORT_BASE (18790).
set -euo pipefail

cd "$(dirname "$0")/../.."
TARGET=${CARGO_TARGET_DIR:-target}
OUT=$(realpath "${FOOTPRINT_OUT:-$(mktemp -d /tmp/gpu-guard-footprint.XXXXXX)}")
REQUESTS=${REQUESTS:-400}
PROTOCOLS=${PROTOCOLS:-http1 http2}
BODY=${BODY:-tests/fixtures/load/job-7k-review.json}
PORT_BASE=${PORT_BASE:-18790}
mkdir -p "$OUT"

for tool in valgrind callgrind_control oha curl python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

# Symbols, so callgrind names the functions; two builds, as in run.sh.
[ -n "${GPU_GUARD_BIN:-}" ] || cargo build --profile profiling --bin gpu-guard
[ -n "${FLOOR_BIN:-}" ] || cargo build --profile profiling -p gpu-guard-perf --bin floor
GPU_GUARD=${GPU_GUARD_BIN:-$TARGET/profiling/gpu-guard}
FLOOR=${FLOOR_BIN:-$TARGET/profiling/floor}
"$GPU_GUARD" certs --out-dir "$OUT/certs" --force >/dev/null 2>&1

WEBHOOK=127.0.0.1:$PORT_BASE
ADMIN=127.0.0.1:$((PORT_BASE + 1))
RUN=
trap '[ -z "$RUN" ] || kill "$RUN" 2>/dev/null || true' EXIT

send() { # protocol count
    local flag=
    [ "$1" = http2 ] && flag=--http2
    # shellcheck disable=SC2086 # no protocol flag for HTTP/1.1
    oha --no-tui -n "$2" -c 2 $flag -m POST -H 'content-type: application/json' -D "$BODY" \
        --cacert "$OUT/certs/ca.crt" "https://localhost:$PORT_BASE/mutate" >/dev/null
}

# Runs server NAME under callgrind; counts only the measured requests of PROTOCOL, COUNT of them.
measure() { # name protocol count
    local name=$1 protocol=$2 count=$3 file="$OUT/$1-$2-$3.callgrind"
    local command=("$FLOOR" --listen "$WEBHOOK" --cert "$OUT/certs/tls.crt" --key "$OUT/certs/tls.key")
    [ "$name" = gpu-guard ] && command=("$GPU_GUARD" serve --no-cluster --listen "$WEBHOOK"
        --admin-listen "$ADMIN" --drain-delay-seconds 0 --tls-cert-file "$OUT/certs/tls.crt"
        --tls-key-file "$OUT/certs/tls.key")
    valgrind --tool=callgrind --dump-instr=yes --dump-line=no --compress-pos=no \
        --compress-strings=no --callgrind-out-file="$file" "${command[@]}" \
        2>"$OUT/$name-$protocol-$count.log" &
    RUN=$!
    for _ in $(seq 600); do
        curl -sf -o /dev/null --cacert "$OUT/certs/ca.crt" -H 'content-type: application/json' \
            --data-binary "@$BODY" "https://localhost:$PORT_BASE/mutate" && break
        kill -0 "$RUN" 2>/dev/null || { echo "$name did not start: $OUT/$name-$protocol-$count.log" >&2; exit 1; }
        sleep 0.2
    done
    send "$protocol" 20                       # warm: lazy statics, first allocations
    callgrind_control -z "$RUN" >/dev/null 2>&1 # counts from here
    send "$protocol" "$count"
    callgrind_control -d "$RUN" >/dev/null 2>&1 # to $file.1
    kill -TERM "$RUN"
    wait "$RUN" || true
    RUN=
}

for protocol in $PROTOCOLS; do
    runs=()
    for name in floor gpu-guard; do
        measure "$name" "$protocol" "$REQUESTS"
        measure "$name" "$protocol" $((REQUESTS / 4))
        runs+=("$name=$OUT/$name-$protocol-$REQUESTS.callgrind.1:$OUT/$name-$protocol-$((REQUESTS / 4)).callgrind.1")
    done
    echo "== $protocol, $REQUESTS requests on 2 connections"
    python3 perf/load/footprint.py --ratio 4 "${runs[@]}"
done
echo "raw: $OUT"
