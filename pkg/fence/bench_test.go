package fence

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkFencedTxn: one fenced Put against a local etcd, round trip included.
func BenchmarkFencedTxn(b *testing.B) {
	cli := connectB(b, startEtcdB(b))
	tok := grantB(b, cli, "bench", 60)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := NewTxn(cli, prefix, "ns", tok).Then(clientv3.OpPut("/bench/x", "v")).Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
