// Package metrics defines fencer's Prometheus metrics, registered on
// controller-runtime's registry so the manager's /metrics serves them.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// LeaseGrants counts grants of Leases.
	LeaseGrants = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencer_lease_grants_total",
		Help: "Grants of fencer Leases. Label transition: \"first\" for a Lease's first grant, \"new\" when the holder differs from the previous one, \"same\" when the previous holder is granted again.",
	}, []string{"transition"})

	// LeaseReleases counts tenures the controller ended itself.
	LeaseReleases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencer_lease_releases_total",
		Help: "Tenures ended by the controller's conditional delete. Label reason: HolderNotReady, HolderGone, Suspended, Deleted.",
	}, []string{"reason"})

	// LeaseExpiries counts tenures that ended by their etcd lease expiring.
	LeaseExpiries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencer_lease_expiries_total",
		Help: "Tenures that ended because etcd expired or revoked their lease, not by the controller's release (e.g. a Direct-mode holder stopped renewing).",
	})

	// FailoverSeconds measures from a lease key's deletion to the next grant.
	FailoverSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencer_lease_failover_seconds",
		Help:    "Time from a lease key's deletion (seen by the etcd watch) to the grant to the next holder.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})

	// EtcdOperationSeconds measures the latency of fencer's etcd operations.
	EtcdOperationSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencer_etcd_operation_duration_seconds",
		Help:    "Latency of fencer's etcd operations. Label op: get, grant, release, ttl. Label result: ok, error.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"op", "result"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(LeaseGrants, LeaseReleases, LeaseExpiries, FailoverSeconds, EtcdOperationSeconds)
}

// ObserveEtcd records one etcd operation; it fits etcdstore.NewStore.
func ObserveEtcd(op string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	EtcdOperationSeconds.WithLabelValues(op, result).Observe(d.Seconds())
}
