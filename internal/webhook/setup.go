package webhook

import (
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
)

// +kubebuilder:rbac:groups=fencer.io,resources=leases,verbs=get;list;watch

// Register serves the fencing webhook at Path on mgr's webhook server. Every
// replica serves it, leader or not: the live token comes from etcd.
func Register(mgr ctrl.Manager, store *etcdstore.Store) {
	f := &Fence{
		Leases:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Live:      etcdstore.NewLiveReader(store, metrics.ObserveLookup),
	}
	mgr.GetWebhookServer().Register(Path, &admission.Webhook{Handler: f})
}
