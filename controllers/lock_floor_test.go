package controllers

import (
	"context"
	"strconv"
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

// A manager that cannot record (KeepFloor) keeps a floor an earlier check
// left while etcd's revision is below it, and deletes it once the revision
// has passed it, as the check would: it neither drops the protection nor
// keeps grants closed for ever.
func TestLockFloorKeptUntilEtcdPassesIt(t *testing.T) {
	e := testenv.StartSecureEtcd(t, etcdkeys.DefaultPrefix)
	cli := e.Client(t, "manager")
	ctx := context.Background()
	floor := etcdkeys.LockFloorKey(etcdkeys.DefaultPrefix)
	f := &LockFloor{Etcd: cli, Prefix: etcdkeys.DefaultPrefix, KeepFloor: true, Log: logr.Discard()}
	resp, err := cli.Put(ctx, floor, "1000000")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.passFloor(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := cli.Get(ctx, floor); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("a floor above etcd's revision %d: %v, %v; want it kept", resp.Header.Revision, got.Kvs, err)
	}
	if _, err := cli.Put(ctx, floor, strconv.FormatInt(resp.Header.Revision, 10)); err != nil {
		t.Fatal(err)
	}
	if err := f.passFloor(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := cli.Get(ctx, floor); err != nil || len(got.Kvs) != 0 {
		t.Fatalf("a floor etcd's revision has passed: %v, %v; want it deleted", got.Kvs, err)
	}
}
