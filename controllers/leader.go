package controllers

import (
	"context"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/renew"
)

// followTerms runs on the leader: when this replica wins the etcd election
// it calls resync, so every object is reconciled and live leases adopted;
// when it loses the election, or stops, it stops renewing.
func followTerms(elector *etcdstore.Elector, renewer *renew.Renewer, resync func(context.Context)) leaderRunnable {
	return func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				renewer.StopAll()
				return nil
			case <-elector.Changed():
				if _, err := elector.Term(); err != nil {
					renewer.StopAll()
					continue
				}
				resync(ctx)
			}
		}
	}
}

// leaderRunnable adapts a function to a Runnable that runs only on the leader.
type leaderRunnable func(context.Context) error

func (f leaderRunnable) Start(ctx context.Context) error { return f(ctx) }
func (f leaderRunnable) NeedLeaderElection() bool        { return true }
