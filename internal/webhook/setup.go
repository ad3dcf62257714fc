package webhook

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/eventkey"
	"github.com/fencer-io/fencer/internal/metrics"
)

// +kubebuilder:rbac:groups=fencer.io,resources=leases,verbs=get;list;watch

// Options are how an install serves its webhooks.
type Options struct {
	// Exempt are the identities whose writes to fenced objects pass
	// without a token.
	Exempt Exempt
	// ReleaseAtDelete serves the Lease deletion webhook
	// (--lease-delete-webhook). It is the one path that changes etcd, and
	// the webhook server does not know who calls it, so an install serves
	// it only where it has made sure that only the apiserver can reach the
	// webhook port (docs/install.md).
	ReleaseAtDelete bool
	// Finalize tells the namespaces whose Leases the Lease finalizer
	// webhook gives fencer's finalizer: the controller's
	// (controllers.FinalizeIn). Nil is every namespace.
	Finalize func(namespace string) bool
}

// Register serves the fencing webhooks (RecordPath, Path, ParentPath), the
// Lease finalizer webhook (LeaseFinalizerPath), the Lease deletion webhook
// (LeaseDeletePath, with o.ReleaseAtDelete) and the Lease status guard
// (LeaseStatusPath) on mgr's webhook server. Every replica serves them,
// leader or not: the live token comes from etcd.
func Register(ctx context.Context, mgr ctrl.Manager, store *etcdstore.Store, o Options) error {
	me, err := WhoAmI(ctx, mgr.GetConfig())
	if err != nil {
		return err
	}
	leases, err := WatchLeases(ctx, mgr.GetCache())
	if err != nil {
		return err
	}
	f := &Checker{
		Leases:    leases,
		APIReader: mgr.GetAPIReader(),
		Live:      etcdstore.NewLiveReader(store, metrics.ObserveLookup),
		Exempt:    o.Exempt,
		Refusals:  &Refusals{Recorder: eventkey.Distinct(mgr.GetEventRecorder("fencer-webhook"), mgr.GetScheme()), Leases: leases},
	}
	srv := mgr.GetWebhookServer()
	srv.Register(RecordPath, &Review{Handler: admission.HandlerFunc(f.Record)})
	srv.Register(Path, &Review{Handler: admission.HandlerFunc(f.Validate)})
	srv.Register(ParentPath, &Review{Handler: &Parent{Checker: f, Reader: mgr.GetAPIReader(), Mapper: mgr.GetRESTMapper()}})
	srv.Register(LeaseFinalizerPath, &Review{Handler: &LeaseFinalizer{Finalize: o.Finalize}})
	if o.ReleaseAtDelete {
		srv.Register(LeaseDeletePath, &Review{Handler: &LeaseDeletion{Store: store}})
	}
	// The Lease status guard is now the chart's ValidatingAdmissionPolicy.
	// Its webhook path is still served for the webhook configurations of
	// earlier versions (an install upgraded with kubectl apply, which
	// does not prune the old webhook), whose status writes would
	// otherwise fail closed against a path that is gone.
	srv.Register(LeaseStatusPath, &Review{Handler: &LeaseStatusGuard{Controller: me}})
	return nil
}
