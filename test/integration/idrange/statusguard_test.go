package idrange

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/framework"
)

// An IDRange's status.next is the floor no block is claimed below again.
// Anyone RBAC lets update idranges/status (here: a member of
// system:masters, whom RBAC lets do anything) could lower it, which disarms
// the check for an etcd restored from an old snapshot, or raise it, which
// freezes the range. The chart's status guard admits the manager alone.
func TestOnlyTheManagerWritesIDRangeStatus(t *testing.T) {
	ctx := context.Background()
	ns := fx.Namespace(t)
	fx.StartController(t, "c1")
	pods(t, ns, 0, 2)
	rng := blocksRange(ns, 1, 1_000_000, 100)
	if err := fx.Client.Create(ctx, rng); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "blocks for both pods", func() error {
		if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(rng), rng); err != nil {
			return err
		}
		if rng.Status.Next < 201 {
			return errStatus(rng)
		}
		return nil
	})

	cfg := rest.CopyConfig(fx.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "mallory", Groups: []string{"system:masters", "system:authenticated"}}
	mallory, err := client.New(cfg, client.Options{Scheme: fx.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, next := range []int64{1, rng.Status.Next + 500_000} {
		err := framework.UpdateStatus(ctx, t, mallory, client.ObjectKeyFromObject(rng), &fencerv1.IDRange{}, func(o client.Object) {
			o.(*fencerv1.IDRange).Status.Next = next
		})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only the fencer manager") || !strings.Contains(err.Error(), "mallory") {
			t.Fatalf("status.next set to %d by mallory: want a Forbidden naming the manager and mallory, got %v", next, err)
		}
		patch := client.MergeFrom(rng.DeepCopy())
		forged := rng.DeepCopy()
		forged.Status.Next = next
		if err := mallory.Status().Patch(ctx, forged, patch); !apierrors.IsForbidden(err) {
			t.Fatalf("status.next patched to %d by mallory: want Forbidden, got %v", next, err)
		}
	}
	// The manager still writes it: one more pod gets a block.
	before := rng.Status.Next
	pods(t, ns, 2, 3)
	framework.Eventually(t, 30*time.Second, "a block for the third pod", func() error {
		got := &fencerv1.IDRange{}
		if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(rng), got); err != nil {
			return err
		}
		if got.Status.Next <= before {
			return errStatus(got)
		}
		return nil
	})
}

func errStatus(rng *fencerv1.IDRange) error {
	return fmt.Errorf("status.next is %d", rng.Status.Next)
}
