package etcdstore

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/metrics"
)

// Watchdog makes a leader that has lost etcd give up leadership. Without
// it, a leader that still reaches the apiserver keeps its Kubernetes
// leadership while it can grant and renew nothing: every PodReady tenure
// ends and no standby takes over.
//
// It runs on the leader only. It reads etcd every Interval; once no read
// has succeeded for Timeout, Start returns an error, which stops the
// manager: the leader-election lease is released on the way out and a
// standby that reaches etcd takes over. The process exits and restarts.
type Watchdog struct {
	Cli      *clientv3.Client
	Prefix   string
	Interval time.Duration
	// ProbeTimeout bounds each read.
	ProbeTimeout time.Duration
	// Timeout is how long etcd may stay unreachable before the leader steps down.
	Timeout time.Duration
	// Paused, if set, reports when failures must not count: while the
	// Maintainer defragments a member, which blocks it.
	Paused func() bool
	Log    logr.Logger

	failingSince atomic.Int64 // unix nanos of the first failed read in a row; 0 when healthy
}

// NeedLeaderElection: only a leader has leadership to give up.
func (w *Watchdog) NeedLeaderElection() bool { return true }

// Start probes etcd until ctx ends or etcd has been unreachable for Timeout.
func (w *Watchdog) Start(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		if err := w.probe(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (w *Watchdog) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, w.ProbeTimeout)
	err := Ping(pctx, w.Cli, w.Prefix)
	cancel()
	if ctx.Err() != nil {
		return nil
	}
	now := time.Now()
	if err == nil {
		metrics.EtcdHealthy.Set(1)
		w.failingSince.Store(0)
		return nil
	}
	metrics.EtcdHealthy.Set(0)
	if w.Paused != nil && w.Paused() {
		w.failingSince.Store(0)
		return nil
	}
	w.failingSince.CompareAndSwap(0, now.UnixNano())
	down := now.Sub(time.Unix(0, w.failingSince.Load()))
	if down < w.Timeout {
		w.Log.Info("etcd unreachable", "for", down.Round(time.Millisecond), "stepDownAfter", w.Timeout, "err", err.Error())
		return nil
	}
	return fmt.Errorf("etcd unreachable for %s (last: %w): giving up leadership so a replica that reaches etcd takes over", down.Round(time.Millisecond), err)
}

// Checker is the leader's liveness check: it fails once etcd has been
// unreachable for Timeout, for the moment between the watchdog's error and
// the process exit, and for a kubelet to act on if the exit hangs.
func (w *Watchdog) Checker(*http.Request) error {
	since := w.failingSince.Load()
	if since == 0 {
		return nil
	}
	if down := time.Since(time.Unix(0, since)); down >= w.Timeout {
		return fmt.Errorf("etcd unreachable for %s", down.Round(time.Millisecond))
	}
	return nil
}
