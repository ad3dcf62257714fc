package controllers

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// An IDRange stored before the CRD refused a negative min still reaches the
// controller. It must allocate nothing: a negative slot's key is one the
// store cannot list back, so each pass would lease another slot, and a
// negative block is one no pod can parse. The reconciler here has no client
// or etcd, so any allocation attempt fails the test.
func TestNegativeMinAllocatesNothing(t *testing.T) {
	for _, mode := range []fencerv1.IDRangeMode{fencerv1.ModeSlots, fencerv1.ModeBlocks} {
		rng := &fencerv1.IDRange{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ids", Generation: 2},
			Spec:       fencerv1.IDRangeSpec{Mode: mode, Min: -1000, Max: 1023},
		}
		out, err := (&IDRangeReconciler{}).reconcileRange(context.Background(), rng)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		c := meta.FindStatusCondition(rng.Status.Conditions, fencerv1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != fencerv1.ReasonInvalidRange {
			t.Errorf("%s: Ready condition %+v, want False with reason %s", mode, c, fencerv1.ReasonInvalidRange)
		}
		if len(out.events) != 1 || out.events[0].reason != fencerv1.ReasonInvalidRange {
			t.Errorf("%s: events %+v, want one %s Warning", mode, out.events, fencerv1.ReasonInvalidRange)
		}
	}
}
