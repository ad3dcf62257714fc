package lockview_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/internal/lockview"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// The view of locks taken through the SDK: the holder of each key with its
// token, the waiters behind it, the filters, and the per-namespace counts.
func TestListShowsHoldersAndWaiters(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testenv.Etcd(t)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	locker := func(ns, pod string) *fence.Locker {
		l, err := fence.NewLocker(cli, "/fencer", ns, fence.LockerOptions{Pod: pod, PodUID: "uid-" + pod})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(ctx) })
		return l
	}
	before := time.Now().Add(-time.Second)
	a, err := locker("a", "p0").Lock(ctx, "dir/x", "tree")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locker("b", "p2").Lock(ctx, "dir/x"); err != nil {
		t.Fatal(err)
	}
	queued := make(chan *fence.Lock, 1)
	go func() {
		lk, err := locker("a", "p1").Lock(ctx, "dir/x")
		if err == nil {
			queued <- lk
		}
	}()
	var locks []lockview.Lock
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if locks, err = lockview.List(ctx, cli, "/fencer", "", ""); err != nil {
			t.Fatal(err)
		}
		if len(locks) == 3 && locks[0].Waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("locks %+v: want a/dir/x with one waiter, a/tree and b/dir/x", locks)
		}
	}
	x := locks[0]
	if x.Namespace != "a" || x.Key != "dir/x" || x.Token != a.Token("dir/x").Value || x.Pod != "p0" || x.PodUID != "uid-p0" || x.Since.Before(before) {
		t.Errorf("a/dir/x: %+v, want p0 holding under token %d", x, a.Token("dir/x").Value)
	}
	if locks[1].Key != "tree" || locks[2].Namespace != "b" {
		t.Errorf("order: %+v", locks)
	}
	if got := lockview.CountByNamespace(locks); got["a"] != (lockview.Counts{Held: 2, Waiting: 1}) || got["b"] != (lockview.Counts{Held: 1}) {
		t.Errorf("counts %+v", got)
	}
	if only, _ := lockview.List(ctx, cli, "/fencer", "a", "dir/"); len(only) != 1 || only[0].Key != "dir/x" {
		t.Errorf("namespace a, keys dir/: %+v", only)
	}

	// The waiter's turn: it holds, and shows when its turn came.
	unlocked := time.Now().Truncate(time.Millisecond)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	next := <-queued
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		locks, _ = lockview.List(ctx, cli, "/fencer", "a", "dir/x")
		if len(locks) == 1 && locks[0].Pod == "p1" && !locks[0].Since.Before(unlocked) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the hand-off: %+v, want p1 holding since its turn came", locks)
		}
	}
	if locks[0].Token != next.Token("dir/x").Value || locks[0].Waiting != 0 {
		t.Errorf("after the hand-off: %+v", locks[0])
	}
}
