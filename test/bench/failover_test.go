package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// trials is how many failovers each system gets at each TTL
// (FAILOVER_TRIALS, default 30).
func trials() int { return positiveEnv("FAILOVER_TRIALS", 30) }

// atOnce is how many of them fail over in the same instant, each on its
// own lease (FAILOVER_AT_ONCE, default 30): the scenario is 30 holders
// failing over together, repeated in rounds until there are trials()
// samples. A round at a TTL of 15 s costs one wait, not 30.
func atOnce() int { return positiveEnv("FAILOVER_AT_ONCE", 30) }

func positiveEnv(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// inRounds has measure time rounds of at most atOnce() simultaneous
// failovers until n are timed.
func inRounds(n int, measure func(k int) []time.Duration) []time.Duration {
	var all []time.Duration
	for len(all) < n {
		all = append(all, measure(min(atOnce(), n-len(all)))...)
	}
	return all
}

// TestFailoverAgainstAnchors measures, for TTLs of 2 s and 15 s, the time
// from the holder stopping renewal to the next holder having its token or
// leadership, for fencer (holder pod goes not Ready), client-go's
// leaderelection on a coordination.k8s.io Lease (the leader stops
// renewing), and etcd's concurrency.Election (the leader's session stops
// its keepalives). It reports p50 and p99 of (failover − TTL).
func TestFailoverAgainstAnchors(t *testing.T) {
	fx.StartController(t, "bench")
	n := trials()
	type row struct {
		system string
		ttl    time.Duration
		d      []time.Duration
	}
	var rows []row
	parts := map[time.Duration]*failoverParts{}
	for _, ttl := range []time.Duration{2 * time.Second, 15 * time.Second} {
		parts[ttl] = &failoverParts{}
		rows = append(rows,
			row{"fencer", ttl, inRounds(n, func(k int) []time.Duration { return fencerFailovers(t, k, ttl, parts[ttl]) })},
			row{"client-go-leaderelection", ttl, inRounds(n, func(k int) []time.Duration { return leaderElectionFailovers(t, k, ttl) })},
			row{"etcd-concurrency-election", ttl, inRounds(n, func(k int) []time.Duration { return etcdElectionFailovers(t, k, ttl) })})
	}
	fmt.Printf("\nFailover: holder stops renewing -> next holder has its token (%d trials each, %d at once)\n", n, min(n, atOnce()))
	fmt.Printf("%-27s %5s %14s %14s %12s %12s\n", "system", "TTL", "p50 failover", "p99 failover", "p50 - TTL", "p99 - TTL")
	for _, r := range rows {
		s := sorted(r.d)
		p50, p99 := quantile(s, 0.5), quantile(s, 0.99)
		fmt.Printf("%-27s %5s %12sms %12sms %10sms %10sms\n", r.system, r.ttl, ms(p50), ms(p99), ms(p50-r.ttl), ms(p99-r.ttl))
		record(t, fmt.Sprintf("Failover/%s/ttl=%s", r.system, r.ttl), ms(p50-r.ttl), "p50-over-ttl-ms", ms(p99-r.ttl), "p99-over-ttl-ms")
	}
	for _, ttl := range []time.Duration{2 * time.Second, 15 * time.Second} {
		parts[ttl].print(ttl)
	}
}

// fencerFailovers: n Leases of ttl, each with two candidate pods; the
// holder of each goes not Ready (its readiness probe fails), and the clock
// stops when the other pod's annotation carries a larger token.
func fencerFailovers(t *testing.T, n int, ttl time.Duration, parts *failoverParts) []time.Duration {
	ctx := context.Background()
	ns := fx.Namespace(t)
	first := make([]*corev1.Pod, n)
	for i := range n {
		app := fmt.Sprintf("f%d", i)
		first[i] = fx.ReadyPod(t, ns, app+"-a", app, "")
	}
	for i := range n {
		app := fmt.Sprintf("f%d", i)
		fx.ReadyPod(t, ns, app+"-b", app, "")
		l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns},
			Spec: fencerv1.LeaseSpec{TTLSeconds: int32(ttl / time.Second), HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
		if err := fx.Client.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	old := make([]int64, n)
	waitAll(t, 60*time.Second, func() (int, error) {
		var list fencerv1.LeaseList
		if err := fx.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return 0, err
		}
		held := 0
		for _, l := range list.Items {
			var i int
			if _, err := fmt.Sscanf(l.Name, "f%d", &i); err != nil {
				return 0, fmt.Errorf("lease %s: %w", l.Name, err)
			}
			if l.Status.Holder == l.Name+"-a" && l.Status.Token != 0 {
				old[i] = l.Status.Token
				held++
			}
		}
		return held, nil
	}, n)
	// The clock stops when the watch delivers the pod update that carries
	// the larger token. A watch, not a LIST every few milliseconds: polling
	// 2n pods would take CPU from the controller it times, and add its own
	// interval to every trial.
	advanced := watchTokens(t, ns, old)
	// Let a renewal or two pass, as in steady state.
	time.Sleep(ttl / 2)
	stopped := make([]time.Time, n)
	for i, p := range first {
		stopped[i] = time.Now()
		fx.SetReady(t, p, false)
	}
	took := make([]time.Duration, n)
	timeout := time.After(ttl + time.Minute)
	for done := 0; done < n; done++ {
		select {
		case a := <-advanced:
			took[a.i] = a.at.Sub(stopped[a.i])
		case <-timeout:
			t.Fatalf("fencer: %d of %d Leases failed over within TTL + 1m", done, n)
		}
	}
	parts.add(t, ns, ttl, old, stopped, took)
	return took
}

// failoverParts splits fencer's failovers in two, from each Lease's
// history: the old tenure's end after stop + TTL (a renewal that landed
// before the controller heard the pod went not Ready, and the wait for a
// worker), and the new holder's annotation seen after that end (the pass
// that ends one tenure grants the next, at the same instant in the
// history; then the etcd writes, the status write, the pod patch and the
// watch).
type failoverParts struct{ ended, seen []time.Duration }

// add records the parts of a round's failovers in namespace ns.
func (p *failoverParts) add(t *testing.T, ns string, ttl time.Duration, old []int64, stopped []time.Time, took []time.Duration) {
	t.Helper()
	var list fencerv1.LeaseList
	if err := fx.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, l := range list.Items {
		var i int
		if _, err := fmt.Sscanf(l.Name, "f%d", &i); err != nil || i >= len(old) {
			continue
		}
		var end time.Time
		for _, h := range l.Status.History {
			if h.Token == old[i] && h.End != nil {
				end = h.End.Time
			}
		}
		if end.IsZero() {
			continue
		}
		p.ended = append(p.ended, end.Sub(stopped[i].Add(ttl)))
		p.seen = append(p.seen, stopped[i].Add(took[i]).Sub(end))
	}
}

func (p *failoverParts) print(ttl time.Duration) {
	fmt.Printf("fencer, TTL %s, the parts of %d failovers:%15s %10s\n", ttl, len(p.ended), "p50", "p99")
	for _, part := range []struct {
		name string
		d    []time.Duration
	}{{"old tenure's end - (stop + TTL)", p.ended}, {"new holder's annotation seen - that end", p.seen}} {
		s := sorted(part.d)
		fmt.Printf("  %-48s %8sms %8sms\n", part.name, ms(quantile(s, 0.5)), ms(quantile(s, 0.99)))
	}
}

// advance is trial i's pod b seen with a token larger than the old
// holder's, at the moment the watch delivered it.
type advance struct {
	i  int
	at time.Time
}

// watchTokens follows the pods of ns until the test ends, and sends one
// advance per trial: the first time pod f<i>-b carries a token of Lease
// f<i> above old[i].
func watchTokens(t *testing.T, ns string, old []int64) <-chan advance {
	t.Helper()
	c, err := client.NewWithWatch(fx.Config, client.Options{Scheme: fx.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	if err := c.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(context.Background(), &corev1.PodList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: pods.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	out := make(chan advance, len(old))
	go func() {
		seen := make([]bool, len(old))
		for ev := range w.ResultChan() {
			at := time.Now()
			p, ok := ev.Object.(*corev1.Pod)
			var i int
			if !ok || ev.Type != watch.Modified {
				continue
			}
			if _, err := fmt.Sscanf(p.Name, "f%d-b", &i); err != nil || i >= len(old) || seen[i] {
				continue
			}
			tok, _ := strconv.ParseInt(p.Annotations[fencerv1.HolderTokenAnnotationPrefix+fmt.Sprintf("f%d", i)], 10, 64)
			if tok > old[i] {
				seen[i] = true
				out <- advance{i, at}
			}
		}
	}()
	return out
}

// leaderElectionFailovers: client-go leaderelection with LeaseDuration=ttl
// and its default ratios (15 s / 10 s / 2 s: renew deadline 2/3, retry
// period 2/15 of the duration). The leader's context is cancelled without
// releasing the lock, as a process that stops renewing.
func leaderElectionFailovers(t *testing.T, n int, ttl time.Duration) []time.Duration {
	cs, err := kubernetes.NewForConfig(fx.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := fx.Namespace(t)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprintf("le%d", i)
			elector := func(id string, led chan<- time.Time) (context.CancelFunc, error) {
				lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Client: cs.CoordinationV1(),
					LockConfig: resourcelock.ResourceLockConfig{Identity: id}}
				le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
					Lock: lock, LeaseDuration: ttl, RenewDeadline: ttl * 2 / 3, RetryPeriod: ttl * 2 / 15,
					Callbacks: leaderelection.LeaderCallbacks{
						OnStartedLeading: func(context.Context) { led <- time.Now() },
						OnStoppedLeading: func() {},
					},
				})
				if err != nil {
					return nil, err
				}
				ctx, cancel := context.WithCancel(context.Background())
				go le.Run(ctx)
				return cancel, nil
			}
			aLed, bLed := make(chan time.Time, 1), make(chan time.Time, 1)
			stopA, err := elector("a", aLed)
			if err != nil {
				t.Error(err)
				return
			}
			<-aLed
			stopB, err := elector("b", bLed)
			if err != nil {
				t.Error(err)
				return
			}
			defer stopB()
			time.Sleep(ttl / 2)
			stopped := time.Now()
			stopA()
			select {
			case at := <-bLed:
				took[i] = at.Sub(stopped)
			case <-time.After(ttl + time.Minute):
				t.Errorf("client-go leaderelection %s: no new leader within TTL + 1m", name)
			}
		})
	}
	wg.Wait()
	return took
}

// etcdElectionFailovers: etcd's concurrency.Election with session TTL =
// ttl. Each candidate has its own client; closing the leader's client stops
// its keepalives without revoking the lease, as a process that stops.
func etcdElectionFailovers(t *testing.T, n int, ttl time.Duration) []time.Duration {
	round := electionRounds.Add(1) // a round's leaders hold their keys until their TTLs pass
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			connect := func() (*clientv3.Client, *concurrency.Election, error) {
				cli, err := fx.ConnectEtcd()
				if err != nil {
					return nil, nil, err
				}
				s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)))
				if err != nil {
					return nil, nil, err
				}
				return cli, concurrency.NewElection(s, fmt.Sprintf("/bench/election/%s/%d/%d", ttl, round, i)), nil
			}
			ctx := context.Background()
			aCli, a, err := connect()
			if err != nil {
				t.Error(err)
				return
			}
			if err := a.Campaign(ctx, "a"); err != nil {
				t.Error(err)
				return
			}
			bCli, b, err := connect()
			if err != nil {
				t.Error(err)
				return
			}
			defer bCli.Close()
			won := make(chan time.Time, 1)
			go func() {
				if err := b.Campaign(ctx, "b"); err == nil {
					won <- time.Now()
				}
			}()
			time.Sleep(ttl / 2)
			stopped := time.Now()
			aCli.Close()
			select {
			case at := <-won:
				took[i] = at.Sub(stopped)
			case <-time.After(ttl + time.Minute):
				t.Errorf("etcd election %d: no new leader within TTL + 1m", i)
			}
		})
	}
	wg.Wait()
	return took
}

// electionRounds numbers the rounds of etcdElectionFailovers.
var electionRounds atomic.Int64

// waitAll polls count until it reaches want.
func waitAll(t *testing.T, timeout time.Duration, count func() (int, error), want int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	got, err := 0, error(nil)
	for time.Now().Before(deadline) {
		if got, err = count(); err == nil && got >= want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%d of %d after %s (%v)", got, want, timeout, err)
}
