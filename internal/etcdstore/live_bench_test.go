package etcdstore

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// BenchmarkLiveReaderLookup asks one question at a time, as a webhook at
// concurrency 1 does, beside the same transaction made directly, with and
// without the store's timeout: what the reader's batching and hand-off add
// to the read every acceptance needs, in latency and in this process's CPU
// (cpu-ns/op, from getrusage). etcd runs in its own process.
func BenchmarkLiveReaderLookup(b *testing.B) {
	cli := startEtcd(b)
	ctx := context.Background()
	s := NewStore(cli, DefaultPrefix, nil, nil)
	refs := []leaseRef{{"ns", "l0"}}
	r := NewLiveReader(s, nil)
	for _, bm := range []struct {
		name string
		op   func() error
	}{
		{"direct", func() error { _, err := s.readLives(ctx, refs); return err }},
		{"direct-with-timeout", func() error {
			ctx, cancel := s.bound(ctx)
			defer cancel()
			_, err := s.readLives(ctx, refs)
			return err
		}},
		{"lookup", func() error { _, err := r.Lookup(ctx, "ns", "l0"); return err }},
	} {
		b.Run(bm.name, func(b *testing.B) {
			before := cpuTime()
			for b.Loop() {
				if err := bm.op(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is this process's CPU time, user and system.
func cpuTime() time.Duration {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
