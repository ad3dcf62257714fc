// Benchmark tooling for `make bench`: benchstat for `make bench-compare`,
// and the PNG charts in docs/perf/. Its own module, so that neither enters
// fencer's dependency graph.
module github.com/fencer-io/fencer/hack/tools/bench

go 1.26.0

tool golang.org/x/perf/cmd/benchstat

require golang.org/x/image v0.48.0

require (
	github.com/aclements/go-moremath v0.0.0-20210112150236-f10218a38794 // indirect
	golang.org/x/perf v0.0.0-20260908200009-22c9c6c9d4da // indirect
)
