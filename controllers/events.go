package controllers

import (
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	"github.com/fencer-io/fencer/internal/metrics"
)

// The controllers' budget for Normal Events, over all objects: a burst of
// NormalEventBurst, refilled at NormalEventRate per second. At ordinary
// rates every grant, release and block gets its Event. In a storm (10,000
// Leases created or failing over at once) one Event per object would be an
// apiserver write per grant on top of the two the grant needs, and the
// same facts are already in each object's status (the Lease's history and
// conditions) and in the metrics. Beyond the budget, Normal Events are
// counted in fencer_events_dropped_total and not posted. Warning Events
// are never dropped here. The burst covers the grants of a 100-member
// workload, or 50 Leases failing over at once (a release and a grant
// each); the refill, one a second, keeps a storm's Events to about two in
// a hundred grants (0.02 writes per grant over 10,000 Leases granted in
// 110-120 s).
const (
	NormalEventBurst = 100
	NormalEventRate  = 1
)

// budgetRecorder posts Warning Events always and Normal Events within the
// budget.
type budgetRecorder struct {
	events.EventRecorder
	normal *rate.Limiter
}

// withEventBudget wraps rec with the controllers' Normal Event budget.
func withEventBudget(rec events.EventRecorder) events.EventRecorder {
	return &budgetRecorder{EventRecorder: rec, normal: rate.NewLimiter(NormalEventRate, NormalEventBurst)}
}

// Eventf implements events.EventRecorder.
func (b *budgetRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if eventtype == corev1.EventTypeNormal && !b.normal.Allow() {
		metrics.EventsDropped.WithLabelValues(reason).Inc()
		return
	}
	b.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}
