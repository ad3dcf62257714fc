// Command unique-ids is the story of unique IDs without a central service
// (README.md). Two replicas issue order IDs and event IDs. Without fencer
// the order IDs come from a shared counter read and written back (two
// replicas read the same value), and the event IDs from a snowflake
// generator whose worker ID is in the pod template (every replica has the
// same one); a restart with the clock stepped back repeats IDs as well.
// With fencer the order IDs come from blocks of an IDRange, claimed
// atomically, and the event IDs from a snowflake generator on a leased
// worker slot, which reserves its time in etcd so that a restart with an
// earlier clock waits instead of repeating.
//
//	go run ./examples/unique-ids demo      # make demo STORY=unique-ids
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/examples/internal/story"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/idgen"
)

func main() {
	story.Main("unique-ids", map[string]story.Role{
		"demo":  {Run: func(ctx context.Context, _ []string) error { return demo(ctx) }},
		"issue": {Args: "naive|fenced OUT-FILE", NArgs: 2, Run: func(ctx context.Context, args []string) error { return issue(ctx, args[0], args[1]) }},
	})
}

// clockOffset steps this process's clock, as an NTP correction after a
// restart would. issue sets it from CLOCK_OFFSET.
var clockOffset time.Duration

func now() time.Time { return time.Now().Add(clockOffset) }

func parseClockOffset() (time.Duration, error) {
	v := os.Getenv("CLOCK_OFFSET")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("CLOCK_OFFSET=%q: want a Go duration such as -500ms: %w", v, err)
	}
	return d, nil
}

// issue hands out order and event IDs for 1.5 s, appending each to out.
func issue(ctx context.Context, mode, out string) error {
	var err error
	if clockOffset, err = parseClockOffset(); err != nil {
		return err
	}
	env, err := story.Connect(ctx)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	order, event, err := generators(ctx, env, mode)
	if err != nil {
		return err
	}
	if err := waitForStart(ctx, out); err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	n := 0
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); n++ {
		o, err := order(ctx)
		if err != nil {
			return err
		}
		e, err := event(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "order %d\nevent %d\n", o, e)
		time.Sleep(time.Millisecond)
	}
	story.Say(story.Pod(), "issued %d order IDs and %d event IDs", n, n)
	return w.Flush()
}

// startFile is the gate beside the replicas' output files: the driver
// creates it once every replica is ready, so that they issue IDs at the same
// time however long each pod took to start.
func startFile(out string) string { return filepath.Join(filepath.Dir(out), "start") }

// waitForStart says this replica is ready and waits for the gate. A
// replica restarted later finds it open.
func waitForStart(ctx context.Context, out string) error {
	story.Say(story.Pod(), "ready to issue IDs")
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(startFile(out)); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("no %s after 60 s: the demo starts the replicas together", startFile(out))
}

type next func(context.Context) (int64, error)

func generators(ctx context.Context, env *story.Env, mode string) (next, next, error) {
	k, etcd, prefix := env.K8s, env.Etcd, env.Prefix
	if mode == "naive" {
		counter := etcdkeys.DataPrefix(etcdkeys.OrDefault(prefix), story.Namespace) + "order-counter"
		story.Say(story.Pod(), "order IDs: read the counter, add 100, write it back; event IDs: snowflake with WORKER_ID=1 from the pod template")
		return naiveCounter(etcd, counter), naiveSnowflake(1), nil
	}
	blocks, err := idgen.NewBlocks(etcd, idgen.BlockOptions{Prefix: prefix, Namespace: story.Namespace, Name: "order-ids", Min: 1, Max: 1_000_000_000_000, BlockSize: 100})
	if err != nil {
		return nil, nil, err
	}
	slot, token, err := waitSlot(ctx, k)
	if err != nil {
		return nil, nil, err
	}
	story.Say(story.Pod(), "order IDs: blocks of IDRange order-ids; event IDs: snowflake on slot %d (token %d) of IDRange event-workers", slot, token)
	uid, err := story.PodUID()
	if err != nil {
		return nil, nil, err
	}
	sf, err := idgen.NewSnowflake(ctx, etcd, idgen.SnowflakeOptions{Prefix: prefix, Namespace: story.Namespace, Name: "event-workers", Slot: slot, Token: token, PodUID: uid, Now: now})
	if err != nil {
		return nil, nil, err
	}
	return blocks.Next, sf.Next, nil
}

// naiveCounter claims 100 IDs by reading the counter and writing it back:
// two replicas that read at once get the same 100.
func naiveCounter(etcd *clientv3.Client, key string) next {
	var nextID, last int64
	return func(ctx context.Context) (int64, error) {
		if nextID == 0 || nextID > last {
			resp, err := etcd.Get(ctx, key)
			if err != nil {
				return 0, err
			}
			var c int64
			if len(resp.Kvs) > 0 {
				c, _ = strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
			}
			time.Sleep(20 * time.Millisecond) // a round trip and some work between the read and the write
			if _, err := etcd.Put(ctx, key, strconv.FormatInt(c+100, 10)); err != nil {
				return 0, err
			}
			nextID, last = c+1, c+100
		}
		nextID++
		return nextID - 1, nil
	}
}

// naiveSnowflake is the textbook generator: milliseconds, a fixed worker
// ID and a sequence that restarts every millisecond.
func naiveSnowflake(worker int64) next {
	var lastMs, seq int64
	return func(context.Context) (int64, error) {
		ms := now().Sub(idgen.Epoch).Milliseconds()
		if ms == lastMs {
			seq++
		} else {
			lastMs, seq = ms, 0
		}
		return ms<<22 | worker<<12 | seq, nil
	}
}

// waitSlot reads the pod's slot annotation, once the controller wrote it.
func waitSlot(ctx context.Context, k client.Client) (int64, int64, error) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var p corev1.Pod
		if err := k.Get(ctx, client.ObjectKey{Namespace: story.Namespace, Name: story.Pod()}, &p); err != nil {
			return 0, 0, err
		}
		if a, ok := p.Annotations["idrange.fencer.io/event-workers"]; ok {
			return idgen.ParseSlot(a)
		}
	}
	return 0, 0, fmt.Errorf("pod %s has no slot of IDRange event-workers after 30 s", story.Pod())
}

func demo(ctx context.Context) error {
	if _, err := story.Setup(ctx, "unique-ids", "ids-0", "ids-1"); err != nil {
		return err
	}
	for _, mode := range []struct{ name, title, verdict string }{
		{"naive", "without fencer: a shared counter and a worker ID in the pod template", "without fencer"},
		{"fenced", "with fencer: IDRange blocks and a snowflake on a leased slot", "with fencer"},
	} {
		story.Section(mode.title)
		if err := play(ctx, mode.name, mode.verdict); err != nil {
			return err
		}
	}
	return nil
}

// play runs both replicas at once, then restarts ids-0 with its clock
// stepped back half a second, and counts repeated IDs.
func play(ctx context.Context, mode, verdict string) error {
	// Below the shared directory: on the real node the actor pods write
	// their IDs there, as UID 65532.
	if err := os.MkdirAll(story.SharedDir(), 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(story.SharedDir(), "unique-ids-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	out := func(pod string) string { return filepath.Join(dir, pod) }
	a, err := story.Start("issue", "ids-0", mode, out("ids-0"))
	if err != nil {
		return err
	}
	b, err := story.Start("issue", "ids-1", mode, out("ids-1"))
	if err != nil {
		return err
	}
	// Both issue at once: the overlap is what the story is about, and a
	// replica whose pod started late would otherwise run alone.
	for _, x := range []*story.Actor{a, b} {
		if err := x.WaitForCount(ctx, "ready to issue IDs", 1, 60*time.Second); err != nil {
			return err
		}
	}
	if err := os.WriteFile(startFile(out("ids-0")), nil, 0o644); err != nil {
		return err
	}
	for _, x := range []*story.Actor{a, b} {
		if err := x.WaitForCount(ctx, "issued", 1, 60*time.Second); err != nil {
			return err
		}
	}
	story.KillAll(a, b)
	story.Say("demo", "restart ids-0 with its clock stepped back 500 ms")
	if err := os.Setenv("CLOCK_OFFSET", "-500ms"); err != nil {
		return err
	}
	defer os.Unsetenv("CLOCK_OFFSET")
	r, err := story.Start("issue", "ids-0", mode, out("ids-0"))
	if err != nil {
		return err
	}
	if err := r.WaitForCount(ctx, "issued", 1, 60*time.Second); err != nil {
		return err
	}
	story.KillAll(r)
	dups, total, err := repeats(out("ids-0"), out("ids-1"))
	if err != nil {
		return err
	}
	story.Say("demo", "%d IDs issued; repeated: %d order IDs, %d event IDs", total, dups["order"], dups["event"])
	anomaly := ""
	if dups["order"]+dups["event"] > 0 {
		anomaly = fmt.Sprintf("%d order IDs and %d event IDs were issued more than once", dups["order"], dups["event"])
	}
	story.Verdict(verdict, anomaly)
	return nil
}

// repeats counts, per kind, the IDs that appear more than once.
func repeats(files ...string) (map[string]int, int, error) {
	seen := map[string]int{}
	dups := map[string]int{}
	total := 0
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, 0, err
		}
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			total++
			if seen[line]++; seen[line] == 2 {
				dups[strings.Fields(line)[0]]++
			}
		}
	}
	return dups, total, nil
}
