// Command scheduled-job is the story of duplicate scheduled jobs
// (README.md). Three replicas of a service each try to run tonight's
// report, and a lock with a TTL is meant to let only one do it. A GC pause
// longer than the TTL lets a second replica in, and the first one's unlock,
// a plain delete, then removes the second one's lock. With a fencer Lease
// the report is written in an etcd transaction fenced by the token, and
// the lease is given back with fence.Release, which is conditional on the
// token too.
//
//	go run ./examples/scheduled-job demo      # make demo STORY=scheduled-job
package main

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/examples/internal/story"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

const lease = "nightly-report"

func main() {
	story.Main("scheduled-job", map[string]story.Role{
		"demo":     {Run: func(ctx context.Context, _ []string) error { return demo(ctx) }},
		"ttl-lock": {Args: "NIGHT", NArgs: 1, Run: func(ctx context.Context, args []string) error { return withTTLLock(ctx, args[0]) }},
		"fenced":   {Args: "NIGHT", NArgs: 1, Run: func(ctx context.Context, args []string) error { return withLease(ctx, args[0]) }},
	})
}

// keys of the story, below the namespace's data prefix in fencer's etcd.
func reportsKey(prefix, night string) string {
	return path.Join(etcdkeys.DataPrefix(etcdkeys.OrDefault(prefix), story.Namespace), "reports", night) + "/"
}

func lockKey(prefix string) string {
	return path.Join(etcdkeys.DataPrefix(etcdkeys.OrDefault(prefix), story.Namespace), "locks", lease)
}

// reported tells whether tonight's report was written, by anyone. An
// error is not "no report": the caller gives up instead of running the
// report again.
func reported(ctx context.Context, etcd *clientv3.Client, reports string) (bool, error) {
	resp, err := etcd.Get(ctx, reports, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("looking for tonight's report: %w", err)
	}
	return resp.Count > 0, nil
}

// report is the job: it takes a while, long enough for the demo to freeze
// it in the middle even when it reads the timeline from a pod's log.
func report(me string) {
	story.Say(me, "running tonight's report")
	time.Sleep(3 * time.Second)
}

// withTTLLock is the unfenced replica: a lock key with a 2 s TTL, renewed
// while the process runs, taken with a create-if-absent; unlock is a delete.
func withTTLLock(ctx context.Context, night string) error {
	env, err := story.Connect(ctx)
	if err != nil {
		return err
	}
	etcd := env.Etcd
	me, lock, reports := story.Pod(), lockKey(env.Prefix), reportsKey(env.Prefix, night)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		l, err := etcd.Grant(ctx, 2)
		if err != nil {
			return err
		}
		got, err := etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(lock), "=", 0)).
			Then(clientv3.OpPut(lock, me, clientv3.WithLease(l.ID))).Commit()
		if err != nil {
			return err
		}
		if !got.Succeeded {
			_, _ = etcd.Revoke(ctx, l.ID)
			continue
		}
		if _, err := etcd.KeepAlive(ctx, l.ID); err != nil {
			return err
		}
		story.Say(me, "took the lock")
		done, err := reported(ctx, etcd, reports)
		if err != nil {
			return err
		}
		if done {
			story.Say(me, "tonight's report exists: nothing to do")
		} else {
			report(me)
			if _, err := etcd.Put(ctx, reports+me, time.Now().Format(time.RFC3339Nano)); err != nil {
				return err
			}
			story.Say(me, "report written")
		}
		owner, _ := etcd.Get(ctx, lock)
		if _, err := etcd.Delete(ctx, lock); err != nil {
			return err
		}
		if len(owner.Kvs) > 0 && string(owner.Kvs[0].Value) != me {
			story.Say(me, "unlocked: deleted the lock, which %s held", owner.Kvs[0].Value)
		} else {
			story.Say(me, "unlocked")
		}
		<-ctx.Done()
	}
	return nil
}

// withLease is the fenced replica: the report is written only under the
// live token, and only if no report of tonight's exists, in one etcd
// transaction; the lease is given back conditionally.
func withLease(ctx context.Context, night string) error {
	env, err := story.Connect(ctx)
	if err != nil {
		return err
	}
	etcd, prefix := env.Etcd, env.Prefix
	me, reports := story.Pod(), reportsKey(prefix, night)
	// held ends the moment the lease is lost. This report's only effect is
	// the fenced write below, so it runs to that write and lets the fence
	// decide; a job that also sends mail or uploads files checks
	// held.Err() before each such step, which no fence covers.
	tok, held, err := story.Acquire(ctx, env, lease)
	if err != nil {
		return err
	}
	story.Say(me, "holds the lease, token %d", tok.Value)
	done, err := reported(ctx, etcd, reports)
	if err != nil {
		return err
	}
	if done {
		story.Say(me, "tonight's report exists: nothing to do")
	} else {
		report(me)
		// The look above is only a shortcut: the write itself checks
		// again, in the same transaction, that no report of tonight's
		// exists, so a look that raced with another holder's write
		// cannot run the report twice.
		none := clientv3.Compare(clientv3.CreateRevision(reports), "=", 0).WithPrefix()
		put := clientv3.OpPut(reports+me, strconv.FormatInt(tok.Value, 10))
		resp, err := fence.NewTxn(etcd, prefix, story.Namespace, tok).
			Then(clientv3.OpTxn([]clientv3.Cmp{none}, []clientv3.Op{put}, nil)).Commit(ctx)
		var fenced *fence.FencedError
		switch {
		case errors.As(err, &fenced):
			story.Say(me, "report REFUSED: %v", err)
		case err != nil:
			return err
		case !resp.Responses[0].GetResponseTxn().GetSucceeded():
			story.Say(me, "tonight's report exists: not written again")
		default:
			story.Say(me, "report written under token %d", tok.Value)
		}
	}
	_ = held
	// Done early: give the lease back, only if it is still ours.
	if err := fence.Release(ctx, etcd, prefix, story.Namespace, tok); err != nil {
		story.Say(me, "release REFUSED: %v", err)
	} else {
		story.Say(me, "released the lease (token %d)", tok.Value)
	}
	<-ctx.Done()
	return nil
}

func demo(ctx context.Context) error {
	k, err := story.Setup(ctx, "scheduled-job", "cron-0", "cron-1", "cron-2")
	if err != nil {
		return err
	}
	etcd, prefix, err := story.Etcd(ctx, k)
	if err != nil {
		return err
	}
	night := "night-" + strconv.FormatInt(time.Now().Unix(), 10)
	for _, mode := range []struct{ role, title, after string }{
		{"ttl-lock", "without fencer: a lock with a TTL", "unlocked"},
		{"fenced", "with fencer: Lease nightly-report", "REFUSED"},
	} {
		story.Section(mode.title)
		if err := play(ctx, etcd, reportsKey(prefix, night+"-"+mode.role), mode.role, night+"-"+mode.role, mode.after); err != nil {
			return err
		}
	}
	return nil
}

// play starts the three replicas, freezes the one running the report past
// the TTL, lets the others go on, wakes it, and counts tonight's reports.
func play(ctx context.Context, etcd *clientv3.Client, reports, role, night, after string) error {
	var actors []*story.Actor
	for i := range 3 {
		a, err := story.Start(role, fmt.Sprintf("cron-%d", i), night)
		if err != nil {
			return err
		}
		actors = append(actors, a)
	}
	defer story.KillAll(actors...)
	var frozen *story.Actor
	for frozen == nil {
		for _, a := range actors {
			if a.Printed("running tonight's report") {
				frozen = a
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	frozen.Pause()
	// Another replica gets in past the TTL; wake the frozen one while
	// that one is still running the report.
	if err := untilAnother(ctx, actors, frozen, "running tonight's report"); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	frozen.Resume()
	if err := frozen.WaitForCount(ctx, after, 1, 10*time.Second); err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // the running replica finishes; whoever comes next
	resp, err := etcd.Get(ctx, reports, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	var by []string
	for _, kv := range resp.Kvs {
		by = append(by, path.Base(string(kv.Key)))
	}
	story.Say("demo", "tonight's reports: %d, by %v", len(by), by)
	anomaly := ""
	if len(by) != 1 {
		anomaly = fmt.Sprintf("the report ran %d times", len(by))
	}
	if frozen.Printed("which cron-") {
		anomaly += fmt.Sprintf("; %s's unlock deleted another replica's lock", frozen.Pod)
	}
	if role == "fenced" && frozen.Printed("released the lease") {
		anomaly += fmt.Sprintf("; %s's release, under a token past its TTL, was not refused", frozen.Pod)
	}
	mode := "without fencer"
	if role == "fenced" {
		mode = "with fencer"
	}
	story.Verdict(mode, anomaly)
	return nil
}

// untilAnother waits until an actor other than not prints s.
func untilAnother(ctx context.Context, actors []*story.Actor, not *story.Actor, s string) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, a := range actors {
			if a != not && a.Printed(s) {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("no other replica printed %q within 30 s", s)
}
