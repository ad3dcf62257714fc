package fence_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/fence"
)

// Move a file between two directories: lock both directories and the tree
// as one set, in any order, then write under the target's token.
func ExampleLocker_Lock() {
	ctx := context.Background()
	access, err := fence.LoadEtcdAccess(fence.DefaultCredentialsDir)
	if err != nil {
		log.Fatal(err)
	}
	cli, err := clientv3.New(access.Config)
	if err != nil {
		log.Fatal(err)
	}
	// One Locker per process: its locks share one etcd session.
	locker, err := fence.NewLocker(cli, access.Prefix, "default", fence.LockerOptions{Pod: "web-7f9c", PodUID: "5e0c…"})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(ctx)

	lk, err := locker.Lock(ctx, "dir/inbox", "dir/archive", "tree")
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := lk.Unlock(ctx); err != nil {
			log.Print(err) // errors.Is(err, fence.ErrLockLost): the work above may not have been protected
		}
	}()
	_, err = fence.NewTxn(cli, access.Prefix, "default", lk.Token("dir/archive")).
		Then(clientv3.OpPut("/fencer/data/default/archive/report.pdf", "…")).
		Commit(lk.Context()) // ends the moment the lock is lost
	var fenced *fence.FencedError
	if errors.As(err, &fenced) {
		log.Printf("lost the lock on %s before the write: nothing was written", fenced.Key)
	}
}

// On a write path, a lock that cannot be had in time refuses the request
// instead of writing unlocked.
func ExampleLocker_TryLock() {
	var locker *fence.Locker // from fence.NewLocker
	handler := func(w http.ResponseWriter, r *http.Request) {
		lk, err := locker.TryLock(r.Context(), 2*time.Second, "order/"+r.PathValue("id"))
		if errors.Is(err, fence.ErrLockBusy) || errors.Is(err, fence.ErrEtcdUnavailable) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "the order is being changed; retry", http.StatusServiceUnavailable)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer func() { _ = lk.Unlock(context.WithoutCancel(r.Context())) }()
		// ... write under lk.Token("order/" + id)
	}
	_ = handler
}
