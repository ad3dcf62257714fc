package lease

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// relabel sets the pod's app label.
func relabel(t *testing.T, ns, pod, app string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"app":%q}}}`, app)
	if err := k8s.Patch(context.Background(), &corev1.Pod{ObjectMeta: metaOf(ns, pod)}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// annotate sets annotation key=value on the pod, as kubectl annotate would.
func annotate(t *testing.T, ns, pod, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, value)
	if err := k8s.Patch(context.Background(), &corev1.Pod{ObjectMeta: metaOf(ns, pod)}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// noAnnotation waits until pod carries neither of lease's annotations.
func noAnnotation(t *testing.T, ns, pod, lease string) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("pod %s without lease %s's annotations", pod, lease), func() error {
		p := &corev1.Pod{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pod}, p); err != nil {
			return err
		}
		for _, k := range []string{fencerv1.HolderTokenAnnotationPrefix + lease, fencerv1.HolderLeaseIDAnnotationPrefix + lease} {
			if v, ok := p.Annotations[k]; ok {
				return fmt.Errorf("%s=%s", k, v)
			}
		}
		return nil
	})
}

// holdAsHolder starts the SDK's Hold for the current holder, as a Direct
// holder's process would, and returns its context.
func holdAsHolder(t *testing.T, ns, lease string, st fencerv1.LeaseStatus) context.Context {
	t.Helper()
	cli, err := fx.ConnectEtcd()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	held, err := fence.Hold(ctx, cli, prefix, ns, fence.Token{Lease: lease, Value: st.Token, LeaseID: st.LeaseID})
	if err != nil {
		t.Fatal(err)
	}
	return held
}

// A holder relabelled out of the selector loses its tenure at once and its
// annotation, under both renewal modes; under Direct its process still
// renews (Hold), and the revoked grant ends its Hold.
func TestHolderRelabelledOutOfTheSelector(t *testing.T) {
	for _, renewal := range []fencerv1.RenewalMode{fencerv1.RenewalPodReady, fencerv1.RenewalDirect} {
		t.Run(string(renewal), func(t *testing.T) {
			startController(t, "c1")
			ns := namespace(t)
			readyPod(t, ns, "w-0", "w")
			readyPod(t, ns, "w-1", "w")
			l := newLease(ns, "job", "w", 30) // far longer than the test waits
			l.Spec.Renewal = renewal
			create(t, l)
			first := heldBy(t, ns, "job")
			var held context.Context
			if renewal == fencerv1.RenewalDirect {
				held = holdAsHolder(t, ns, "job", first)
			}
			relabel(t, ns, first.Holder, "elsewhere")
			second := heldBy(t, ns, "job", first.Holder)
			if second.Token <= first.Token || second.History[1].EndReason != fencerv1.TenureHolderNotSelected {
				t.Fatalf("second tenure %+v, ended %+v: want a greater token and HolderNotSelected", second, second.History[1])
			}
			noAnnotation(t, ns, first.Holder, "job")
			if held != nil {
				select {
				case <-held.Done():
					if !errors.Is(context.Cause(held), fence.ErrLeaseLost) {
						t.Fatalf("Hold ended with %v, want ErrLeaseLost", context.Cause(held))
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the relabelled Direct holder's Hold still runs")
				}
			}
		})
	}
}

// A Direct holder whose pod object is deleted loses the grant at once,
// even though its process (Hold, here) still renews it.
func TestDirectHolderDeletedLosesTheGrant(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	p0 := readyPod(t, ns, "w-0", "w")
	readyPod(t, ns, "w-1", "w")
	l := newLease(ns, "job", "w", 30)
	l.Spec.Renewal = fencerv1.RenewalDirect
	create(t, l)
	first := heldBy(t, ns, "job")
	if first.Holder != p0.Name {
		t.Fatalf("held by %s, want the older pod %s", first.Holder, p0.Name)
	}
	held := holdAsHolder(t, ns, "job", first)
	if err := k8s.Delete(context.Background(), p0, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	second := heldBy(t, ns, "job", first.Holder)
	if second.Token <= first.Token || second.History[1].EndReason != fencerv1.TenureHolderGone {
		t.Fatalf("second tenure %+v, ended %+v: want a greater token and HolderGone", second, second.History[1])
	}
	select {
	case <-held.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the deleted Direct holder's Hold still runs")
	}
}

// A token annotation on a pod that does not hold the Lease (copied from
// the holder with kubectl, or of a Lease that does not exist) is removed.
func TestCopiedTokenAnnotationIsRemoved(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	readyPod(t, ns, "other", "unselected")
	create(t, newLease(ns, "job", "w", 30))
	st := heldBy(t, ns, "job")
	annotate(t, ns, "other", fencerv1.HolderTokenAnnotationPrefix+"job", itoa(st.Token))
	annotate(t, ns, "other", fencerv1.HolderLeaseIDAnnotationPrefix+"job", itoa(st.LeaseID))
	noAnnotation(t, ns, "other", "job")
	annotate(t, ns, "other", fencerv1.HolderTokenAnnotationPrefix+"ghost", "7")
	noAnnotation(t, ns, "other", "ghost")
	if annotation(t, ns, st.Holder, "job") != itoa(st.Token) {
		t.Fatalf("the holder lost its own annotation")
	}
}

// A Lease deleted after its fencer.io/release finalizer was removed (as the
// install docs say to do after an uninstall), while no manager ran, leaves
// its grant in etcd; the next leader's sweep releases it: the key is
// deleted, its etcd lease revoked, the holder's annotation removed.
func TestLeaseDeletedWithoutItsFinalizerIsReleased(t *testing.T) {
	stop := startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 30))
	st := heldBy(t, ns, "job")
	eventually(t, 30*time.Second, "the holder annotated", func() error {
		if annotation(t, ns, st.Holder, "job") != itoa(st.Token) {
			return errors.New("not yet")
		}
		return nil
	})
	stop()
	deleteWithoutFinalizer(t, ns, "job")
	if etcdToken(t, ns, "job") != st.Token {
		t.Fatal("the grant is gone before any manager saw the deletion")
	}
	startController(t, "c2")
	grantReleased(t, ns, "job")
	// The revoke follows the key's deletion, in its own call: waited for.
	eventually(t, 30*time.Second, "the grant's etcd lease revoked", func() error {
		ttl, err := fx.EtcdCli.TimeToLive(context.Background(), clientv3.LeaseID(st.LeaseID))
		if err != nil {
			return err
		}
		if ttl.TTL > 0 {
			return fmt.Errorf("the grant's etcd lease is still alive, %d s left", ttl.TTL)
		}
		return nil
	})
	// The marker goes in a transaction after the grant's, so it is waited
	// for, not read once the key is gone.
	eventually(t, 30*time.Second, "the grant marker deleted", func() error {
		resp, err := fx.EtcdCli.Get(context.Background(), etcdkeys.GrantMarkerKey(prefix, ns, "job"))
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 0 {
			return fmt.Errorf("the grant marker is left at revision %d", resp.Kvs[0].ModRevision)
		}
		return nil
	})
	noAnnotation(t, ns, st.Holder, "job")
}

// The same with a manager running: the deletion reaches it as NotFound,
// not through finalize, and the grant is released at once.
func TestLeaseDeletedWithoutItsFinalizerWhileRunning(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 30))
	st := heldBy(t, ns, "job")
	// If the controller puts the finalizer back between the two writes,
	// finalize releases instead.
	deleteWithoutFinalizer(t, ns, "job")
	grantReleased(t, ns, "job")
	noAnnotation(t, ns, st.Holder, "job")
}

// A held Lease deleted and created again at once under the same name (what
// kubectl replace --force does) never carries the old grant on: the old
// Lease stays until its grant is released (its finalizer), so the new one
// grants afresh, with a greater token. (Without the finalizer the new
// Lease found the old grant in etcd and kept it, token and all; grants now
// also record their Lease's UID: TestLeaseReplacedWhileNoManagerRan.)
func TestLeaseReplacedAtOnceGrantsAGreaterToken(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 30))
	st := heldBy(t, ns, "job")
	if err := k8s.Delete(context.Background(), getLease(t, ns, "job")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the Lease created again", func() error {
		return k8s.Create(context.Background(), newLease(ns, "job", "w", 30)) // AlreadyExists while it terminates
	})
	if again := heldBy(t, ns, "job"); again.Token <= st.Token {
		t.Fatalf("the Lease created again holds token %d, not above the old Lease's %d", again.Token, st.Token)
	}
}

// The same while no manager runs, its finalizer removed by hand (as after
// an uninstall): the next manager finds only the new Lease, and etcd still
// holding the old one's grant under its name (nothing sweeps it: a Lease
// of that name exists). The grant's Lease UID is all that tells them
// apart.
func TestLeaseReplacedWhileNoManagerRan(t *testing.T) {
	stop := startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 30))
	st := heldBy(t, ns, "job")
	stop()
	deleteWithoutFinalizer(t, ns, "job")
	eventually(t, 30*time.Second, "the Lease created again", func() error {
		return k8s.Create(context.Background(), newLease(ns, "job", "w", 30))
	})
	if etcdToken(t, ns, "job") != st.Token {
		t.Fatal("the old grant is gone before any manager saw the replacement: the test proves nothing")
	}
	startController(t, "c2")
	if again := heldBy(t, ns, "job"); again.Token <= st.Token {
		t.Fatalf("the Lease created again holds token %d, not above the old Lease's %d", again.Token, st.Token)
	}
}

// deleteWithoutFinalizer removes the Lease's finalizers and deletes it, as
// the install docs say to do after an uninstall.
func deleteWithoutFinalizer(t *testing.T, ns, name string) {
	t.Helper()
	l := getLease(t, ns, name)
	l.Finalizers = nil
	if err := k8s.Update(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(context.Background(), l); err != nil {
		t.Fatal(err)
	}
}

// grantReleased waits until etcd holds no grant of the Lease.
func grantReleased(t *testing.T, ns, name string) {
	t.Helper()
	eventually(t, 30*time.Second, "the grant released", func() error {
		if tok := etcdToken(t, ns, name); tok != 0 {
			return fmt.Errorf("etcd still holds token %d", tok)
		}
		return nil
	})
}

// A selector edited into one the API cannot parse (no schema rule checks
// label syntax) matches no pod: the holder loses its tenure and its
// annotation, and the Lease says why, instead of renewing forever with the
// error only in the manager's log.
func TestInvalidSelectorEndsTheTenure(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 30))
	st := heldBy(t, ns, "job")
	l := getLease(t, ns, "job")
	l.Spec.HolderSelector.MatchLabels = map[string]string{"app": "not a label value!"}
	if err := k8s.Update(context.Background(), l); err != nil {
		t.Fatalf("the API refused the selector itself (then this hole is closed upstream): %v", err)
	}
	eventually(t, 30*time.Second, "the tenure ended with reason InvalidSelector", func() error {
		got := getLease(t, ns, "job")
		if etcdToken(t, ns, "job") != 0 || heldReason(got) != fencerv1.ReasonInvalidSelector {
			return fmt.Errorf("etcd token %d, Held reason %q", etcdToken(t, ns, "job"), heldReason(got))
		}
		return nil
	})
	noAnnotation(t, ns, st.Holder, "job")
	if h := getLease(t, ns, "job").Status.History[0]; h.Token != st.Token || h.EndReason != fencerv1.TenureHolderNotSelected {
		t.Fatalf("the ended tenure: %+v, want token %d ended HolderNotSelected", h, st.Token)
	}
}
