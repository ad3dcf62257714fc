#!/usr/bin/env bash
# Fails when the committed generated files (CRDs, RBAC, DeepCopy, and the
# chart's CRDs, ClusterRole, README and admission policies) differ from
# what `make manifests generate` produces from the API types and markers. It
# compares the working tree before and after regenerating, so it works on a
# fresh clone and on a work tree with uncommitted edits alike.
set -euo pipefail
cd "$(dirname "$0")/.."
generated=(config/crd config/rbac config/default/fencer.yaml config/guard api/v1alpha1/zz_generated.deepcopy.go charts/fencer/templates/crds charts/fencer/templates/clusterrole.yaml charts/fencer/README.md)

snapshot() { find "${generated[@]}" -type f 2>/dev/null | sort | xargs -r sha256sum; }
before=$(snapshot)
make -s manifests generate >/dev/null
after=$(snapshot)
if [ "$before" != "$after" ]; then
  echo "verify-generated: generated files were stale:" >&2
  diff <(echo "$before") <(echo "$after") >&2 || true
  echo "They are regenerated now; review and commit them (make manifests generate)." >&2
  exit 1
fi
echo "verify-generated: CRDs, RBAC and DeepCopy are current"
