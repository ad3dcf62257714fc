package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/support/testenv"
)

const lockPrefix, lockNS = "/fencer", "bench"

// lockSamples is how many interleaved samples each uncontended row takes
// (FENCER_LOCK_SAMPLES, default 10,000).
func lockSamples() int {
	if n, err := strconv.Atoi(os.Getenv("FENCER_LOCK_SAMPLES")); err == nil && n > 0 {
		return n
	}
	return 10000
}

// TestKeyedLocksAgainstMutex measures fencer's keyed locks beside etcd's
// own concurrency.Mutex, on one etcd run as the chart runs it (TLS, client
// certificates, auth on), both as the same namespace identity.
func TestKeyedLocksAgainstMutex(t *testing.T) {
	e := testenv.StartSecureEtcd(t, lockPrefix)
	mgr := e.Client(t, "manager")
	if err := identity.EnsureNamespace(context.Background(), mgr, lockPrefix, lockNS, "bench", nil); err != nil {
		t.Fatal(err)
	}
	if err := e.PKI.Issue(lockNS, identity.Request{CommonName: identity.NamespaceUser(lockPrefix, lockNS, "bench")}); err != nil {
		t.Fatal(err)
	}
	connect := func() *clientv3.Client {
		tlsCfg, err := e.PKI.TLS(lockNS)
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	b := &lockBench{t: t, connect: connect}
	n := lockSamples()
	t.Logf("keyed locks against concurrency.Mutex, one TLS+auth etcd, %d interleaved samples per uncontended row", n)

	ours, theirs := b.uncontended(n)
	t.Logf("| uncontended lock+unlock | fencer p50 %s p99 %s | Mutex p50 %s p99 %s | ratio p50 %.2f p99 %.2f (targets ≤1.10, ≤1.25) |",
		us(quantile(ours, .5)), us(quantile(ours, .99)), us(quantile(theirs, .5)), us(quantile(theirs, .99)),
		ratio(quantile(ours, .5), quantile(theirs, .5)), ratio(quantile(ours, .99), quantile(theirs, .99)))
	record(t, "KeyedLock/uncontended/fencer", quantile(ours, .5).Nanoseconds(), "p50-ns", quantile(ours, .99).Nanoseconds(), "p99-ns")
	record(t, "KeyedLock/uncontended/mutex", quantile(theirs, .5).Nanoseconds(), "p50-ns", quantile(theirs, .99).Nanoseconds(), "p99-ns")

	one, three := b.sets(n)
	t.Logf("| a 3-key set against one key | one p50 %s p99 %s | three p50 %s p99 %s | ratio p50 %.2f (target ≤1.5) |",
		us(quantile(one, .5)), us(quantile(one, .99)), us(quantile(three, .5)), us(quantile(three, .99)), ratio(quantile(three, .5), quantile(one, .5)))
	record(t, "KeyedLock/set3", quantile(three, .5).Nanoseconds(), "p50-ns", quantile(three, .99).Nanoseconds(), "p99-ns")

	const waiters, handoffs = 8, 2000
	ho, hm := b.handoff(false, waiters, handoffs), b.handoff(true, waiters, handoffs)
	t.Logf("| hand-off, %d waiters | fencer p50 %s p99 %s | Mutex p50 %s p99 %s | ratio p50 %.2f |",
		waiters, us(quantile(ho, .5)), us(quantile(ho, .99)), us(quantile(hm, .5)), us(quantile(hm, .99)), ratio(quantile(ho, .5), quantile(hm, .5)))
	record(t, "KeyedLock/handoff/fencer", quantile(ho, .5).Nanoseconds(), "p50-ns", quantile(ho, .99).Nanoseconds(), "p99-ns")
	record(t, "KeyedLock/handoff/mutex", quantile(hm, .5).Nanoseconds(), "p50-ns", quantile(hm, .99).Nanoseconds(), "p99-ns")

	const keys, workers, span, windows = 1000, 16, 10 * time.Second, 5
	to, tm := b.throughput(keys, workers, span, windows)
	t.Logf("| %d disjoint keys, %d goroutines, %s each in %d alternating windows | fencer %.0f lock+unlock/s, CPU per op: %s | Mutex %.0f/s, %s | ratio %.2f |",
		keys, workers, span, windows, to.rate, to.perOp(), tm.rate, tm.perOp(), to.rate/tm.rate)
	record(t, "KeyedLock/throughput/fencer", to.rate, "ops/s")
	record(t, "KeyedLock/throughput/mutex", tm.rate, "ops/s")
}

type lockBench struct {
	t       *testing.T
	connect func() *clientv3.Client
}

func us(d time.Duration) string        { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func (b *lockBench) locker(cli *clientv3.Client) *fence.Locker {
	l, err := fence.NewLocker(cli, lockPrefix, lockNS, fence.LockerOptions{Pod: "bench"})
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func (b *lockBench) session(cli *clientv3.Client) *concurrency.Session {
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(fence.DefaultLockTTL/time.Second)))
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = s.Close() })
	return s
}

// mutexKey is where a Mutex of key lives: in the namespace's lock range,
// which its identity may use.
func mutexKey(key string) string {
	return etcdkeys.NamespaceLocksPrefix(lockPrefix, lockNS) + "mutex-" + key
}

// uncontended times Lock+Unlock of one free key, fencer's and the Mutex's
// interleaved, after a warm-up of each.
func (b *lockBench) uncontended(n int) (ours, theirs []time.Duration) {
	ctx := context.Background()
	cli := b.connect()
	l, s := b.locker(cli), b.session(cli)
	m := concurrency.NewMutex(s, mutexKey("u"))
	fencer := func() time.Duration {
		start := time.Now()
		lk, err := l.Lock(ctx, "u")
		if err != nil {
			b.t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.t.Fatal(err)
		}
		return time.Since(start)
	}
	mutex := func() time.Duration {
		start := time.Now()
		if err := m.Lock(ctx); err != nil {
			b.t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			b.t.Fatal(err)
		}
		return time.Since(start)
	}
	for range 200 {
		fencer()
		mutex()
	}
	for i := range n {
		if i%2 == 0 {
			ours, theirs = append(ours, fencer()), append(theirs, mutex())
		} else {
			theirs, ours = append(theirs, mutex()), append(ours, fencer())
		}
	}
	return sorted(ours), sorted(theirs)
}

// sets times Lock+Unlock of one key and of a 3-key set, interleaved.
func (b *lockBench) sets(n int) (one, three []time.Duration) {
	ctx := context.Background()
	l := b.locker(b.connect())
	run := func(keys ...string) time.Duration {
		start := time.Now()
		lk, err := l.Lock(ctx, keys...)
		if err != nil {
			b.t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.t.Fatal(err)
		}
		return time.Since(start)
	}
	for range 200 {
		run("s1")
		run("src", "dst", "tree")
	}
	for range n {
		one = append(one, run("s1"))
		three = append(three, run("src", "dst", "tree"))
	}
	return sorted(one), sorted(three)
}

// handoff has waiters goroutines, each with a session of its own (as
// separate pods would), take one key in turn, and times each hand-off:
// from the holder's Unlock call to the next holder's Lock returning.
func (b *lockBench) handoff(mutex bool, waiters, n int) []time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu       sync.Mutex
		released time.Time
		out      []time.Duration
		done     atomic.Bool
		wg       sync.WaitGroup
	)
	take := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if !released.IsZero() && len(out) < n {
			out = append(out, d)
		}
		if len(out) >= n {
			done.Store(true)
		}
	}
	for range waiters {
		cli := b.connect()
		var lock func() (unlock func() error, err error)
		if mutex {
			m := concurrency.NewMutex(b.session(cli), mutexKey("handoff"))
			lock = func() (func() error, error) {
				return func() error { return m.Unlock(context.Background()) }, m.Lock(ctx)
			}
		} else {
			l := b.locker(cli)
			lock = func() (func() error, error) {
				lk, err := l.Lock(ctx, "handoff")
				if err != nil {
					return nil, err
				}
				return func() error { return lk.Unlock(context.Background()) }, nil
			}
		}
		wg.Go(func() {
			for !done.Load() {
				unlock, err := lock()
				if err != nil {
					return
				}
				mu.Lock()
				since := time.Since(released)
				mu.Unlock()
				take(since)
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err := unlock(); err != nil {
					b.t.Error(err)
					return
				}
			}
			cancel()
		})
	}
	wg.Wait()
	return sorted(out)
}

// throughput runs workers goroutines over keys disjoint keys, fencer's
// locks and the Mutex in turn, windows times each, for span each in all.
// Each side has one session shared by the process (as one pod would).
// Alternating windows, not one run after the other, keep the machine's
// drift (other load, etcd's growing history) out of the ratio.
func (b *lockBench) throughput(keys, workers int, span time.Duration, windows int) (fencer, mutex lockRate) {
	l, s := b.locker(b.connect()), b.session(b.connect())
	ours := func(ctx context.Context, key string) error {
		lk, err := l.Lock(ctx, key)
		if err != nil {
			return err
		}
		return lk.Unlock(ctx)
	}
	theirs := func(ctx context.Context, key string) error {
		m := concurrency.NewMutex(s, mutexKey(key))
		if err := m.Lock(ctx); err != nil {
			return err
		}
		return m.Unlock(ctx)
	}
	for range windows {
		fencer.add(b.window(ours, keys, workers, span/time.Duration(windows)))
		mutex.add(b.window(theirs, keys, workers, span/time.Duration(windows)))
	}
	fencer.rate, mutex.rate = float64(fencer.ops)/span.Seconds(), float64(mutex.ops)/span.Seconds()
	return fencer, mutex
}

// lockRate is what one side of the throughput row did: calls, their rate,
// and the CPU they cost, by process (the test's own is the client's).
type lockRate struct {
	ops  int64
	rate float64
	cpu  cpuByProcess
}

func (r *lockRate) add(ops int64, cpu cpuByProcess) {
	r.ops += ops
	if r.cpu == nil {
		r.cpu = cpuByProcess{}
	}
	for name, d := range cpu {
		name, _, _ = strings.Cut(name, "[") // etcd[pid] as etcd
		r.cpu[name] += d
	}
}

// perOp is the CPU per call, by process.
func (r lockRate) perOp() string {
	parts := make([]string, 0, len(r.cpu))
	for name, d := range r.cpu {
		parts = append(parts, fmt.Sprintf("%s %.0f µs", name, float64(d.Microseconds())/float64(max(r.ops, 1))))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// window runs workers goroutines calling lockUnlock over keys disjoint
// keys for span, and returns how many calls completed and the CPU used
// meanwhile, by process.
func (b *lockBench) window(lockUnlock func(context.Context, string) error, keys, workers int, span time.Duration) (int64, cpuByProcess) {
	var ops atomic.Int64
	before := processCPU(nil)
	deadline := time.Now().Add(span)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; time.Now().Before(deadline); i += workers {
				if err := lockUnlock(context.Background(), "t"+strconv.Itoa(i%keys)); err != nil {
					b.t.Error("lock+unlock failed:", err)
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	return ops.Load(), processCPU(nil).minus(before)
}
