package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrSplitCluster is the cause of OneCluster's error: the endpoints answer
// for more than one etcd cluster.
var ErrSplitCluster = errors.New("etcd endpoints belong to different clusters")

// OneCluster checks that every endpoint of cli that answers belongs to one
// etcd cluster. A bundled etcd's StatefulSet rendered again with more
// members (by a rendering that skips the chart's upgrade check: helm
// template, a GitOps tool) gives every member the member list of a new
// cluster: the members without data bootstrap a second, empty cluster
// beside the first. The client, given every member's
// address, would then spread its requests over both, and grants, claims
// and locks made in one would be unknown to the other. An endpoint that
// does not answer is Ping's to report, not a split.
//
// Each endpoint's Status dials it afresh (a handshake each), so this runs
// at start and every 10 s (ClusterGuard), not per request; each may take
// up to timeout, so a member that does not answer leaves the others their
// time; zero means DefaultRequestTimeout.
func OneCluster(ctx context.Context, cli *clientv3.Client, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	var first string
	var firstID uint64
	for _, ep := range cli.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil || st.Header == nil {
			continue
		}
		if first == "" {
			first, firstID = ep, st.Header.ClusterId
			continue
		}
		if id := st.Header.ClusterId; id != firstID {
			return fmt.Errorf("%w: %s answers for cluster %x and %s for cluster %x. The members of a bundled etcd rendered with another member count than it was installed with start a cluster of their own: render it with its installed count again, and move to another count by a snapshot restored into every member (docs/operations.md, \"Changing the number of etcd members\")", ErrSplitCluster, first, firstID, ep, id)
		}
	}
	return nil
}

// ClusterGuard stops the manager, through the error its Start returns,
// once the endpoints answer for two etcd clusters (OneCluster). It runs on
// the leader, or on every replica without leader election: a leader over
// two clusters grants in both. A replica that leads next finds the same at
// once, and a restarted one refuses to start (cmd/fencer), so nothing is
// granted until an operator has put the members right.
type ClusterGuard struct {
	Cli *clientv3.Client
	// Every is how often it looks; each look dials every endpoint afresh.
	Every time.Duration
	// Timeout bounds each endpoint's answer.
	Timeout time.Duration
}

// NeedLeaderElection: what it guards is the leader's granting.
func (g *ClusterGuard) NeedLeaderElection() bool { return true }

// Start looks at once, then every Every, until ctx ends or it finds a split.
func (g *ClusterGuard) Start(ctx context.Context) error {
	t := time.NewTicker(g.Every)
	defer t.Stop()
	for {
		if err := OneCluster(ctx, g.Cli, g.Timeout); err != nil && ctx.Err() == nil {
			return fmt.Errorf("stopping, so that nothing is granted in either cluster: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
