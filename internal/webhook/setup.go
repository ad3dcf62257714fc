package webhook

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
)

// +kubebuilder:rbac:groups=fencer.io,resources=leases,verbs=get;list;watch

// Register serves the fencing webhook at Path and the Lease status guard at
// LeaseStatusPath on mgr's webhook server. Every replica serves them, leader
// or not: the live token comes from etcd.
func Register(ctx context.Context, mgr ctrl.Manager, store *etcdstore.Store) error {
	me, err := WhoAmI(ctx, mgr.GetConfig())
	if err != nil {
		return err
	}
	f := &Fence{
		Leases:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Live:      etcdstore.NewLiveReader(store, metrics.ObserveLookup),
	}
	mgr.GetWebhookServer().Register(Path, &admission.Webhook{Handler: f})
	mgr.GetWebhookServer().Register(LeaseStatusPath, &admission.Webhook{Handler: &LeaseStatusGuard{Controller: me}})
	return nil
}
