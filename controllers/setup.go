package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/eventkey"
)

// DefaultLeaseWorkers is how many Leases are reconciled at once unless
// told otherwise. A Lease reconcile is a few network round trips (an etcd
// transaction, a status write, a pod patch) and little CPU, so workers are
// cheap, and what they bound is how many failovers proceed at once: when
// 30 holders lose their pods in the same instant, 16 workers grant them in
// two rounds, where 4 took eight (docs/performance.md, failover).
const DefaultLeaseWorkers = 16

// Options tune fencer's controllers.
type Options struct {
	// LeaseWorkers is how many Leases are reconciled at once; 0 means
	// DefaultLeaseWorkers.
	LeaseWorkers int
	// LeaseDeleteWebhook says the Lease deletion webhook releases each
	// Lease's grant at its DELETE; then only Leases in
	// LeaseFinalizerNamespaces (those it skips) get the finalizer
	// fencer.io/release. Without it (the zero value) every Lease does.
	LeaseDeleteWebhook       bool
	LeaseFinalizerNamespaces []string
	// LeaseDeletionGrace is how long a Lease whose DELETE fencer's webhook
	// admitted stays ungranted before the controller checks that the delete
	// happened; 0 means DefaultDeletionGrace.
	LeaseDeletionGrace time.Duration
	// Clock is the reconcilers' clock; nil means the real one.
	Clock clock.Clock
	// Identity, when set, gives namespaces their etcd identities; its
	// Client, Reader and Clock are filled in here.
	Identity *IdentityReconciler
}

// Setup adds every reconciler to mgr. The store and the elector are built
// by the caller, which hands the same store to the webhook; the elector
// must already be added to mgr.
func Setup(mgr ctrl.Manager, store *etcdstore.Store, elector *etcdstore.Elector, o Options) error {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if err := SetupIndexes(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	// One budget for both controllers' Normal Events (events.go); only
	// exact repeats share a series (eventkey).
	rec := withEventBudget(eventkey.Distinct(mgr.GetEventRecorder("fencer"), mgr.GetScheme()))
	leases := NewLeaseReconciler(mgr.GetClient(), store, elector, rec, o.Clock)
	leases.Workers = o.LeaseWorkers
	if leases.Workers == 0 {
		leases.Workers = DefaultLeaseWorkers
	}
	leases.APIReader = mgr.GetAPIReader()
	leases.DeletionGrace = o.LeaseDeletionGrace
	leases.Finalize = FinalizeIn(o.LeaseFinalizerNamespaces, !o.LeaseDeleteWebhook)
	if err := leases.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Lease controller: %w", err)
	}
	ranges := NewIDRangeReconciler(mgr.GetClient(), store, elector, rec, o.Clock)
	ranges.APIReader = mgr.GetAPIReader()
	if err := ranges.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the IDRange controller: %w", err)
	}
	members := &WorkloadLeaseReconciler{Client: mgr.GetClient(), Recorder: rec, APIReader: mgr.GetAPIReader(), Clock: o.Clock}
	if err := members.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the WorkloadLease controller: %w", err)
	}
	if id := o.Identity; id != nil {
		id.Client, id.Reader, id.Clock = mgr.GetClient(), mgr.GetAPIReader(), o.Clock
		if err := id.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up the identity controller: %w", err)
		}
	}
	return nil
}
