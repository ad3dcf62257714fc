package etcdstore

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

func dbSize(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	st, err := cli.Status(context.Background(), cli.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	return st.DbSize
}

// churn overwrites one data key n times with 1 KiB values, as a snowflake
// generator's clock key or a busy block allocator does.
func churn(t *testing.T, cli *clientv3.Client, n int) {
	t.Helper()
	v := strings.Repeat("x", 1024)
	for range n {
		if _, err := cli.Put(context.Background(), "/fencer/data/ns/busy", v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMaintenanceKeepsTokensAndBoundsTheDatabase: rounds of heavy writes,
// each followed by a maintenance round, keep the backend bounded; a live
// grant's token (its CreateRevision) survives every compaction, and a watch
// started before the compactions still delivers.
func TestMaintenanceKeepsTokensAndBoundsTheDatabase(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	key := etcdkeys.LeaseKey(DefaultPrefix, "ns", "report")
	put, err := cli.Put(ctx, key, "{}")
	if err != nil {
		t.Fatal(err)
	}
	token := put.Header.Revision
	watch := cli.Watch(ctx, key)

	m := &Maintainer{Cli: cli, DefragFree: 1 << 20, Log: testr.New(t)}
	// FENCER_MAINTENANCE_ROUNDS makes it a long run (docs/operations.md).
	rounds, writes := 12, 2000
	if n, err := strconv.Atoi(os.Getenv("FENCER_MAINTENANCE_ROUNDS")); err == nil && n > 2 {
		rounds = n
	}
	var sizes []int64
	for range rounds {
		churn(t, cli, writes)
		m.Run(ctx)
		sizes = append(sizes, dbSize(t, cli))
	}
	if rounds > 20 {
		t.Logf("backend size after %d rounds of %d 1 KiB writes plus maintenance: max %d bytes, last %d bytes", rounds, writes, slices.Max(sizes), sizes[len(sizes)-1])
	} else {
		t.Logf("backend size after each round of %d 1 KiB writes plus maintenance: %v bytes", writes, sizes)
	}
	// Unmaintained, 24,000 KiB-sized revisions take over 24 MiB. Maintained,
	// a round's history (about 2 MiB) plus free pages is all that stays.
	for i, s := range sizes[2:] {
		if s > 3*sizes[1] {
			t.Errorf("round %d: backend %d bytes, more than 3× round 1's %d: not bounded", i+2, s, sizes[1])
		}
	}
	if _, err := cli.Get(ctx, key, clientv3.WithRev(token)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Errorf("reading at the grant's revision after maintenance: want compacted, got %v", err)
	}
	got, err := cli.Get(ctx, key)
	if err != nil || len(got.Kvs) != 1 || got.Kvs[0].CreateRevision != token {
		t.Fatalf("the grant's token changed across compaction: %v, %v", got, err)
	}
	if _, err := cli.Put(ctx, key, `{"renewed":true}`); err != nil {
		t.Fatal(err)
	}
	wr := <-watch
	if wr.Err() != nil || len(wr.Events) != 1 || wr.Events[0].Kv.CreateRevision != token {
		t.Errorf("a watch opened before the compactions: %+v, err %v", wr.Events, wr.Err())
	}
}

// TestMaintenanceRecoversFromNoSpace: a full backend raises NOSPACE and
// refuses writes; one maintenance round frees it and disarms the alarm.
func TestMaintenanceRecoversFromNoSpace(t *testing.T) {
	cli := startEtcd(t, "--quota-backend-bytes=4194304")
	ctx := context.Background()
	var err error
	for i := 0; i < 100000 && err == nil; i++ {
		_, err = cli.Put(ctx, "/fencer/data/ns/busy", strings.Repeat("x", 16*1024))
	}
	if !IsNoSpace(err) {
		t.Fatalf("filling a 4 MiB backend: want NOSPACE, got %v", err)
	}
	m := &Maintainer{Cli: cli, DefragFree: 1 << 20, Log: testr.New(t)}
	m.Run(ctx)
	alarms, err := cli.AlarmList(ctx)
	if err != nil || len(alarms.Alarms) != 0 {
		t.Fatalf("alarms after recovery: %v, %v", alarms, err)
	}
	if _, err := cli.Put(ctx, etcdkeys.LeaseKey(DefaultPrefix, "ns", "report"), "{}"); err != nil {
		t.Fatalf("writing after recovery: %v", err)
	}
}
