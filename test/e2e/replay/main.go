// Command replay re-runs the fault checker on the histories a run left in
// bin/faults/<seed>/, printing every violation and the summary line; it
// exits 1 when a guarantee was violated.
//
//	go run ./test/e2e/replay bin/faults/<seed>
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/e2e/history"
)

func main() {
	prefix := flag.String("etcd-prefix", etcdkeys.DefaultPrefix, "fencer's etcd prefix in the run")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: replay [--etcd-prefix=/fencer] bin/faults/<seed>")
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	hs, err := history.Load(flag.Arg(0), *prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, "replay:", err)
		os.Exit(2)
	}
	if len(hs.Attempts) == 0 && len(hs.Etcd) == 0 {
		fmt.Fprintf(os.Stderr, "replay: no histories in %s (want workers/*.jsonl and etcd.jsonl)\n", flag.Arg(0))
		os.Exit(2)
	}
	r := history.Check(hs)
	for _, v := range r.Violations {
		fmt.Println("violation:", v)
	}
	fmt.Printf("refused by reason: %v; IDs issued %d\n", r.RefusedBy, r.IDs)
	fmt.Println(r.Summary())
	if !r.OK() {
		os.Exit(1)
	}
}
