package controllers

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
)

// Options wire fencer's controllers to etcd.
type Options struct {
	Etcd *clientv3.Client
	// Prefix is the root of fencer's etcd keys.
	Prefix string
	// Identity names this replica in the etcd election.
	Identity string
	// ElectionTTL is the etcd election's session TTL.
	ElectionTTL time.Duration
	// RequestTimeout bounds each etcd request; zero means the store's default.
	RequestTimeout time.Duration
	// LeaseWorkers is how many Leases are reconciled at once; 0 means 1.
	LeaseWorkers int
	// Clock is the reconcilers' clock; nil means the real one.
	Clock clock.Clock
}

// Setup adds the etcd election and every reconciler to mgr, and returns the
// store they share.
func Setup(mgr ctrl.Manager, o Options) (*etcdstore.Store, error) {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if err := addPodIndex(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	elector := etcdstore.NewElector(o.Etcd, o.Prefix, o.Identity, o.ElectionTTL)
	if err := mgr.Add(elector); err != nil {
		return nil, err
	}
	store := etcdstore.NewStore(o.Etcd, o.Prefix, elector, metrics.ObserveEtcd)
	store.Timeout = o.RequestTimeout
	leases := NewLeaseReconciler(mgr.GetClient(), store, elector, mgr.GetEventRecorder("fencer"), o.Clock)
	leases.Workers = o.LeaseWorkers
	if err := leases.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the Lease controller: %w", err)
	}
	ranges := NewIDRangeReconciler(mgr.GetClient(), store, elector, mgr.GetEventRecorder("fencer"), o.Clock)
	if err := ranges.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the IDRange controller: %w", err)
	}
	return store, nil
}
