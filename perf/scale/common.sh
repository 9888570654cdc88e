# Sourced by perf/scale/run.sh: what it needs to run gpu-guard against the list/watch stand-in
# (perf/src/bin/scale-standin.rs).

# standin_kubeconfig URL FILE: a kubeconfig for the stand-in at URL, with no credentials.
standin_kubeconfig() {
    cat >"$2" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster:
    server: $1
users:
- name: standin
  user: {}
contexts:
- name: standin
  context:
    cluster: standin
    user: standin
current-context: standin
KUBECONFIG
}

# Background processes to stop on exit: add each PID to PIDS.
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
