package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/lockview"
)

var (
	locksHeldDesc = prometheus.NewDesc("fencer_locks_held",
		"Keyed locks held, by namespace, read from etcd at scrape time (every replica reports the same; aggregate with max). Label namespace: the locks' namespace; a namespace with none has no series.",
		[]string{"namespace"}, nil)
	locksWaitingDesc = prometheus.NewDesc("fencer_locks_waiting",
		"Acquisitions of keyed locks queued behind a holder, by namespace, read from etcd at scrape time. Label namespace: the locks' namespace.",
		[]string{"namespace"}, nil)
)

// LockStates is a Prometheus collector of the keyed locks held and
// waiting per namespace: one etcd range read per scrape.
type LockStates struct {
	Etcd   *clientv3.Client
	Prefix string
}

// Describe implements prometheus.Collector.
func (c *LockStates) Describe(ch chan<- *prometheus.Desc) {
	ch <- locksHeldDesc
	ch <- locksWaitingDesc
}

// Collect implements prometheus.Collector.
func (c *LockStates) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	locks, err := lockview.List(ctx, c.Etcd, c.Prefix, "", "")
	if err != nil {
		ch <- prometheus.NewInvalidMetric(locksHeldDesc, err)
		return
	}
	for ns, n := range lockview.CountByNamespace(locks) {
		ch <- prometheus.MustNewConstMetric(locksHeldDesc, prometheus.GaugeValue, float64(n.Held), ns)
		ch <- prometheus.MustNewConstMetric(locksWaitingDesc, prometheus.GaugeValue, float64(n.Waiting), ns)
	}
}
