# fencer's build. `make help` lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

BIN ?= $(CURDIR)/bin
# Every Go build here (the manager, the image, vet and the tests) compiles
# with the flags hack/build-tools.sh builds the tools with: no cgo, -trimpath,
# no DWARF. The tools and fencer share most of fencer's dependency tree
# (client-go, apimachinery, grpc, the etcd client: 953 of its 1,041 packages
# outside the standard library), at the same versions
# (hack/verify-shared-deps.sh), so with the same flags Go's build cache
# compiles that tree once instead of once for the tools, once for the tests
# and once more for the image. To debug a test with dlv, which needs DWARF, run
# `go test` outside make or pass GOFLAGS= CGO_ENABLED=1.
export CGO_ENABLED ?= 0
export GOFLAGS ?= -trimpath -gcflags=all=-dwarf=false
CONTROLLER_GEN := $(BIN)/controller-gen
GO_TEST_FLAGS ?= -count=1
# Integration tests start a real kube-apiserver and etcd per package; two
# packages at a time is what a 2-core machine sustains.
GO_TEST_PARALLEL ?= 2

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

##@ Build

.PHONY: tools
tools: ## Build etcd, the Kubernetes control plane, kubectl, kwok, helm and controller-gen into bin/ (a no-op when current).
	@bash hack/build-tools.sh

.PHONY: build
build: ## Build the manager into bin/fencer.
	go build -o $(BIN)/fencer ./cmd/fencer

.PHONY: plugin
plugin: ## Build the kubectl plugin into bin/kubectl-fencer (put bin/ on PATH: kubectl fencer status).
	go build -o $(BIN)/kubectl-fencer ./cmd/kubectl-fencer

IMAGE ?= ghcr.io/fencer-io/fencer:0.1.0

.PHONY: image
image: ## Build the manager image as bin/fencer-image.tar (crane push; docker/podman load) without a container runtime.
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -gcflags=all=-dwarf=false -ldflags="-s -w" -o $(BIN)/fencer-linux-amd64 ./cmd/fencer
	cd hack/tools/image && go run . --binary $(BIN)/fencer-linux-amd64 --tag $(IMAGE) --out $(BIN)/fencer-image.tar
	@echo "image $(IMAGE) written to $(BIN)/fencer-image.tar"

.PHONY: manifests
manifests: tools ## Generate CRDs and RBAC into config/ from the API types and markers.
	$(CONTROLLER_GEN) rbac:roleName=fencer-manager crd paths="./api/...;./controllers/...;./internal/webhook/...;./internal/metrics/..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@bash hack/sync-chart.sh

.PHONY: generate
generate: tools ## Generate DeepCopy methods for the API types.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths="./api/..."

.PHONY: verify-generated
verify-generated: tools ## Fail when generated files differ from what `make manifests generate` writes.
	@bash hack/verify-generated.sh

##@ Run

.PHONY: dev
NODE ?= kwok
dev: tools manifests generate build ## Run a local cluster with fencer on loopback; kubeconfig in bin/dev/kubeconfig. NODE=real adds a real node (root).
	go build -o $(BIN)/fencer-dev ./hack/dev
	exec $(BIN)/fencer-dev --dir $(BIN)/dev --bin $(BIN) --manager $(BIN)/fencer $(if $(filter real,$(NODE)),--real-node)

##@ Test

.PHONY: test
test: tools verify-generated fmt hygiene vet lint test-unit ## Everything CI runs: generated-file check, vet, unit, integration (envtest), chart, image and the make-dev smoke test.
	@echo "test-integration, test-chart, test-image and test-dev-smoke run side by side (about 5 minutes); each prints its output when it ends"
	@$(MAKE) --no-print-directory -j 3 --output-sync=target test-clusters

# The suites that start clusters spend most of their time waiting on them
# (timers, leases, pods going Ready): on 2 cores, test-integration used 143 s
# of CPU in 265 s, test-chart 93 s in 101 s and test-dev-smoke 97 s in 142 s.
# So they run side by side, each printing its output whole when it ends.
# They cannot take each other's ports: envtest's come from the kernel's
# ephemeral range, the dev clusters' from below it, each reserved
# machine-wide (test/support/devcluster).
.PHONY: test-clusters
test-clusters: test-integration test-chart test-image test-dev-smoke

.PHONY: fmt
fmt: ## Fail when a Go file is not gofmt-ed (lists them).
	@files=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$files" ]; then echo "not gofmt-ed (run gofmt -w):"; echo "$$files"; exit 1; fi

.PHONY: hygiene
hygiene: ## Fail on a tracked file over 1 MB (build outputs belong in bin/), a doc linking outside the repository, fencer's builds and the tools' compiled with different flags or a module they share at different versions, or a package under internal/ that no shipped binary links.
	@big=$$(git ls-files -z | xargs -0 stat -c '%s %n' | awk '$$1 > 1048576 {print $$2}'); \
	if [ -n "$$big" ]; then echo "tracked files over 1 MB:"; echo "$$big"; exit 1; fi
	@out=$$(grep -rlE '\]\((\.\./)+shared/' README.md docs || true); \
	if [ -n "$$out" ]; then echo "docs link outside the repository:"; echo "$$out"; exit 1; fi
	@bash hack/verify-shared-deps.sh
	@linked=$$(go list -deps ./cmd/fencer ./cmd/kubectl-fencer); \
	for p in $$(go list ./internal/...); do grep -qx "$$p" <<< "$$linked" || \
		{ echo "$$p is under internal/ but neither cmd/fencer nor cmd/kubectl-fencer links it: test and dev scaffolding belongs in test/support/"; exit 1; }; done

# Every Go module of the repository (the tool modules only build tools).
LINT_MODULES := . hack/tools/bench hack/tools/image hack/tools/prometheus test/chart
.PHONY: lint
lint: tools ## golangci-lint (built from its module into bin/) over every module, with .golangci.yml.
	@for m in $(LINT_MODULES); do echo "lint: $$m"; (cd $$m && $(BIN)/golangci-lint run --config $(CURDIR)/.golangci.yml ./...) || exit 1; done

.PHONY: vet
vet: ## go vet every package, the chart tests' module included.
	go vet ./...
	cd test/chart && go vet ./...

.PHONY: test-unit
test-unit: tools ## Unit tests (the etcd store tests run a real etcd from bin/).
	FENCER_BIN=$(BIN) go test $(GO_TEST_FLAGS) ./api/... ./cmd/... ./internal/... ./controllers/... ./pkg/... ./examples/... ./test/support/... ./test/bench/floorwebhook/

.PHONY: test-integration
test-integration: tools ## envtest integration tests against the kube-apiserver and etcd in bin/.
	FENCER_BIN=$(BIN) go test $(GO_TEST_FLAGS) -p $(GO_TEST_PARALLEL) ./test/integration/...

.PHONY: test-chart
test-chart: tools ## helm lint/template/install/upgrade/uninstall of charts/fencer against a real apiserver.
	cd test/chart && go vet ./... && FENCER_BIN=$(BIN) go test $(GO_TEST_FLAGS) ./...

.PHONY: test-image
test-image: image ## make image, then read the tarball back, run its binary, and crane push it to a loopback registry.
	cd hack/tools/image && FENCER_IMAGE_BINARY=$(BIN)/fencer-linux-amd64 FENCER_IMAGE_TAR=$(BIN)/fencer-image.tar go test $(GO_TEST_FLAGS) ./...

.PHONY: test-dev-smoke
test-dev-smoke: tools build ## Bring up the make-dev cluster, run a 3-pod Deployment to Ready, stop it, check no process is left.
	FENCER_BIN=$(BIN) go test $(GO_TEST_FLAGS) -timeout 10m ./test/smoke/...

STORIES := scheduled-job index-publisher attempt-ids unique-ids directory-moves statefulset-zombie
STORY_IMAGE = fencer.example/story-$(STORY):dev

.PHONY: demo
demo: ## Play an example story against `make dev` (in another terminal): STORY=scheduled-job|index-publisher|attempt-ids|unique-ids|directory-moves (as root: it runs PostgreSQL)|statefulset-zombie. NODE=real runs its pods on the real node of `make dev NODE=real`.
	@if [ -z "$(filter $(STORY),$(STORIES))" ]; then echo "make demo STORY=<name>, one of: $(STORIES)"; exit 2; fi
	CGO_ENABLED=0 go build -o $(BIN)/story-$(STORY) ./examples/$(STORY)
ifeq ($(NODE),real)
	cd hack/tools/image && go run . --binary $(BIN)/story-$(STORY) --tag $(STORY_IMAGE) --out $(BIN)/story-$(STORY).tar --entrypoint story
	ctr --address $(CURDIR)/bin/dev/real-node/containerd/containerd.sock -n k8s.io images import $(BIN)/story-$(STORY).tar
endif
	KUBECONFIG=$${KUBECONFIG:-$(CURDIR)/bin/dev/kubeconfig} STORY_DIR=$(CURDIR)/examples/$(STORY) \
		$(if $(filter real,$(NODE)),STORY_IMAGE=$(STORY_IMAGE)) $(BIN)/story-$(STORY) demo

.PHONY: test-real-node
test-real-node: tools build image ## Root only: a real node (kubelet, kube-proxy, CoreDNS; containerd, runc, CNI from Debian) next to kwok: helm install and helm test of the chart, workers reading tokens, an IDRange consumer restarted, the five stories as pods, workload members cut off by a real partition (kubelet frozen, pod force-deleted) and refused by every fence, and a teardown that leaves nothing behind.
	FENCER_BIN=$(BIN) go test $(GO_TEST_FLAGS) -v -timeout 15m ./test/realnode/...

.PHONY: test-db
test-db: tools build ## Root only: the database fence (pkg/dbfence) and the directory-moves story (on the dev cluster) against a real PostgreSQL from Debian's postgresql package (apt-get installed when missing), run as the postgres user on a unix socket and torn down after.
	FENCER_TEST_DB=1 FENCER_BIN=$(BIN) go test $(GO_TEST_FLAGS) -v ./pkg/dbfence/... | grep -vE '^=== RUN'
	FENCER_TEST_DB=1 FENCER_BIN=$(BIN) go test $(GO_TEST_FLAGS) -v -run 'TestDevCluster/the_example_stories/directory-moves' ./test/smoke/ | grep -vE '^=== RUN'

FAULT_DURATION ?= 2m
.PHONY: test-faults
test-faults: tools ## Fault run: a seeded nemesis against 3 etcd members, 2 managers and 4 SDK workers for FAULT_DURATION (default 2m), the workers also writing PostgreSQL through the database guard when run as root, then the history checker; plus the checker's own tests.
	FENCER_TEST_DB=$$([ "$$(id -u)" = 0 ] && echo 1) FENCER_BIN=$(BIN) FAULT_DURATION=$(FAULT_DURATION) go test $(GO_TEST_FLAGS) -v -timeout 90m ./test/e2e/...

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 30s).
	@bash hack/fuzz.sh $${FUZZTIME:-30s}

.PHONY: clean
clean: ## Remove bin/ (tool builds included; the next build is cold).
	rm -rf $(BIN)

##@ Benchmarks

BENCHTIME ?= 2s
# Failover trials per system and TTL in make bench: the issue's target
# asks for at least 100 (go test's own default is 30, for a quick look).
FAILOVER_TRIALS ?= 100
BENCH_OUT := $(BIN)/bench/latest.txt
.PHONY: bench
bench: tools ## Every measurement of docs/performance.md: Go benchmarks (IDs with their anchors, webhook handler, live-token reader), failover vs client-go and etcd elections, admission, scale. Tables on stdout, results in bin/bench/latest.txt, charts in docs/perf/.
	@mkdir -p $(BIN)/bench && rm -f $(BENCH_OUT)
	FENCER_BIN=$(BIN) go test -run '^$$' -bench . -benchtime $(BENCHTIME) -count 1 ./internal/etcdstore/ ./internal/webhook/ ./pkg/... | tee -a $(BENCH_OUT) | grep -E '^(Benchmark|goos|goarch|cpu|pkg)'
	@echo "pkg: github.com/fencer-io/fencer/test/bench" >> $(BENCH_OUT)
	FENCER_TEST_DB=$$([ "$$(id -u)" = 0 ] && echo 1) FAILOVER_TRIALS=$(FAILOVER_TRIALS) FENCER_BIN=$(BIN) FENCER_BENCH_OUT=$(BENCH_OUT) go test -count=1 -v -timeout 90m ./test/bench/ | grep -vE '^(=== RUN|--- PASS|PASS$$|ok )'
	cd hack/tools/bench && go run ./cmd/perfcharts $(BENCH_OUT) $(CURDIR)/docs/perf

.PHONY: bench-record
bench-record: ## Keep bin/bench/latest.txt as the recorded run, docs/perf/bench.txt, that bench-compare compares against.
	cp $(BENCH_OUT) docs/perf/bench.txt

.PHONY: bench-compare
bench-compare: ## benchstat: the last `make bench` (bin/bench/latest.txt) against the recorded run (docs/perf/bench.txt).
	cd hack/tools/bench && go tool benchstat -ignore cpu $(CURDIR)/docs/perf/bench.txt $(BENCH_OUT)
