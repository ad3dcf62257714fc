package idgen

import (
	"context"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/sony/sonyflake/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The anchors of issue #9: what a user would otherwise reach for, measured in
// the same run on the same machine as the block allocator.

// BenchmarkAnchorEtcdTxnPerID: one compare-and-swap transaction on a
// counter key per ID, the simplest correct allocator on etcd.
func BenchmarkAnchorEtcdTxnPerID(b *testing.B) {
	cli := startEtcd(b)
	ctx := context.Background()
	const key = "/bench/counter"
	var rev, n int64
	b.ResetTimer()
	for b.Loop() {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, strconv.FormatInt(n+1, 10))).
			Commit()
		if err != nil {
			b.Fatal(err)
		}
		if !resp.Succeeded {
			b.Fatal("lost the compare-and-swap with no competitor")
		}
		rev, n = resp.Header.Revision, n+1
	}
}

func newSonyflake(b *testing.B) *sonyflake.Sonyflake {
	sf, err := sonyflake.New(sonyflake.Settings{MachineID: func() (int, error) { return 1, nil }})
	if err != nil {
		b.Fatal(err)
	}
	return sf
}

// BenchmarkAnchorSonyflake: sonyflake v2 with its defaults (10 ms time
// unit, 8 sequence bits: at most 25,600 IDs/s per generator).
func BenchmarkAnchorSonyflake(b *testing.B) {
	sf := newSonyflake(b)
	for b.Loop() {
		if _, err := sf.NextID(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAnchorSonyflakeParallel: GOMAXPROCS goroutines on one generator.
func BenchmarkAnchorSonyflakeParallel(b *testing.B) {
	sf := newSonyflake(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := sf.NextID(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAnchorUUIDv7: google/uuid's NewV7 (128-bit, random bits, no
// coordination).
func BenchmarkAnchorUUIDv7(b *testing.B) {
	for b.Loop() {
		if _, err := uuid.NewV7(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAnchorUUIDv7Parallel: GOMAXPROCS goroutines.
func BenchmarkAnchorUUIDv7Parallel(b *testing.B) {
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := uuid.NewV7(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkBlocksBoundaryLatencySizes: p99.9 and max latency of single
// Next calls with blocks of 100,000 (the default) and with adaptive blocks
// that start at 1,000 and may grow to 1,000,000, next to the fixed 1,000 of
// BenchmarkBlocksBoundaryLatency.
func BenchmarkBlocksBoundaryLatencySizes(b *testing.B) {
	for _, c := range []struct {
		name string
		opts BlockOptions
	}{
		{"fixed=100000", BlockOptions{BlockSize: 100_000}},
		{"adaptive=1000-1000000", BlockOptions{BlockSize: 1_000, Adaptive: true, MaxBlockSize: 1_000_000, TargetDuration: 100 * time.Millisecond}},
	} {
		b.Run(c.name, func(b *testing.B) { benchNextTail(b, benchBlocksWith(b, c.opts)) })
	}
}

func reportTail(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)*999/1000].Nanoseconds()), "p99.9-ns")
		b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds()), "max-ns")
	}
}
