package webhook

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/framework"
)

// TestFencersOwnKindsAreNeverFenced: a fencer.io/lease label on one of
// fencer's own objects (a kustomize commonLabels puts it on every object
// of a kustomization, the Lease among them) changes nothing. The fencing
// webhooks once judged such an object like any fenced one: the create of
// this Lease was refused (the Lease it names did not exist yet), and a
// Lease labelled later could neither be written by the controller, which
// sends no token, nor deleted by kubectl.
func TestFencersOwnKindsAreNeverFenced(t *testing.T) {
	ctx := context.Background()
	// The Lease fences by its own name, and the IDRange by that Lease.
	ns, _, _ := setup(t, func(l *fencerv1.Lease) {
		l.Labels = map[string]string{fencerv1.LeaseLabel: l.Name}
	})

	var l fencerv1.Lease
	if err := framework.Update(ctx, t, fx.Client, client.ObjectKey{Namespace: ns, Name: "report"}, &l, func(o client.Object) {
		o.(*fencerv1.Lease).Spec.TTLSeconds = 3
	}); err != nil {
		t.Fatalf("a tokenless update of a labelled Lease's spec: %v", err)
	}

	ids := &fencerv1.IDRange{
		ObjectMeta: metav1.ObjectMeta{Name: "ids", Namespace: ns, Labels: map[string]string{fencerv1.LeaseLabel: "report"}},
		Spec: fencerv1.IDRangeSpec{
			Mode: fencerv1.ModeBlocks, Min: 1, Max: 1000, BlockSize: ptr.To[int64](10),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}},
		},
	}
	if err := fx.Client.Create(ctx, ids); err != nil {
		t.Fatalf("a tokenless create of a labelled IDRange: %v", err)
	}
	if err := framework.Update(ctx, t, fx.Client, client.ObjectKeyFromObject(ids), ids, func(o client.Object) {
		o.(*fencerv1.IDRange).Spec.Max = 2000
	}); err != nil {
		t.Fatalf("a tokenless update of a labelled IDRange: %v", err)
	}
	if err := fx.Client.Delete(ctx, ids); err != nil {
		t.Fatalf("a tokenless delete of a labelled IDRange: %v", err)
	}

	// The delete passes, and the controller's finalizer removal after it.
	if err := fx.Client.Delete(ctx, &l); err != nil {
		t.Fatalf("a tokenless delete of a labelled Lease: %v", err)
	}
	framework.Eventually(t, 30*time.Second, "labelled Lease gone", func() error {
		err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &l)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there, finalizers %v", l.Finalizers)
	})
}
