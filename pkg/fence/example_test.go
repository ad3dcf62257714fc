package fence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/pkg/fence"
)

// Read the token from the Downward API file and stamp it on an object.
func ExampleStamp() {
	ann, _ := fence.ParseAnnotations([]byte(`lease.fencer.io/report="354"`))
	tok, err := fence.TokenFromAnnotations(ann, "report")
	if err != nil {
		log.Fatal(err) // errors.Is(err, fence.ErrNotHolder): not the holder
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "report-output"}}
	fence.Stamp(cm, tok)
	fmt.Println(cm.Labels["fencer.io/lease"], cm.Annotations["fencer.io/token"])
	// Output: report 354
}

// Wrap a controller-runtime client for one tenure: every write carries the
// token RunExclusive handed out, and fencer's refusal comes back typed, read
// from the denial's structured causes.
func ExampleNewClient() {
	var c client.Client // from your manager or client.New
	src := fence.FileSource{Path: "/etc/fencer/annotations", Lease: "report"}
	_ = fence.RunExclusive(context.Background(), src, "report", time.Second, func(ctx context.Context, tok fence.Token) error {
		fenced := fence.NewClient(c, tok)
		err := fenced.Update(ctx, &corev1.ConfigMap{})
		var stale *fence.StaleTokenError
		if errors.As(err, &stale) {
			log.Printf("lease %s moved on (%s): sent %d, current %d held by %s; stop writing",
				stale.Lease, stale.Reason, stale.Offered, stale.Current, stale.Holder)
		}
		return err
	})
}

// Write etcd keys only while the token is live.
func ExampleNewTxn() {
	cli, _ := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379"}})
	tok := fence.Token{Lease: "report", Value: 354}
	_, err := fence.NewTxn(cli, "/fencer", "default", tok).
		Then(clientv3.OpPut("/app/report/latest", "…")).
		Commit(context.Background())
	var fenced *fence.FencedError
	if errors.As(err, &fenced) {
		log.Printf("fenced off: %v", fenced)
	}
}

// Keep a renewal: Direct lease alive and stop work the moment it is lost.
func ExampleHold() {
	var cli *clientv3.Client
	tok, _ := fence.FileSource{Path: "/etc/fencer/annotations", Lease: "report"}.Token(context.Background())
	held, err := fence.Hold(context.Background(), cli, "/fencer", "default", tok)
	if err != nil {
		log.Fatal(err)
	}
	<-held.Done()
	log.Print(context.Cause(held)) // wraps fence.ErrLeaseLost
}

// Run a job only on the holder, and stop it when the lease moves.
func ExampleRunExclusive() {
	src := fence.FileSource{Path: "/etc/fencer/annotations", Lease: "nightly-report"}
	err := fence.RunExclusive(context.Background(), src, "nightly-report", time.Second, func(ctx context.Context, tok fence.Token) error {
		// ... do the work, writing with tok ...
		return nil
	})
	if errors.Is(err, fence.ErrLeaseLost) {
		log.Print("lost the lease mid-run; the next holder takes over")
	}
}
