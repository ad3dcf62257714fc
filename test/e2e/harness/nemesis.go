package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fencer-io/fencer/test/e2e/history"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/faultproxy"
)

// A fault breaks something for a while: inject it, wait, heal it.
type fault struct {
	kind string
	// min and max bound how long it lasts.
	min, max time.Duration
	// inject breaks one target, picked with rng, and returns what it broke
	// and how to heal it.
	inject func(ctx context.Context, rng *rand.Rand) (target string, heal func(context.Context) error)
}

// faults are the nemesis's repertoire. Pauses of workers outlast the
// longest Lease TTL (3 s), so a paused holder always loses its Lease and
// wakes up with a stale token.
func (h *Harness) faultKinds() []fault {
	pick := func(rng *rand.Rand, ps []*process) *process { return ps[rng.IntN(len(ps))] }
	return append(h.databaseFaults(), []fault{
		{"pause-worker", 4 * time.Second, 8 * time.Second, func(_ context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			w := pick(rng, h.workers)
			w.pause()
			return w.name, func(context.Context) error { w.resume(); return nil }
		}},
		{"pause-manager", 3 * time.Second, 8 * time.Second, func(_ context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			m := pick(rng, h.managers)
			m.pause()
			return m.name, func(context.Context) error { m.resume(); return nil }
		}},
		{"kill-manager", time.Second, 3 * time.Second, func(_ context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			m := pick(rng, h.managers)
			m.mu.Lock()
			m.stopped = true // the supervisor must not restart it before the heal
			m.mu.Unlock()
			m.kill()
			return m.name, func(context.Context) error { return m.start() }
		}},
		{"kill-etcd-member", 2 * time.Second, 6 * time.Second, func(_ context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			e := h.members[rng.IntN(len(h.members))]
			e.Kill()
			return e.Endpoint, func(ctx context.Context) error { return e.Start(ctx) }
		}},
		{"restart-etcd-cluster", time.Second, 3 * time.Second, func(context.Context, *rand.Rand) (string, func(context.Context) error) {
			for _, e := range h.members {
				_ = e.Stop()
			}
			return "all members", func(ctx context.Context) error { return devcluster.StartAll(ctx, h.members) }
		}},
		{"partition-manager", 3 * time.Second, 8 * time.Second, func(_ context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			m := pick(rng, h.managers)
			m.partition(faultproxy.Blackhole)
			return m.name, func(context.Context) error { m.partition(faultproxy.Pass); return nil }
		}},
		{"partition-worker", 3 * time.Second, 8 * time.Second, func(_ context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			w := pick(rng, h.workers)
			w.partition(faultproxy.Blackhole)
			return w.name, func(context.Context) error { w.partition(faultproxy.Pass); return nil }
		}},
		{"slow-etcd-link", 3 * time.Second, 8 * time.Second, func(_ context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			// 50–400 ms each way on every etcd link of one process: slow, not down.
			p := pick(rng, append(append([]*process{}, h.managers...), h.workers...))
			d := time.Duration(50+rng.IntN(351)) * time.Millisecond
			for _, px := range p.proxies {
				px.SetDelay(d)
			}
			return fmt.Sprintf("%s (+%s)", p.name, d), func(context.Context) error {
				for _, px := range p.proxies {
					px.SetDelay(0)
				}
				return nil
			}
		}},
		{"webhook-down", 2 * time.Second, 5 * time.Second, func(context.Context, *rand.Rand) (string, func(context.Context) error) {
			h.webhook.Set(faultproxy.Reset)
			return "webhook", func(context.Context) error { h.webhook.Set(faultproxy.Pass); return nil }
		}},
	}...)
}

// Nemesis injects faults one after another, picked at random from seed,
// until ctx is done or duration has passed: every kind once first, in an
// order drawn from seed, so that a short run (CI's 2 minutes) has each,
// the worker's pause that makes stale tokens included; then kinds drawn
// at random. It returns how many it injected, by kind.
func (h *Harness) Nemesis(ctx context.Context, seed uint64, duration time.Duration) (map[string]int, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	kinds := h.faultKinds()
	first := rng.Perm(len(kinds))
	counts := map[string]int{}
	end := time.Now().Add(duration)
	for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
		f := kinds[rng.IntN(len(kinds))]
		if i < len(first) {
			f = kinds[first[i]]
		}
		lasts := f.min + time.Duration(rng.Int64N(int64(f.max-f.min)+1))
		target, heal := f.inject(ctx, rng)
		counts[f.kind]++
		h.opts.Logf("fault %s on %s for %s", f.kind, target, lasts.Round(time.Millisecond))
		if err := h.faults.Add(history.Fault{At: time.Now(), Kind: f.kind, Target: target, For: lasts}); err != nil {
			return counts, err
		}
		sleep(ctx, lasts)
		if err := heal(ctx); err != nil {
			return counts, fmt.Errorf("healing %s on %s: %w", f.kind, target, err)
		}
		sleep(ctx, time.Second+time.Duration(rng.Int64N(int64(2*time.Second))))
	}
	return counts, nil
}

// PauseHolder pauses the worker holding lease for d, then resumes it: the
// scripted fault of the checker's own test.
func (h *Harness) PauseHolder(ctx context.Context, lease string, d time.Duration) (string, error) {
	holder, err := h.holderOf(ctx, lease)
	if err != nil {
		return "", err
	}
	for _, w := range h.workers {
		if w.name == holder {
			w.pause()
			_ = h.faults.Add(history.Fault{At: time.Now(), Kind: "pause-worker", Target: w.name, For: d})
			sleep(ctx, d)
			w.resume()
			return holder, nil
		}
	}
	return "", fmt.Errorf("lease %s is held by %q, not a worker", lease, holder)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
