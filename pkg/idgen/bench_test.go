package idgen

import (
	"context"
	"testing"
	"time"
)

func benchBlocks(b *testing.B, size int64) *Blocks {
	return benchBlocksWith(b, BlockOptions{BlockSize: size})
}

// benchBlocksWith starts an allocator with o on a fresh etcd, its first
// block already claimed.
func benchBlocksWith(b *testing.B, o BlockOptions) *Blocks {
	cli := startEtcd(b)
	o.Namespace, o.Name, o.Min, o.Max = "ns", "bench", 0, 1<<62
	a, err := NewBlocks(cli, o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(a.Close)
	if _, err := a.Next(context.Background()); err != nil { // claim the first block outside the timer
		b.Fatal(err)
	}
	return a
}

// BenchmarkBlocksNext: one goroutine, blocks of 100,000.
func BenchmarkBlocksNext(b *testing.B) {
	a := benchBlocks(b, 100_000)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := a.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBlocksNextParallel: GOMAXPROCS goroutines on one allocator.
func BenchmarkBlocksNextParallel(b *testing.B) {
	a := benchBlocks(b, 100_000)
	ctx := context.Background()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := a.Next(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkBlocksBoundaryLatency: blocks of 1,000, so a boundary every
// 1,000 IDs; reports the p99.9 and max latency of single Next calls. With
// prefetching the boundary should not show at p99.9.
func BenchmarkBlocksBoundaryLatency(b *testing.B) {
	benchNextTail(b, benchBlocks(b, 1_000))
}

// benchNextTail times every single Next call and reports their p99.9 and
// maximum.
func benchNextTail(b *testing.B, a *Blocks) {
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := a.Next(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportTail(b, lat)
}

// BenchmarkSnowflakeNext: one generator; bounded by 2,048 IDs per ms.
func BenchmarkSnowflakeNext(b *testing.B) {
	cli := startEtcd(b)
	g, err := NewSnowflake(context.Background(), cli, SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: 1, Token: leaseSlotB(b, cli, 1), PodUID: "uid-p"})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := g.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
