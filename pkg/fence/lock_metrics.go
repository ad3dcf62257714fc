package fence

import "github.com/prometheus/client_golang/prometheus"

// lockMetrics are the keyed locks' metrics of this process, over all its
// Lockers. LockCollectors hands them to the caller's registry.
var lockMetrics = struct {
	wait, hold prometheus.Histogram
	lost       prometheus.Counter
}{
	wait: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencer_lock_wait_seconds",
		Help:    "Time a keyed lock's Lock or TryLock took to return held: queueing, waiting for older waiters, and etcd round trips.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}),
	hold: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencer_lock_hold_seconds",
		Help:    "Time from a keyed lock's acquisition to its Unlock.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}),
	lost: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencer_lock_lost_total",
		Help: "Keyed locks lost before their Unlock: the session's keepalive failed or its TTL ran out, its etcd lease was revoked, or a waiter key was deleted.",
	}),
}

// LockCollectors are the keyed locks' metrics, for the process's registry:
//
//	prometheus.MustRegister(fence.LockCollectors()...)
func LockCollectors() []prometheus.Collector {
	return []prometheus.Collector{lockMetrics.wait, lockMetrics.hold, lockMetrics.lost}
}
