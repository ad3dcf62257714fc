package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/framework"
)

// TestGrantIsRecordedWhilePodPatchesFail: a grant whose holder annotation
// cannot be written (another admission policy refuses pod updates, an
// apiserver error) is still recorded in the status, history included, and
// the annotation follows once pods can be patched. Before, the status kept
// saying nothing was held for as long as the patches failed.
func TestGrantIsRecordedWhilePodPatchesFail(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	unblock := refusePodUpdates(t, ns)
	create(t, newLease(ns, "job", "w", 15))

	st := heldBy(t, ns, "job")
	if tok := etcdToken(t, ns, "job"); st.Holder != "w-0" || st.Token != tok {
		t.Fatalf("status holder %s token %d; etcd holds token %d for w-0", st.Holder, st.Token, tok)
	}
	if len(st.History) != 1 || st.History[0].Token != st.Token {
		t.Fatalf("history %+v, want w-0's tenure with token %d", st.History, st.Token)
	}
	if got := annotation(t, ns, "w-0", "job"); got != "" {
		t.Fatalf("w-0 carries %q though pod updates are refused", got)
	}
	unblock()
	eventually(t, 60*time.Second, "the holder annotation once pods can be patched", func() error {
		if got := annotation(t, ns, "w-0", "job"); got != itoa(st.Token) {
			return fmt.Errorf("w-0 annotation %q, want %d", got, st.Token)
		}
		return nil
	})
}

// TestGrantOfACrashedManagerIsRecorded: a manager that granted the Lease to
// a new holder and stopped before writing the status left the status on the
// old tenure. The next manager records the grant: the old tenure ends where
// the new one starts, and the highest token in the status is the new one.
func TestGrantOfACrashedManagerIsRecorded(t *testing.T) {
	ctx := context.Background()
	stop := startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	w1 := readyPod(t, ns, "w-1", "w")
	create(t, newLease(ns, "job", "w", 15))
	first := heldBy(t, ns, "job")
	stop()

	// What the crashed manager did in etcd: ended w-0's grant and granted
	// the Lease to w-1, the key and its marker in one transaction.
	if _, err := fx.EtcdCli.Revoke(ctx, clientv3.LeaseID(first.LeaseID)); err != nil {
		t.Fatal(err)
	}
	lease, err := fx.EtcdCli.Grant(ctx, 15)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now().UTC()
	value, _ := json.Marshal(etcdstore.GrantValue{Holder: w1.Name, HolderUID: string(w1.UID), LeaseID: int64(lease.ID), GrantTime: granted, TTL: 15})
	put, err := fx.EtcdCli.Txn(ctx).Then(
		clientv3.OpPut(etcdkeys.LeaseKey(prefix, ns, "job"), string(value), clientv3.WithLease(lease.ID)),
		clientv3.OpPut(etcdkeys.GrantMarkerKey(prefix, ns, "job"), "")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	token := put.Header.Revision

	startController(t, "c2")
	st := heldBy(t, ns, "job", first.Holder)
	if st.Holder != "w-1" || st.Token != token {
		t.Fatalf("status holder %s token %d, want w-1 with the crashed manager's token %d", st.Holder, st.Token, token)
	}
	h := st.History
	if len(h) != 2 || h[0].Token != token || h[0].Holder != "w-1" || h[0].End != nil {
		t.Fatalf("history %+v: want w-1's open tenure with token %d first", h, token)
	}
	if h[1].Token != first.Token || h[1].End == nil || h[1].End.After(h[0].Start.Time) {
		t.Fatalf("w-0's tenure %+v: want it ended by w-1's start %s", h[1], h[0].Start.Time)
	}
	if st.Transitions != 1 {
		t.Fatalf("transitions %d, want 1", st.Transitions)
	}
	if got := st.HighestToken(); got != token {
		t.Fatalf("highest token in the status %d, want %d", got, token)
	}
}

// refusePodUpdates refuses every pod update in ns.
func refusePodUpdates(t *testing.T, ns string) (unblock func()) {
	t.Helper()
	probe := readyPod(t, ns, "probe", "probe")
	return framework.RefusePodUpdates(t, k8s, client.ObjectKeyFromObject(probe), "false")
}

// TestNoPodLearnsATokenTheStatusDoesNotRecord: the holder's annotation is
// written only after the status records the grant. While the Lease's status
// cannot be written, the grant stays in etcd and no pod carries its token: a
// manager that stopped there would leave no token in use that the status
// (and its check for an etcd restored from an old snapshot) does not know.
func TestNoPodLearnsATokenTheStatusDoesNotRecord(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "probe", "nobody", 15))
	unblock := framework.RefuseUpdates(t, k8s, ns, admissionregistrationv1.Rule{APIGroups: []string{fencerv1.GroupVersion.Group}, APIVersions: []string{fencerv1.GroupVersion.Version}, Resources: []string{"leases/status"}}, "false",
		func(ctx context.Context) error {
			l := getLease(t, ns, "probe")
			l.Status.ObservedGeneration = l.Generation + 100
			return k8s.Status().Update(ctx, l)
		})
	create(t, newLease(ns, "job", "w", 15))
	eventually(t, 30*time.Second, "the grant in etcd", func() error {
		if etcdToken(t, ns, "job") == 0 {
			return fmt.Errorf("no grant yet")
		}
		return nil
	})
	// The controller retries the status write with backoff meanwhile; a
	// publish ahead of the status would have annotated w-0 at once.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got := annotation(t, ns, "w-0", "job"); got != "" {
			t.Fatalf("w-0 carries token %s while the Lease's status records no grant", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	unblock()
	st := heldBy(t, ns, "job")
	if tok := etcdToken(t, ns, "job"); st.Token != tok || len(st.History) != 1 || st.History[0].Token != tok {
		t.Fatalf("status token %d, history %+v; etcd holds %d", st.Token, st.History, tok)
	}
	eventually(t, 60*time.Second, "the holder annotation after the status", func() error {
		if got := annotation(t, ns, "w-0", "job"); got != itoa(st.Token) {
			return fmt.Errorf("w-0 annotation %q, want %d", got, st.Token)
		}
		return nil
	})
}

// TestExHolderLosesItsTokenWhileStatusWritesAreRefused: taking a token away
// reveals nothing the status does not know, so it does not wait for the
// status write. With every status write refused (an admission check of the
// cluster's own), a suspended Lease's holder still loses its annotation
// once etcd has released the grant, rather than reporting the token for as
// long as the refusal lasts.
func TestExHolderLosesItsTokenWhileStatusWritesAreRefused(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "probe", "nobody", 15))
	create(t, newLease(ns, "job", "w", 15))
	st := heldBy(t, ns, "job")
	eventually(t, 30*time.Second, "the holder annotation", func() error {
		if got := annotation(t, ns, "w-0", "job"); got != itoa(st.Token) {
			return fmt.Errorf("w-0 annotation %q, want %d", got, st.Token)
		}
		return nil
	})
	unblock := framework.RefuseUpdates(t, k8s, ns, admissionregistrationv1.Rule{APIGroups: []string{fencerv1.GroupVersion.Group}, APIVersions: []string{fencerv1.GroupVersion.Version}, Resources: []string{"leases/status"}}, "false",
		func(ctx context.Context) error {
			l := getLease(t, ns, "probe")
			l.Status.ObservedGeneration = l.Generation + 100
			return k8s.Status().Update(ctx, l)
		})
	defer unblock()
	patchSuspend(t, ns, "job", true)
	eventually(t, 30*time.Second, "the grant released in etcd", func() error {
		if tok := etcdToken(t, ns, "job"); tok != 0 {
			return fmt.Errorf("etcd still holds token %d", tok)
		}
		return nil
	})
	eventually(t, 10*time.Second, "the ex-holder's annotation removed", func() error {
		if got := annotation(t, ns, "w-0", "job"); got != "" {
			return fmt.Errorf("w-0 still carries token %s, released in etcd, while the status write is refused", got)
		}
		return nil
	})
	if got := getLease(t, ns, "job").Status; got.Holder != "w-0" {
		t.Fatalf("the status changed (holder %q) while its writes were refused: the test no longer tests the refusal", got.Holder)
	}
}
