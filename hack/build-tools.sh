#!/usr/bin/env bash
# Builds every tool fencer needs into bin/ from the Go module proxy: the
# Kubernetes control plane, kubectl, the kubelet and kube-proxy (k8s.io/kubernetes
# v1.37.2), etcd and etcdctl (v3.6), CoreDNS (v1.15), kwok, helm,
# controller-gen, and promtool (Prometheus v3.16) with promql-names for the
# chart's alerts and dashboard. Nothing prebuilt is downloaded.
#
# A build is skipped when bin/.tools-stamp records the same inputs (the tool
# modules, this script and the Go version), so a second run costs a hash.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/bin"
tools="$root/hack/tools"
mkdir -p "$bin"

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0

binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy coredns etcd etcdctl kwok helm controller-gen golangci-lint promtool promql-names)

stamp_of() {
  cat "$tools/go.mod" "$tools/go.sum" "$tools/tools.go" "$tools/etcd/go.mod" "$tools/etcd/go.sum" \
      "$tools"/etcd/cmd/*/main.go "$tools/coredns/go.mod" "$tools/coredns/go.sum" "$tools/coredns/main.go" \
      "$tools/prometheus/go.mod" "$tools/prometheus/go.sum" "$tools/prometheus/tools.go" "$tools/prometheus/promql-names/main.go" "$tools/lint/go.mod" "$tools/lint/go.sum" "$tools/lint/tools.go" "$0" | sha256sum | cut -d' ' -f1
  go version
}

want=$(stamp_of)
missing=0
for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || missing=1; done
if [ "$missing" = 0 ] && [ -f "$bin/.tools-stamp" ] && [ "$(cat "$bin/.tools-stamp")" = "$want" ]; then
  exit 0
fi
rm -f "$bin/.tools-stamp"

say() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
fail() { printf '[build-tools] FAILED: %s\n' "$*" >&2; exit 1; }

build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
kube_ldflags=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

# The compile flags (CGO_ENABLED=0, -trimpath, -dwarf=false) are the ones the
# Makefile gives every build of fencer's own module, its tests and vet
# included, and hack/tools/go.mod holds the versions fencer's go.mod does for
# every module both compile (hack/verify-shared-deps.sh checks it). So the
# packages the tools share with fencer (client-go, apimachinery, grpc, the
# etcd client, ...) are compiled once, here, and fencer's builds find them in
# Go's build cache.
#
# -trimpath keeps binaries identical across checkouts; -s -w drops debug info,
# which halves link time and size for these large binaries, and
# -dwarf=false spares the compiler writing the debug info the linker would
# drop (4% of a cold compile). Stack traces do not need it.
#
# One `go build` per module builds all of that module's tools: the go command
# then links one binary (single-threaded) while it compiles another's
# packages, where a build per tool left a core idle for every link. The
# modules build one after another: many packages are common to them at the
# same versions, and a later module finds those compiled (built side by
# side, both compiled them, and a cold build took 1.4 minutes longer). An -X
# for a package a binary does not link is ignored, so each module's tools
# share one set of ldflags.
build() { # name module-dir ldflags tags package...
  local name=$1 dir=$2 ldflags=$3 tags=$4
  shift 4
  say "building $name's tools: $*"
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -tags "$tags" -ldflags "-s -w $ldflags" -o "$bin/" "$@") \
    || fail "go build of $name's tools in $dir (see the compiler output above)"
}

helm_ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
helm_ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37"
helm_ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37"
kwok_ldflags="-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBE_VERSION#v}"

say "building tools into bin/ (a cold build takes about 20 minutes on 2 cores; later runs are no-ops)"
# The control plane, kubectl, the real node's kubelet and kube-proxy, kwok,
# helm and controller-gen: k8s.io/kubernetes's module.
build kubernetes "$tools" "$kube_ldflags $kwok_ldflags $helm_ldflags" "" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
  sigs.k8s.io/kwok/cmd/kwok helm.sh/helm/v3/cmd/helm sigs.k8s.io/controller-tools/cmd/controller-gen
# The real node's cluster DNS.
build coredns "$tools/coredns" "" "" .
build etcd "$tools/etcd" "-X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" "" ./cmd/etcd ./cmd/etcdctl
# remove_all_sd: rule tests need no service discovery, whose plugins pull
# every cloud provider's SDK.
build prometheus "$tools/prometheus" "-X github.com/prometheus/common/version.Version=3.16.0" remove_all_sd \
  github.com/prometheus/prometheus/cmd/promtool ./promql-names
build golangci-lint "$tools/lint" "" "" github.com/golangci/golangci-lint/v2/cmd/golangci-lint
for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || fail "bin/$b was not built"; done

# Each version is read whole before it is matched: with pipefail, a `grep -q`
# that exits at its match can fail the pipe with the writer's SIGPIPE.
reports() { # binary version: the binary's --version names the version
  local out
  out=$("$bin/$1" --version) || fail "bin/$1 --version: exit $?"
  [[ $out == *"$2"* ]] || fail "$1 does not report $2: $out"
}
reports kube-apiserver "$KUBE_VERSION"
reports etcd "${ETCD_VERSION#v}"
echo "$want" > "$bin/.tools-stamp"
say "tools ready in bin/"
