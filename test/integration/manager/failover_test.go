package manager

import (
	"bufio"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/testenv"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// wonAt returns when the replica logged winning the etcd election, if it did.
func (r *replica) wonAt() (time.Time, bool) {
	f, err := os.Open(r.log)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "won the etcd election") {
			continue
		}
		// fencer logs "ts" as RFC3339 with nanoseconds.
		if i := strings.Index(line, `"ts":"`); i >= 0 {
			if end := strings.IndexByte(line[i+6:], '"'); end > 0 {
				if ts, err := time.Parse(time.RFC3339Nano, line[i+6:i+6+end]); err == nil {
					return ts, true
				}
			}
		}
		return time.Now(), true
	}
	return time.Time{}, false
}

// TestControllerCrashKeepsToken: kill -9 the active replica mid-tenure; the
// standby takes over renewals before the grant's TTL runs out, so the token
// does not change. It logs the takeover time, which docs/operations.md
// states as the smallest safe ttlSeconds.
func TestControllerCrashKeepsToken(t *testing.T) {
	endpoint := fencerEtcd(t)
	ctx := context.Background()
	cl, err := client.New(env.Config, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	readyPod(t, cl, "w-0", "crash")
	// The smallest ttlSeconds docs/operations.md promises survives a crash.
	const ttl = 10
	lease := &fencerv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "crash", Namespace: "default"},
		Spec:       fencerv1.LeaseSpec{TTLSeconds: ttl, HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "crash"}}},
	}
	if err := cl.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}

	a := startFencer(t, "a", "--etcd-endpoints="+endpoint, "--leader-election-namespace=default")
	token := waitToken(t, cl, 0)
	b := startFencer(t, "b", "--etcd-endpoints="+endpoint, "--leader-election-namespace=default")
	if _, won := a.wonAt(); !won {
		t.Fatal("replica a granted without logging its etcd election win")
	}
	time.Sleep(2 * time.Second) // let b's caches sync, as a standby's would have
	killed := time.Now()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}

	var won time.Time
	deadline := time.Now().Add(60 * time.Second)
	for ok := false; !ok; won, ok = b.wonAt() {
		if time.Now().After(deadline) {
			t.Fatal("standby never won the etcd election")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("takeover: standby won the etcd election %s after the leader was killed", won.Sub(killed).Round(time.Millisecond))

	// Past a full TTL after the crash, the key survives only if b renews it.
	time.Sleep(time.Until(killed.Add((ttl + 2) * time.Second)))
	etcdCli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcdCli.Close()
	resp, err := etcdCli.Get(ctx, etcdkeys.LeaseKey(etcdkeys.DefaultPrefix, "default", "crash"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != token {
		t.Fatalf("after the crash the key is %v, want CreateRevision %d kept", resp.Kvs, token)
	}
	l := &fencerv1.Lease{}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(lease), l); err != nil {
		t.Fatal(err)
	}
	if l.Status.Token != token || l.Status.Transitions != 0 {
		t.Fatalf("status token %d transitions %d, want %d and 0", l.Status.Token, l.Status.Transitions, token)
	}
}

// waitToken waits until the Lease's status has a token other than not.
func waitToken(t *testing.T, cl client.Client, not int64) int64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		l := &fencerv1.Lease{}
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "crash"}, l); err == nil && l.Status.Token != 0 && l.Status.Token != not {
			return l.Status.Token
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("lease never held")
	return 0
}
