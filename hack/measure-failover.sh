#!/usr/bin/env bash
# Measures Lease failover on the `make dev` cluster: for each trial it takes
# the holder away (deletes the pod, or marks it not Ready) and times how long
# until the Lease is held by another pod with a larger token. It also prints
# fencer_lease_failover_seconds, the controller's own view (etcd key gone ->
# next grant).
#
#   make dev        # in another terminal
#   hack/measure-failover.sh [trials] [ttlSeconds]
#
# With renewal PodReady the tenure ends exactly one TTL after its last
# renewal, and renewals happen every TTL/3, so the expected failover lies
# between 2/3 TTL and TTL; what exceeds TTL is fencer's overhead.
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-10}
ttl=${2:-3}
export KUBECONFIG=$PWD/bin/dev/kubeconfig
k() { bin/kubectl "$@"; }
[ -f "$KUBECONFIG" ] || { echo "no bin/dev/kubeconfig: run make dev first" >&2; exit 1; }

k apply -f examples/lease-workers.yaml >/dev/null
k apply -f - >/dev/null <<YAML
apiVersion: fencer.io/v1alpha1
kind: Lease
metadata: {name: failover-probe}
spec:
  ttlSeconds: $ttl
  holderSelector: {matchLabels: {app: reporter}}
YAML
k rollout status deploy/reporter --timeout=60s >/dev/null

holder() { k get flease failover-probe -o jsonpath='{.status.holder} {.status.token}'; }
wait_held() { for _ in $(seq 600); do h=$(holder); [ -n "${h% *}" ] && [ "${h% *}" != "$1" ] && { echo "$h"; return; }; sleep 0.02; done; echo "timeout" >&2; exit 1; }

for mode in delete notready; do
  results=()
  for i in $(seq "$trials"); do
    read -r h tok < <(wait_held "")
    sleep "$(( ttl ))"   # let a renewal or two happen
    t0=$(date +%s.%N)
    if [ "$mode" = delete ]; then
      k delete pod "$h" --wait=false >/dev/null
    else
      k patch pod "$h" --subresource=status --type=strategic -p '{"status":{"conditions":[{"type":"Ready","status":"False"}]}}' >/dev/null
    fi
    read -r h2 tok2 < <(wait_held "$h")
    t1=$(date +%s.%N)
    [ "$tok2" -gt "$tok" ] || { echo "token did not grow: $tok -> $tok2" >&2; exit 1; }
    results+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')")
    [ "$mode" = notready ] && k delete pod "$h" --wait=false >/dev/null  # let the Deployment replace it
    k rollout status deploy/reporter --timeout=60s >/dev/null
  done
  printf '%s\n' "${results[@]}" | sort -n | awk -v m="$mode" -v ttl="$ttl" '{a[NR]=$1} END {printf "%-9s trials=%d ttl=%ss  min=%.3fs  median=%.3fs  max=%.3fs  (max - ttl = %+.3fs)\n", m, NR, ttl, a[1], a[int((NR+1)/2)], a[NR], a[NR]-ttl}'
done
echo "controller's view (key deleted -> next grant): fencer_lease_failover_seconds on the manager's /metrics"
k delete flease failover-probe >/dev/null
