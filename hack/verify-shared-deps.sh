#!/usr/bin/env bash
# Fails when fencer's builds and the Kubernetes tools' are not compiled with
# the same flags, or when a module whose packages both fencer (its module and
# test/chart's) and the tools compile has a different version in go.mod than
# in hack/tools/go.mod.
#
# Go's build cache shares a compiled package only between builds of the same
# version with the same flags. The Makefile gives fencer's builds the flags
# hack/build-tools.sh gives the tools, so when the versions agree too, the
# dependency tree they share (client-go, apimachinery, grpc, the etcd client,
# ...) is compiled once on a fresh machine, by the tools' build, and fencer's
# vet, tests and image find it there. One bumped module (golang.org/x/sys, say)
# changes the compile of everything above it, so a mismatch costs a cold CI
# run minutes without failing anything; this check makes it fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C # sort and join must agree on the order

# The flags first: the Makefile's must be the ones the tools are built with.
flags='-trimpath -gcflags=all=-dwarf=false'
if ! grep -qx "export GOFLAGS ?= $flags" Makefile || ! grep -qx 'export CGO_ENABLED ?= 0' Makefile ||
  ! grep -qF "CGO_ENABLED=0 go build $flags " hack/build-tools.sh; then
  echo "verify-shared-deps: the Makefile (export CGO_ENABLED ?= 0, export GOFLAGS ?= $flags) and hack/build-tools.sh (CGO_ENABLED=0 go build $flags) must compile with the same flags; change both, and this check, together." >&2
  exit 1
fi

# Each prints "module version" for every module outside the standard library
# that provides a package its build compiles (replacements resolved).
format='{{if not .Standard}}{{with .Module}}{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}{{end}}{{end}}'
# fencer's module and the chart tests' (which compile helm, as the tools do).
fencer=$(for m in . test/chart; do (cd "$m" && go list -deps -test -f "$format" ./...); done | grep -v '^github.com/fencer-io/fencer' | sort -u)
# The tool commands hack/tools/tools.go pins (go list cannot load tools.go
# itself: it imports programs).
commands=$(sed -n 's/^\s*_ "\(.*\)"$/\1/p' hack/tools/tools.go)
# shellcheck disable=SC2086 # one command per word
tools=$(cd hack/tools && go list -deps -f "$format" $commands | sort -u)

shared=$(join <(echo "$fencer") <(echo "$tools")) # module fencer's-version tools'-version
mismatched=$(awk '$2 != $3' <<< "$shared")
if [ -n "$mismatched" ]; then
  echo "verify-shared-deps: fencer and the tools compile these modules at different versions:" >&2
  echo "$mismatched" | awk '{printf "  %s: fencer (go.mod, test/chart/go.mod) has %s, hack/tools/go.mod has %s\n", $1, $2, $3}' >&2
  echo "Require the higher version in both (go get <module>@<version> in the module that has the lower), so that a fresh machine compiles their shared packages once." >&2
  exit 1
fi
echo "verify-shared-deps: the flags agree, and the $(wc -l <<< "$shared") modules fencer shares with the tools are at the same versions"
