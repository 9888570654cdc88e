#!/usr/bin/env bash
# The scale benchmark: gpu-guard's cluster caches against a list/watch stand-in of a large GPU
# cluster (perf/src/bin/scale-standin.rs: 8 GPU pods and 22 other pods per node, realistic object
# sizes, every node and pod healthy). For each cluster size, `gpu-guard controller
# --no-leader-election` and `gpu-guard serve` (its PriorityClass, Node and DRA caches) are started
# in turn and measured: time from start to ready (/readyz on the admin port answers 200: the
# caches have listed), steady RSS (VmRSS after the quiet window), peak RSS (VmHWM), CPU in a quiet
# cluster (utime+stime over QUIET_SECONDS, in cores) and, with CHURN > 0, CPU while the stand-in
# modifies CHURN random pods a second. Also counted: the writes gpu-guard sent (none expected).
# See docs/controller.md#scale-benchmark.
#
# Needs curl, taskset and python3. Not part of `cargo test` or CI.
#
#   perf/scale/run.sh                                  # 100, 1,000 and 5,000 nodes
#   SIZES="100" QUIET_SECONDS=10 perf/scale/run.sh     # a quick look
#   BASELINE=/path/to/gpu-guard-from-main perf/scale/run.sh   # before/after in one run
#
# Environment: SIZES ("100 1000 5000" nodes), GPU_PODS_PER_NODE (8), OTHER_PODS_PER_NODE (22),
# NAMESPACES (100), MODES ("controller serve"), QUIET_SECONDS (30), SETTLE_SECONDS (10: after
# ready, before the quiet window), CHURN (0 pod updates a second: no churn phase),
# CHURN_SECONDS (30), READY_TIMEOUT (600 s), STANDIN_CPU (0) and GUARD_CPU (1) for taskset,
# GPU_GUARD (a gpu-guard binary: skips building it), STANDIN (a scale-standin binary: skips
# building it), BASELINE (a second gpu-guard binary,
# measured in the same run), CARGO_TARGET_DIR (target), SCALE_OUT (a temp dir: logs,
# results.tsv), PORT_BASE (18600).
set -euo pipefail

cd "$(dirname "$0")/../.."
SIZES=${SIZES:-100 1000 5000}
GPU_PODS_PER_NODE=${GPU_PODS_PER_NODE:-8}
OTHER_PODS_PER_NODE=${OTHER_PODS_PER_NODE:-22}
NAMESPACES=${NAMESPACES:-100}
MODES=${MODES:-controller serve}
QUIET_SECONDS=${QUIET_SECONDS:-30}
SETTLE_SECONDS=${SETTLE_SECONDS:-10}
CHURN=${CHURN:-0}
CHURN_SECONDS=${CHURN_SECONDS:-30}
READY_TIMEOUT=${READY_TIMEOUT:-600}
STANDIN_CPU=${STANDIN_CPU:-0}
GUARD_CPU=${GUARD_CPU:-1}
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${SCALE_OUT:-$(mktemp -d /tmp/gpu-guard-scale.XXXXXX)}
PORT_BASE=${PORT_BASE:-18600}
mkdir -p "$OUT/bin"

for tool in curl taskset python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

# Built binaries are copied out at once: a shared target directory may be rebuilt meanwhile.
BUILD=()
[[ -n ${GPU_GUARD:-} ]] || cargo build --release --bin gpu-guard
[[ -n ${STANDIN:-} ]] || cargo build --release -p gpu-guard-perf --bin scale-standin
if [[ -z ${GPU_GUARD:-} ]]; then
    cp "$TARGET/release/gpu-guard" "$OUT/bin/gpu-guard"
    GPU_GUARD="$OUT/bin/gpu-guard"
fi
if [[ -z ${STANDIN:-} ]]; then
    cp "$TARGET/release/scale-standin" "$OUT/bin/scale-standin"
    STANDIN="$OUT/bin/scale-standin"
fi

BINARIES=("current=$GPU_GUARD")
if [[ -n ${BASELINE:-} ]]; then
    BINARIES=("baseline=$BASELINE" "${BINARIES[@]}")
fi
for entry in "${BINARIES[@]}"; do
    [[ -x ${entry#*=} ]] || { echo "not an executable: ${entry#*=}" >&2; exit 1; }
done

STANDIN_PORT=$PORT_BASE
ADMIN_PORT=$((PORT_BASE + 1))
WEBHOOK_PORT=$((PORT_BASE + 2))
STANDIN_URL="http://127.0.0.1:$STANDIN_PORT"
# shellcheck source=perf/scale/common.sh
source perf/scale/common.sh
standin_kubeconfig "$STANDIN_URL" "$OUT/kubeconfig"

TICKS=$(getconf CLK_TCK)
now() { date +%s.%N; }
# utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# A /proc/PID/status field (VmRSS, VmHWM) in MiB.
mib() { awk -v key="$2:" '$1 == key { printf "%.0f", $2 / 1024 }' "/proc/$1/status"; }
# Cores used by PID over SECONDS.
cores_over() {
    local pid=$1 seconds=$2 t0 c0 t1 c1
    t0=$(now); c0=$(cpu_ticks "$pid")
    sleep "$seconds"
    t1=$(now); c1=$(cpu_ticks "$pid")
    python3 -c "print(f'{($c1 - $c0) / $TICKS / ($t1 - $t0):.4f}')"
}
writes() { curl -sf "$STANDIN_URL/stand-in/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["writes"])'; }
churn() { curl -sf -X POST "$STANDIN_URL/stand-in/churn?per-second=$1" >/dev/null; }

printf 'size\tnodes\tpods\tbinary\tmode\tready_s\trss_mib\tpeak_mib\tquiet_cores\tchurn_cores\twrites\n' >"$OUT/results.tsv"

measure() {
    local nodes=$1 pods=$2 label=$3 binary=$4 mode=$5 log
    log="$OUT/$label-$mode-$nodes.log"
    local args=(--kubeconfig "$OUT/kubeconfig" --admin-listen "127.0.0.1:$ADMIN_PORT")
    case $mode in
        controller) args=(controller --no-leader-election "${args[@]}") ;;
        serve) args=(serve "${args[@]}" --listen "127.0.0.1:$WEBHOOK_PORT" --drain-delay-seconds 0
            --ca-bundle-file "$OUT/ca-bundle.pem") ;;
        *) echo "unknown mode $mode" >&2; exit 1 ;;
    esac
    local writes_before start ready_s=timeout pid
    writes_before=$(writes)
    start=$(now)
    taskset -c "$GUARD_CPU" "$binary" "${args[@]}" 2>"$log" &
    pid=$!
    PIDS+=("$pid")
    while kill -0 "$pid" 2>/dev/null; do
        if curl -sf -o /dev/null "http://127.0.0.1:$ADMIN_PORT/readyz"; then
            ready_s=$(python3 -c "print(f'{$(now) - $start:.2f}')")
            break
        fi
        if python3 -c "import sys; sys.exit(0 if $(now) - $start > $READY_TIMEOUT else 1)"; then
            break
        fi
        sleep 0.05
    done
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "$label $mode exited early; log: $log" >&2
        tail -5 "$log" >&2
        return 1
    fi
    local quiet_cores churn_cores=- rss peak
    sleep "$SETTLE_SECONDS"
    quiet_cores=$(cores_over "$pid" "$QUIET_SECONDS")
    rss=$(mib "$pid" VmRSS)
    if [[ $CHURN != 0 ]]; then
        churn "$CHURN"
        churn_cores=$(cores_over "$pid" "$CHURN_SECONDS")
        churn 0
    fi
    peak=$(mib "$pid" VmHWM)
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    local sent=$(($(writes) - writes_before))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$nodes" "$nodes" "$pods" "$label" "$mode" \
        "$ready_s" "$rss" "$peak" "$quiet_cores" "$churn_cores" "$sent" >>"$OUT/results.tsv"
    printf '  %-9s %-10s ready %6s s  RSS %5s MiB  peak %5s MiB  quiet %s cores  churn %s cores  writes %s\n' \
        "$label" "$mode" "$ready_s" "$rss" "$peak" "$quiet_cores" "$churn_cores" "$sent"
}

echo "results and logs: $OUT"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "gpu-guard on CPU $GUARD_CPU, stand-in on CPU $STANDIN_CPU; settle ${SETTLE_SECONDS} s, quiet ${QUIET_SECONDS} s, churn $CHURN pods/s for ${CHURN_SECONDS} s"
for nodes in $SIZES; do
    pods=$((nodes * (GPU_PODS_PER_NODE + OTHER_PODS_PER_NODE)))
    taskset -c "$STANDIN_CPU" "$STANDIN" --listen "127.0.0.1:$STANDIN_PORT" --nodes "$nodes" \
        --gpu-pods-per-node "$GPU_PODS_PER_NODE" --other-pods-per-node "$OTHER_PODS_PER_NODE" \
        --namespaces "$NAMESPACES" 2>"$OUT/standin-$nodes.log" &
    standin=$!
    PIDS+=("$standin")
    until curl -sf -o /dev/null "$STANDIN_URL/stand-in/stats"; do
        kill -0 "$standin" 2>/dev/null || { cat "$OUT/standin-$nodes.log" >&2; exit 1; }
        sleep 0.05
    done
    # The stand-in's own speed: every pod in one list, to curl (it must not be the bottleneck).
    listed=$(curl -sf -o /dev/null -w '%{size_download} %{time_total}' "$STANDIN_URL/api/v1/pods" |
        awk '{ printf "all pods (%.0f MB) in %.2f s", $1 / 1e6, $2 }')
    echo "$nodes nodes, $pods pods: stand-in listed $listed"
    for mode in $MODES; do
        for entry in "${BINARIES[@]}"; do
            measure "$nodes" "$pods" "${entry%%=*}" "${entry#*=}" "$mode"
        done
    done
    echo "  stand-in: RSS $(mib "$standin" VmRSS) MiB, $(cpu_ticks "$standin") CPU ticks in all"
    kill "$standin"
    wait "$standin" 2>/dev/null || true
done

echo
echo "| nodes | pods | binary | command | ready | steady RSS | peak RSS | CPU quiet | CPU churn | writes |"
echo "|---|---|---|---|---|---|---|---|---|---|"
tail -n +2 "$OUT/results.tsv" | while IFS=$'\t' read -r _ nodes pods label mode ready rss peak quiet churn sent; do
    printf '| %s | %s | %s | %s | %s s | %s MiB | %s MiB | %s | %s | %s |\n' \
        "$nodes" "$pods" "$label" "$mode" "$ready" "$rss" "$peak" "$quiet" "$churn" "$sent"
done
