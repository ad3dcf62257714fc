package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// TestLeaseStates: five series, whatever the number of Leases, and the
// longest wait counts only Leases that should have a holder.
func TestLeaseStates(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	lease := func(name string, suspend bool, held metav1.ConditionStatus, since time.Duration) *fencerv1.Lease {
		l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}}
		l.Spec.Suspend = suspend
		if held != "" {
			l.Status.Conditions = []metav1.Condition{{Type: fencerv1.ConditionHeld, Status: held, LastTransitionTime: metav1.NewTime(now.Add(-since))}}
		}
		return l
	}
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		lease("held-a", false, metav1.ConditionTrue, 500*time.Second),
		lease("held-b", false, metav1.ConditionTrue, 10*time.Second),
		lease("waiting", false, metav1.ConditionFalse, 100*time.Second),
		lease("etcd-down", false, metav1.ConditionUnknown, 30*time.Second),
		lease("suspended", true, metav1.ConditionFalse, 900*time.Second),
	).Build()
	want := `
# HELP fencer_lease_without_holder_max_seconds The longest any Lease that is not suspended has gone without a holder, since its Held condition last turned False or Unknown; 0 when every such Lease is held.
# TYPE fencer_lease_without_holder_max_seconds gauge
fencer_lease_without_holder_max_seconds 100
# HELP fencer_leases Leases by state, counted from the manager's cache at scrape time (every replica reports the same; aggregate with max). Label state: held; no_holder (no Ready candidate, or about to be granted); suspended (spec.suspend); etcd_unavailable (the Held condition is Unknown: etcd cannot be reached or is full).
# TYPE fencer_leases gauge
fencer_leases{state="etcd_unavailable"} 1
fencer_leases{state="held"} 2
fencer_leases{state="no_holder"} 1
fencer_leases{state="suspended"} 1
`
	collector := &LeaseStates{Reader: c, Clock: clocktesting.NewFakePassiveClock(now)}
	if err := testutil.CollectAndCompare(collector, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
