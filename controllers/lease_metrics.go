package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// Lease states, the values of fencer_leases's state label.
const (
	StateHeld            = "held"
	StateNoHolder        = "no_holder"
	StateSuspended       = "suspended"
	StateEtcdUnavailable = "etcd_unavailable"
)

var (
	leasesDesc = prometheus.NewDesc("fencer_leases",
		"Leases by state, counted from the manager's cache at scrape time (every replica reports the same; aggregate with max). Label state: held; no_holder (no Ready candidate, or about to be granted); suspended (spec.suspend); etcd_unavailable (the Held condition is Unknown: etcd cannot be reached or is full).",
		[]string{"state"}, nil)
	withoutHolderDesc = prometheus.NewDesc("fencer_lease_without_holder_max_seconds",
		"The longest any Lease that is not suspended has gone without a holder, since its Held condition last turned False or Unknown; 0 when every such Lease is held.",
		nil, nil)
)

// LeaseStates is a Prometheus collector of the Leases' states. It reads
// the manager's cache when scraped and emits five series, whatever the
// number of Leases: the state of each Lease is in its status, and the
// alerts need only how many are in each state and the longest wait.
type LeaseStates struct {
	Reader client.Reader
	Clock  clock.PassiveClock
}

// Describe implements prometheus.Collector.
func (c *LeaseStates) Describe(ch chan<- *prometheus.Desc) {
	ch <- leasesDesc
	ch <- withoutHolderDesc
}

// Collect implements prometheus.Collector.
func (c *LeaseStates) Collect(ch chan<- prometheus.Metric) {
	var list fencerv1.LeaseList
	// Read only: no deep copy of every Lease on every scrape.
	if err := c.Reader.List(context.Background(), &list, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(leasesDesc, err)
		return
	}
	counts := map[string]float64{StateHeld: 0, StateNoHolder: 0, StateSuspended: 0, StateEtcdUnavailable: 0}
	var longest time.Duration
	now := c.Clock.Now()
	for i := range list.Items {
		state, since := leaseState(&list.Items[i])
		counts[state]++
		if state != StateHeld && state != StateSuspended {
			longest = max(longest, now.Sub(since))
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(leasesDesc, prometheus.GaugeValue, n, state)
	}
	ch <- prometheus.MustNewConstMetric(withoutHolderDesc, prometheus.GaugeValue, longest.Seconds())
}

// leaseState is a Lease's state, and since when it has had no holder.
func leaseState(l *fencerv1.Lease) (string, time.Time) {
	held := meta.FindStatusCondition(l.Status.Conditions, fencerv1.ConditionHeld)
	since := l.CreationTimestamp.Time
	if held != nil {
		since = held.LastTransitionTime.Time
	}
	switch {
	case l.Spec.Suspend:
		return StateSuspended, since
	case held == nil:
		return StateNoHolder, since
	case held.Status == metav1.ConditionTrue:
		return StateHeld, since
	case held.Status == metav1.ConditionUnknown:
		return StateEtcdUnavailable, since
	}
	return StateNoHolder, since
}
