package etcdstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencer-io/fencer/test/support/testenv"
)

// OneCluster tells two clusters behind one client's endpoints from one
// cluster listed twice, and from a member that does not answer; the
// leader's guard stops the manager over two.
func TestOneClusterFindsTwoClustersBehindTheEndpoints(t *testing.T) {
	a, b := testenv.Etcd(t), testenv.Etcd(t)
	ctx := context.Background()
	for _, c := range []struct {
		name      string
		endpoints []string
		split     bool
	}{
		{"one cluster twice", []string{a, a}, false},
		{"one member silent", []string{a, "http://127.0.0.1:1"}, false},
		{"two clusters", []string{a, b}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cli, err := Connect(Config{Endpoints: c.endpoints, Prefix: DefaultPrefix, DialTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			err = OneCluster(ctx, cli, time.Second)
			if got := errors.Is(err, ErrSplitCluster); got != c.split {
				t.Fatalf("OneCluster = %v; want a split: %v", err, c.split)
			}
			gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			g := &ClusterGuard{Cli: cli, Every: 100 * time.Millisecond, Timeout: time.Second}
			if err := g.Start(gctx); (err != nil) != c.split || (c.split && !errors.Is(err, ErrSplitCluster)) {
				t.Fatalf("the guard = %v; want it to stop the manager: %v", err, c.split)
			}
		})
	}
}
