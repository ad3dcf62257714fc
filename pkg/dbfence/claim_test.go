package dbfence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// The install's name comes from etcd itself: two clusters give two names,
// so their tokens are never compared.
func TestInstallOfNamesTheCluster(t *testing.T) {
	names := map[string]bool{}
	for range 2 {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testenv.Etcd(t)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		name, err := dbfence.InstallOf(context.Background(), cli, "")
		if err != nil || !strings.HasPrefix(name, "/fencer@") {
			t.Fatalf("InstallOf: %q %v", name, err)
		}
		names[name] = true
	}
	if len(names) != 2 {
		t.Fatalf("two etcd clusters, one name: %v", names)
	}
}

// A claim at tenure start refuses the old holder's first write to a
// resource the new holder has not written yet.
func TestClaimRaisesTheFloorBeforeAnyWrite(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	if err := write(ctx, db, table, nil, 10, "ten"); err != nil {
		t.Fatal(err)
	}
	if err := table.Claim(ctx, db, res, 20); err != nil {
		t.Fatal(err)
	}
	var stale *dbfence.StaleError
	if err := write(ctx, db, table, nil, 10, "stale"); !errors.As(err, &stale) || stale.Floor != 20 {
		t.Fatalf("the old holder after the claim: %v", err)
	}
}

// An answer without a header names no install: an error, never a name
// like "/fencer@0" under which tokens would go to rows of their own.
func TestInstallOfAnAnswerWithoutAHeader(t *testing.T) {
	cli, b := testenv.BrokenClient(t, testenv.Etcd(t))
	for name, breaks := range map[string]func(any){"no header": testenv.NoHeader, "a header without a cluster ID": testenv.EmptyHeader} {
		b.Next(testenv.KVRange, breaks)
		if install, err := dbfence.InstallOf(context.Background(), cli, ""); !errors.Is(err, etcdreply.ErrMalformed) {
			t.Fatalf("%s: InstallOf: %q, %v; want an error naming the broken answer", name, install, err)
		}
	}
}
