#!/usr/bin/env bash
# Regenerates benches/layout/code-order.txt, the order in which the release binary's functions
# are linked (build.rs, docs/DEVELOPMENT.md#code-layout): the release build with a link map, then
# `serve` (against a list/watch stand-in, and with --no-cluster), and `controller` under
# callgrind while they answer webhook requests over HTTP/1.1 and HTTP/2, the admin port, and pod
# churn; benches/layout/order.py names every function that ran: what ran after start-up first,
# hottest first, then what ran only at start-up.
#
# Needs valgrind, oha (`cargo install oha --locked`), curl and python3. Not part of `cargo test`
# or CI. Takes about 15 minutes, most of it the release build. Rerun it after a dependency
# update, a version bump or a large change to the request path, then check the effect with the
# load test (docs/operations.md#load-test).
#
# Environment: CARGO_TARGET_DIR (target), LAYOUT_OUT (a temp dir: link map, callgrind files,
# logs), STANDIN (a scale-standin binary: skips building it), GPU_GUARD_BIN and LINK_MAP (a
# release binary and its link map: skip building them), REQUESTS (200 per fixture and protocol, on 2 connections),
# PORT_BASE (18700).
set -euo pipefail

cd "$(dirname "$0")/../.."
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${LAYOUT_OUT:-$(mktemp -d /tmp/gpu-guard-layout.XXXXXX)}
REQUESTS=${REQUESTS:-200}
PORT_BASE=${PORT_BASE:-18700}
OUT=$(realpath "$OUT")
mkdir -p "$OUT"

for tool in valgrind callgrind_control oha curl python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

# The binary as it ships (`cargo build --release`, no dev-dependency features), with its map.
if [[ -n ${GPU_GUARD_BIN:-} && -n ${LINK_MAP:-} ]]; then
    cp "$GPU_GUARD_BIN" "$OUT/gpu-guard"
    [[ $LINK_MAP -ef $OUT/gpu-guard.map ]] || cp "$LINK_MAP" "$OUT/gpu-guard.map"
else
    GPU_GUARD_LINK_MAP="$OUT/gpu-guard.map" cargo build --release --bin gpu-guard
    cp "$TARGET/release/gpu-guard" "$OUT/gpu-guard"
fi
if [[ -z ${STANDIN:-} ]]; then
    cargo build --release --example scale-standin
    cp "$TARGET/release/examples/scale-standin" "$OUT/scale-standin"
    STANDIN="$OUT/scale-standin"
fi
BIN="$OUT/gpu-guard"

STANDIN_URL="http://127.0.0.1:$PORT_BASE"
ADMIN="127.0.0.1:$((PORT_BASE + 1))"
WEBHOOK="127.0.0.1:$((PORT_BASE + 2))"
# shellcheck source=benches/scale/common.sh
source benches/scale/common.sh
standin_kubeconfig "$STANDIN_URL" "$OUT/kubeconfig"

"$BIN" certs --out-dir "$OUT/certs" --force >/dev/null
"$STANDIN" --listen "127.0.0.1:$PORT_BASE" --nodes 20 --gpu-pods-per-node 8 \
    --other-pods-per-node 4 --namespaces 5 2>"$OUT/standin.log" &
PIDS+=($!)
until curl -sf -o /dev/null "$STANDIN_URL/stand-in/stats"; do sleep 0.1; done

# Starts BIN's ARGS under callgrind as $RUN, waits until the admin port says ready.
start() { # name args...
    local name=$1
    shift
    valgrind --tool=callgrind --dump-instr=yes --dump-line=no --compress-pos=no \
        --compress-strings=no --callgrind-out-file="$OUT/$name.callgrind" \
        "$BIN" "$@" --admin-listen "$ADMIN" 2>"$OUT/$name.log" &
    RUN=$!
    PIDS+=("$RUN")
    for _ in $(seq 600); do
        if curl -sf -o /dev/null "http://$ADMIN/readyz"; then
            # Start-up ends here: its counts go to $name.callgrind.1, the rest to $name.callgrind.
            callgrind_control -d "$RUN" >/dev/null
            return
        fi
        kill -0 "$RUN" 2>/dev/null || break
        sleep 0.2
    done
    echo "$name did not become ready; its log: $OUT/$name.log" >&2
    exit 1
}
stop() {
    kill -TERM "$RUN"
    wait "$RUN" || true
}
admin() {
    for path in healthz readyz metrics; do curl -sf -o /dev/null "http://$ADMIN/$path" || true; done
}
# Every admission fixture to its webhook, over HTTP/1.1 and HTTP/2.
requests() {
    local file path
    for file in tests/fixtures/admission/*.json tests/fixtures/load/*.json; do
        case $file in *validate*) path=validate ;; *) path=mutate ;; esac
        for protocol in "" --http2; do
            # shellcheck disable=SC2086 # no protocol flag for HTTP/1.1
            oha --no-tui -n "$REQUESTS" -c 2 $protocol -m POST -H 'content-type: application/json' \
                -D "$file" --cacert "$OUT/certs/ca.crt" "https://localhost:${WEBHOOK##*:}/$path" \
                >/dev/null
        done
    done
    admin
}

serve=(serve --listen "$WEBHOOK" --drain-delay-seconds 0 --tls-cert-file "$OUT/certs/tls.crt"
    --tls-key-file "$OUT/certs/tls.key")
echo "serve, against the stand-in" >&2
start serve-cluster "${serve[@]}" --kubeconfig "$OUT/kubeconfig"
requests
stop
echo "serve --no-cluster" >&2
start serve-offline "${serve[@]}" --no-cluster
requests
stop
echo "controller, with pod churn" >&2
start controller controller --no-leader-election --kubeconfig "$OUT/kubeconfig"
curl -sf -X POST "$STANDIN_URL/stand-in/churn?per-second=20" >/dev/null
sleep 20
admin
stop

python3 benches/layout/order.py "$OUT/gpu-guard.map" benches/layout/code-order.txt \
    "$OUT"/*.callgrind --startup "$OUT"/*.callgrind.1
echo "wrote benches/layout/code-order.txt ($(wc -l <benches/layout/code-order.txt) names); raw: $OUT"
