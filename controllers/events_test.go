package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/metrics"
)

// countingRecorder counts the Events posted, by type.
type countingRecorder map[string]int

func (c countingRecorder) Eventf(_, _ runtime.Object, eventtype, _, _, _ string, _ ...any) {
	c[eventtype]++
}

func TestEventBudget(t *testing.T) {
	posted := countingRecorder{}
	rec := withEventBudget(posted)
	dropped := testutil.ToFloat64(metrics.EventsDropped.WithLabelValues(fencerv1.ReasonGranted))
	// A storm, much faster than the refill: the burst passes, the rest is
	// counted and dropped.
	const storm = NormalEventBurst + 50
	for range storm {
		rec.Eventf(&fencerv1.Lease{}, nil, corev1.EventTypeNormal, fencerv1.ReasonGranted, fencerv1.ReasonGranted, "granted")
	}
	// Warnings pass whatever the budget.
	for range 20 {
		rec.Eventf(&fencerv1.Lease{}, nil, corev1.EventTypeWarning, fencerv1.ReasonEtcdUnavailable, fencerv1.ReasonEtcdUnavailable, "down")
	}
	// The refill (NormalEventRate per second) may add one or two during the loop.
	if n := posted[corev1.EventTypeNormal]; n < NormalEventBurst || n > NormalEventBurst+2 {
		t.Errorf("posted %d Normal Events of a storm of %d, want the burst of %d", n, storm, NormalEventBurst)
	}
	if n := posted[corev1.EventTypeWarning]; n != 20 {
		t.Errorf("posted %d of 20 Warning Events", n)
	}
	got := testutil.ToFloat64(metrics.EventsDropped.WithLabelValues(fencerv1.ReasonGranted)) - dropped
	if want := float64(storm - posted[corev1.EventTypeNormal]); got != want {
		t.Errorf("fencer_events_dropped_total{reason=Granted} rose by %v, want %v", got, want)
	}
}
