package manager

import (
	"net/http"
	"testing"
	"time"

	"github.com/fencer-io/fencer/test/support/faultproxy"
)

// TestLeaderCutFromEtcdStepsDown cuts only the leader's link to etcd; it
// still reaches the apiserver, so only its watchdog can make it give up
// leadership. The standby, which reaches etcd, must take over and keep the
// grant's token: the key is never deleted or re-granted for a whole TTL
// after the cut, so the standby renewed it. The takeover time is logged
// (docs/operations.md).
func TestLeaderCutFromEtcdStepsDown(t *testing.T) {
	const ttl = 20
	f := newFailover(t, "cut", ttl)
	endpoint, cl, elected := f.endpoint, f.cl, f.elected

	proxy := func() *faultproxy.Proxy {
		p, err := faultproxy.Start(endpoint[len("http://"):])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	pa, pb := proxy(), proxy()
	a := startFencer(t, "a", "--etcd-endpoints=http://"+pa.Addr(), "--leader-election-namespace=default", "--etcd-step-down-after=3s")
	token := waitTokenOf(t, cl, "cut", 0)
	first := next(t, elected, "replica a never won the etcd election")
	b := startFencer(t, "b", "--etcd-endpoints=http://"+pb.Addr(), "--leader-election-namespace=default", "--etcd-step-down-after=3s")
	waitStatus(t, b.probeURL+"/readyz", http.StatusOK)

	grant := f.followGrant(t, "cut")
	cut := time.Now()
	pa.Set(faultproxy.Blackhole)
	won := next(t, elected, "the standby never took over from a leader cut off from etcd")
	if won.identity == first.identity {
		t.Fatalf("the same identity %s led again", won.identity)
	}
	t.Logf("takeover: the standby won the etcd election %s after the leader's etcd link was cut", won.at.Sub(cut).Round(time.Millisecond))
	exited := make(chan error, 1)
	go func() { exited <- a.cmd.Wait() }()
	select {
	case err := <-exited:
		t.Logf("the cut-off leader exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Error("the cut-off leader did not exit")
	}
	grant.keptUntil(t, cut.Add((ttl+2)*time.Second), token)
	if got := waitTokenOf(t, cl, "cut", 0); got != token {
		t.Fatalf("token %d after the takeover, want %d kept", got, token)
	}
}
