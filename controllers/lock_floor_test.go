package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// A manager started with the revision check off deletes a lock floor an
// earlier check left: nothing else would, and while it stays no Lease is
// granted and no keyed lock queued.
func TestLockFloorLeftByAnEarlierCheckIsDeleted(t *testing.T) {
	e := testenv.StartSecureEtcd(t, etcdkeys.DefaultPrefix)
	cli := e.Client(t, "manager")
	ctx := context.Background()
	floor := etcdkeys.LockFloorKey(etcdkeys.DefaultPrefix)
	if _, err := cli.Put(ctx, floor, "5000"); err != nil {
		t.Fatal(err)
	}
	f := &LockFloor{Etcd: cli, Prefix: etcdkeys.DefaultPrefix, Every: 10 * time.Millisecond, Log: logr.Discard()} // no Record: the check is off
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, floor)
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the floor after the leftover check: %v, %v; want it deleted", resp.Kvs, err)
	}
	if err := f.Start(ctx); err != nil { // no floor: nothing to do
		t.Fatal(err)
	}
}
