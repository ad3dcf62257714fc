package idrange

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/idgen"
	"github.com/fencer-io/fencer/test/support/framework"
)

// The CRD admits a podSelector whose label value the API does not allow
// (no schema rule checks label syntax). The IDRange says so, as a Lease
// does: Ready False, reason InvalidSelector, at its generation, with a
// Warning Event, on create and on an edit. The slot a pod already has
// stays (a typo must not take its worker ID away), the range hands out
// again once the selector is fixed, and an IDRange deleted while its
// selector is invalid still releases its pods' annotations and goes.
// (Before, the status stayed empty, or Ready True of the older generation,
// and the error reached only the manager's log; the delete hung.)
func TestAnInvalidPodSelectorIsReported(t *testing.T) {
	fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	ctx := context.Background()
	pods(t, ns, 0, 1)

	fresh := blocksRange(ns, 0, 1000, 10)
	fresh.Spec.PodSelector.MatchLabels["app"] = "bad value!"
	if err := fx.Client.Create(ctx, fresh); err != nil {
		t.Fatalf("the API refused %s: %v", fresh.Name, err)
	}
	invalidSelector(t, fresh)

	rng := slotsRange(ns, 0, 10, 5)
	if err := fx.Client.Create(ctx, rng); err != nil {
		t.Fatal(err)
	}
	had := waitAnnotated(t, ns, rng.Name)
	edit(t, rng, "bad value!")
	invalidSelector(t, rng)
	time.Sleep(6 * time.Second) // past the slot TTL
	if got := annotations(t, ns, rng.Name)["w-000"]; got != had {
		t.Fatalf("w-000's slot %q became %q while the selector was invalid", had, got)
	}
	// Nothing writes annotations while the selector is invalid, so the
	// annotation alone would not show a slot lost: etcd must still hold
	// it, under the same token, renewed past its TTL.
	n, token, err := idgen.ParseSlot(had)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := fx.EtcdCli.Get(ctx, etcdkeys.SlotKey(etcdkeys.DefaultPrefix, ns, rng.Name, n))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != token {
		t.Fatalf("w-000's slot %q is no longer held in etcd after its TTL while the selector was invalid (%d keys)", had, len(resp.Kvs))
	}

	edit(t, rng, "w")
	framework.Eventually(t, 20*time.Second, "the IDRange Ready again", func() error {
		got := get(t, rng)
		if c := meta.FindStatusCondition(got.Status.Conditions, fencerv1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != got.Generation {
			return fmt.Errorf("Ready %+v at generation %d", c, got.Generation)
		}
		return nil
	})

	edit(t, rng, "bad value!")
	invalidSelector(t, rng)
	if err := fx.Client.Delete(ctx, rng); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "the IDRange gone, its annotation removed", func() error {
		if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(rng), &fencerv1.IDRange{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%w)", err)
		}
		if got, ok := annotations(t, ns, rng.Name)["w-000"]; ok {
			return fmt.Errorf("w-000 still carries %q", got)
		}
		return nil
	})
}

// invalidSelector waits for rng to report its selector.
func invalidSelector(t *testing.T, rng *fencerv1.IDRange) {
	t.Helper()
	framework.Eventually(t, 20*time.Second, "IDRange "+rng.Name+" reports its invalid podSelector", func() error {
		got := get(t, rng)
		c := meta.FindStatusCondition(got.Status.Conditions, fencerv1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != fencerv1.ReasonInvalidSelector || c.ObservedGeneration != got.Generation {
			return fmt.Errorf("Ready %+v at generation %d", c, got.Generation)
		}
		return nil
	})
	framework.Eventually(t, 20*time.Second, "an "+fencerv1.ReasonInvalidSelector+" Event for "+rng.Name, func() error {
		var list eventsv1.EventList
		if err := fx.Client.List(context.Background(), &list, client.InNamespace(rng.Namespace)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == "IDRange" && e.Regarding.Name == rng.Name && e.Type == "Warning" && e.Reason == fencerv1.ReasonInvalidSelector {
				return nil
			}
		}
		return fmt.Errorf("none among %d Events", len(list.Items))
	})
}

func waitAnnotated(t *testing.T, ns, name string) string {
	t.Helper()
	var v string
	framework.Eventually(t, 20*time.Second, "w-000 annotated", func() error {
		v = annotations(t, ns, name)["w-000"]
		if v == "" {
			return fmt.Errorf("no annotation yet")
		}
		return nil
	})
	return v
}

func edit(t *testing.T, rng *fencerv1.IDRange, app string) {
	t.Helper()
	set := func(o client.Object) { o.(*fencerv1.IDRange).Spec.PodSelector.MatchLabels["app"] = app }
	if err := framework.Update(context.Background(), t, fx.Client, client.ObjectKeyFromObject(rng), &fencerv1.IDRange{}, set); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, rng *fencerv1.IDRange) *fencerv1.IDRange {
	t.Helper()
	got := &fencerv1.IDRange{}
	if err := fx.Client.Get(context.Background(), client.ObjectKeyFromObject(rng), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// While the selector is invalid a pod keeps its slot across a failover
// too: the new leader's renewer starts empty, and its pass, which hands
// out nothing, still renews the slots pods hold (it returned before the
// renewals, and every slot of the range expired one TTL later).
func TestASlotOutlivesAFailoverWhileTheSelectorIsInvalid(t *testing.T) {
	stop := fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	ctx := context.Background()
	pods(t, ns, 0, 1)
	rng := slotsRange(ns, 0, 10, 3)
	if err := fx.Client.Create(ctx, rng); err != nil {
		t.Fatal(err)
	}
	had := waitAnnotated(t, ns, rng.Name)
	slotKeys := func() int {
		resp, err := fx.EtcdCli.Get(ctx, etcdkeys.IDRangeSlotsPrefix(etcdkeys.DefaultPrefix, ns, rng.Name), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs)
	}
	if n := slotKeys(); n != 1 {
		t.Fatalf("%d slot keys before the edit, want 1", n)
	}
	edit(t, rng, "bad value!")
	invalidSelector(t, rng)
	stop()
	fx.StartController(t, "c2")
	time.Sleep(10 * time.Second) // the new leader's term, then past the 3 s slot TTL
	if n := slotKeys(); n != 1 {
		t.Fatalf("w-000's slot (%s) expired after a failover while the selector was invalid: %d slot keys left", had, n)
	}
}
