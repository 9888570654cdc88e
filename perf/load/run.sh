#!/usr/bin/env bash
# The webhook load test: gpu-guard against the floor server (perf/load/floor.rs, the same
# stack doing nothing but parse and answer), built in the same run, side by side, over HTTP/1.1
# and HTTP/2, at full load and at steady rates (open loop, latency corrected for coordinated
# omission). Prints each phase and the ratios gpu-guard / floor. See docs/operations.md#load-test.
#
# Needs oha (`cargo install oha --locked`), taskset and python3. Not part of `cargo test` or CI.
#
#   perf/load/run.sh                      # 4 interleaved rounds, 10 s a phase
#   ROUNDS=1 SECONDS_PER_PHASE=5 perf/load/run.sh
#
# Environment: ROUNDS (4; even, so each server goes first as often as last), SECONDS_PER_PHASE
# (10), WARM_SECONDS (2: at a fixed rate, CPU is counted from then on), RATES ("200 2000"),
# PROTOCOLS ("http1 http2"), CONNECTIONS (64), SERVER_CPU (0), CLIENT_CPU (1), BODY (the 7.1 KB GPU Job review),
# CARGO_TARGET_DIR (target), LOAD_OUT (a temp dir: raw oha JSON, server logs, results.tsv),
# BASELINE (another gpu-guard binary, say one built from main, measured as a third server
# "baseline" in the same rounds: a before/after in one run), SETTINGS_FLOOR (set: the floor with
# gpu-guard's server settings, `floor --server-settings`, as a fourth server), GPU_GUARD_BIN and FLOOR_BIN (use
# these binaries instead of building them: a build shared with others may change under the run).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-4}
SECONDS_PER_PHASE=${SECONDS_PER_PHASE:-10}
WARM_SECONDS=${WARM_SECONDS:-2}
RATES=${RATES:-200 2000}
PROTOCOLS=${PROTOCOLS:-http1 http2}
CONNECTIONS=${CONNECTIONS:-64}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
BODY=${BODY:-tests/fixtures/load/job-7k-review.json}
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${LOAD_OUT:-$(mktemp -d /tmp/gpu-guard-load.XXXXXX)}
mkdir -p "$OUT"

for tool in oha taskset python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool (oha: cargo install oha --locked)" >&2; exit 1; }
done

# Two builds: in one, the perf package's dependencies could add features to gpu-guard's, and the
# binary would not be the one `cargo build --release` ships.
[ -n "${GPU_GUARD_BIN:-}" ] || cargo build --release --bin gpu-guard
[ -n "${FLOOR_BIN:-}" ] || cargo build --release -p gpu-guard-perf --bin floor
GPU_GUARD=${GPU_GUARD_BIN:-$TARGET/release/gpu-guard}
FLOOR=${FLOOR_BIN:-$TARGET/release/floor}
ls -l "$GPU_GUARD" "$FLOOR" | awk '{printf "%s: %.1f MB\n", $NF, $5 / 1e6}'

"$GPU_GUARD" certs --out-dir "$OUT/certs" --force >/dev/null

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# Both servers on the same core, one loaded at a time; the load generator on the other.
# gpu-guard as shipped: default log level (info: a line for a denial, a warning or a finding, none
# for a routine patch, docs/operations.md#which-reviews-log-a-line), offline cluster view.
taskset -c "$SERVER_CPU" "$GPU_GUARD" serve --no-cluster \
    --listen 127.0.0.1:18443 --admin-listen 127.0.0.1:18080 --drain-delay-seconds 0 \
    --tls-cert-file "$OUT/certs/tls.crt" --tls-key-file "$OUT/certs/tls.key" \
    2>"$OUT/gpu-guard.log" &
PIDS+=($!); GUARD_PID=$!
taskset -c "$SERVER_CPU" "$FLOOR" --listen 127.0.0.1:18444 \
    --cert "$OUT/certs/tls.crt" --key "$OUT/certs/tls.key" 2>"$OUT/floor.log" &
PIDS+=($!); FLOOR_PID=$!

SERVERS=("floor 18444 $FLOOR_PID" "gpu-guard 18443 $GUARD_PID")
if [ -n "${SETTINGS_FLOOR:-}" ]; then
    # The floor with gpu-guard's server settings (floor.rs: timeouts, keep-alive pings, the
    # graceful-shutdown watcher): what the server costs, apart from the review.
    taskset -c "$SERVER_CPU" "$FLOOR" --listen 127.0.0.1:18446 --server-settings \
        --cert "$OUT/certs/tls.crt" --key "$OUT/certs/tls.key" 2>"$OUT/floor-settings.log" &
    PIDS+=($!)
    SERVERS+=("floor-settings 18446 $!")
fi
if [ -n "${BASELINE:-}" ]; then
    taskset -c "$SERVER_CPU" "$BASELINE" serve --no-cluster \
        --listen 127.0.0.1:18445 --admin-listen 127.0.0.1:18081 --drain-delay-seconds 0 \
        --tls-cert-file "$OUT/certs/tls.crt" --tls-key-file "$OUT/certs/tls.key" \
        2>"$OUT/baseline.log" &
    PIDS+=($!)
    SERVERS+=("baseline 18445 $!")
fi

answers() { # port
    oha --no-tui -n 1 -c 1 -m POST -H 'content-type: application/json' -D "$BODY" \
        --cacert "$OUT/certs/ca.crt" "https://localhost:$1/mutate" 2>/dev/null | grep -q '\[200\]'
}
for server in "${SERVERS[@]}"; do
    read -r name port _pid <<<"$server"
    for _ in $(seq 50); do answers "$port" && break; sleep 0.1; done
    answers "$port" || { echo "$name does not answer on $port" >&2; exit 1; }
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# One phase: oha's JSON to $OUT, one line of results.tsv (the server's CPU ticks, the seconds
# they were counted over, the phase's seconds, oha's file).
#
# At a fixed rate the CPU is counted from WARM_SECONDS into the phase: oha opens its
# connections in the first moments, each with a TLS handshake of about 0.4 ms of server CPU (13
# µs a request at 200 req/s over 64 connections, the same for both servers), and an API server
# keeps its connections open for days. summary.py takes the requests of that window as the
# phase's share of them, which an open loop at a fixed rate sends evenly. At full load the
# handshakes are a few hundredths of a percent, and the whole phase counts.
run_phase() { # server port pid protocol phase round
    local server=$1 port=$2 pid=$3 protocol=$4 phase=$5 round=$6
    local args=(--no-tui --output-format json -z "${SECONDS_PER_PHASE}s" -m POST
        -H 'content-type: application/json' -D "$BODY" --cacert "$OUT/certs/ca.crt")
    if [ "$protocol" = http2 ]; then
        # As a Go client does: a few connections, many streams each (64 in flight).
        args+=(--http2 -c 8 -p $((CONNECTIONS / 8)))
    else
        args+=(-c "$CONNECTIONS")
    fi
    local warm=0
    if [ "$phase" != max ]; then
        args+=(-q "$phase" --latency-correction)
        warm=$WARM_SECONDS
    fi
    local file="$OUT/$server-$protocol-$phase-$round.json"
    local before after load
    [ "$warm" -gt 0 ] || before=$(cpu_ticks "$pid")
    taskset -c "$CLIENT_CPU" oha "${args[@]}" "https://localhost:$port/mutate" >"$file" &
    load=$!
    if [ "$warm" -gt 0 ]; then
        sleep "$warm"
        before=$(cpu_ticks "$pid")
    fi
    wait "$load"
    after=$(cpu_ticks "$pid")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$server" "$protocol" "$phase" "$round" \
        "$((after - before))" "$((SECONDS_PER_PHASE - warm))" "$SECONDS_PER_PHASE" "$file" \
        >>"$OUT/results.tsv"
}

: >"$OUT/results.tsv"
for round in $(seq "$ROUNDS"); do
    for protocol in $PROTOCOLS; do
        for phase in max $RATES; do
            echo "round $round: $protocol $phase" >&2
            # Odd rounds floor first, even rounds floor last: a server that always went
            # first would always meet the machine as the previous phase left it.
            order=("${SERVERS[@]}")
            if [ $((round % 2)) -eq 0 ]; then
                order=()
                for ((i = ${#SERVERS[@]} - 1; i >= 0; i--)); do order+=("${SERVERS[i]}"); done
            fi
            for server in "${order[@]}"; do
                # shellcheck disable=SC2086 # name, port and pid
                run_phase $server "$protocol" "$phase" "$round"
            done
        done
    done
done
for server in "${SERVERS[@]}"; do
    read -r name _port pid <<<"$server"
    printf '%s\t%s\n' "$name" "$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")"
done >"$OUT/peak-rss.tsv"

python3 perf/load/summary.py "$OUT/results.tsv" "$OUT/peak-rss.tsv"
echo "raw results: $OUT"
