package idgen

import (
	"context"
	"errors"
	"testing"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// A snowflake generator whose reads etcd answers broken (what a faulty
// proxy could send) fails with an error, never a panic, and never takes
// its slot from what it could not read.
func TestASnowflakeAnsweredBrokenIsAnError(t *testing.T) {
	cli, b := testenv.BrokenClient(t, testenv.Etcd(t))
	tok := leaseSlot(t, cli, 1)
	opts := SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: 1, Token: tok, PodUID: "uid-p"}
	for name, breaks := range map[string]func(any){"no responses": testenv.NoResponses, "puts for the reads": testenv.PutsForReads, "a header without a revision": testenv.EmptyHeader} {
		b.Next(testenv.KVTxn, breaks)
		if g, err := NewSnowflake(context.Background(), cli, opts); !errors.Is(err, etcdreply.ErrMalformed) {
			t.Fatalf("%s: NewSnowflake: %v, %v; want an error naming the broken answer", name, g, err)
		}
	}
	g, err := NewSnowflake(context.Background(), cli, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// A reservation answered without a header: its outcome is unknown, so
	// the generator issues nothing under it.
	b.Next(testenv.KVTxn, testenv.NoHeader)
	if id, err := g.Next(context.Background()); !errors.Is(err, etcdreply.ErrMalformed) {
		t.Fatalf("Next with its reservation answered without a header: %d, %v; want an error naming it", id, err)
	}
}
