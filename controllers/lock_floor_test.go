package controllers

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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

// The check keeps a floor above its record: the record was lost or went
// back after an earlier check closed the floor (the ConfigMap deleted,
// renamed with the release, edited, or restored from a cluster backup),
// and etcd has still not passed the floor.
// Before, the check read the missing record as 0, deleted the floor and
// recorded etcd's low revision, which forgot the regression for good.
func TestLockFloorCheckKeepsAFloorWhoseRecordWasLost(t *testing.T) {
	e := testenv.StartSecureEtcd(t, etcdkeys.DefaultPrefix)
	cli := e.Client(t, "manager")
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	api := fake.NewClientBuilder().WithScheme(scheme).Build() // no record
	f := &LockFloor{Client: api, Reader: api, Etcd: cli, Prefix: etcdkeys.DefaultPrefix,
		Record: types.NamespacedName{Namespace: "fencer-system", Name: "fencer-etcd-revision"}, Log: logr.Discard()}
	floor := etcdkeys.LockFloorKey(etcdkeys.DefaultPrefix)
	if _, err := cli.Put(ctx, floor, "1000000"); err != nil {
		t.Fatal(err)
	}
	if err := f.check(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := cli.Get(ctx, floor); err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "1000000" {
		t.Fatalf("a floor above etcd's revision with its record lost: %v, %v; want it kept", got.Kvs, err)
	}
	// Once etcd passes it, the check opens and records as usual.
	resp, err := cli.Put(ctx, floor, "3\n") // as etcdctl put from stdin leaves it
	if err != nil {
		t.Fatal(err)
	}
	if err := f.check(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := cli.Get(ctx, floor); err != nil || len(got.Kvs) != 0 {
		t.Fatalf("a floor etcd passed: %v, %v; want it deleted", got.Kvs, err)
	}
	cm := &corev1.ConfigMap{}
	if err := api.Get(ctx, f.Record, cm); err != nil {
		t.Fatal(err)
	}
	if got, _ := strconv.ParseInt(cm.Data[revisionKey], 10, 64); got < resp.Header.Revision {
		t.Fatalf("recorded %q, want at least %d", cm.Data[revisionKey], resp.Header.Revision)
	}
	// A record that went back (restored from a cluster backup, lowered by
	// hand) below a floor does not open it either.
	if _, err := cli.Put(ctx, floor, "1000000"); err != nil {
		t.Fatal(err)
	}
	if err := f.check(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := cli.Get(ctx, floor); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("a floor above a record that went back: %v, %v; want it kept", got.Kvs, err)
	}
}

// A floor written by hand with a trailing newline is read as its number,
// by a manager that cannot record too: kept while etcd is below it, deleted
// once etcd passes it (before, a value that did not parse stayed for ever,
// and kept grants and keyed locks closed).
func TestLockFloorReadsAHandWrittenFloor(t *testing.T) {
	e := testenv.StartSecureEtcd(t, etcdkeys.DefaultPrefix)
	cli := e.Client(t, "manager")
	ctx := context.Background()
	floor := etcdkeys.LockFloorKey(etcdkeys.DefaultPrefix)
	f := &LockFloor{Etcd: cli, Prefix: etcdkeys.DefaultPrefix, KeepFloor: true, Log: logr.Discard()}
	for _, tc := range []struct {
		value string
		kept  bool
	}{{"1000000\n", true}, {"1\n", false}, {"not a revision", false}} {
		if _, err := cli.Put(ctx, floor, tc.value); err != nil {
			t.Fatal(err)
		}
		if err := f.passFloor(ctx); err != nil {
			t.Fatalf("%q: %v", tc.value, err)
		}
		got, err := cli.Get(ctx, floor)
		if err != nil {
			t.Fatal(err)
		}
		if kept := len(got.Kvs) == 1; kept != tc.kept {
			t.Errorf("floor %q: kept = %v, want %v", tc.value, kept, tc.kept)
		}
	}
}
