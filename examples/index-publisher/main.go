// Command index-publisher is the story of a single publisher of a shared
// search index (README.md). The elected publisher builds an index and
// publishes it to a ConfigMap. The demo freezes it between building and
// publishing, past its lease; a new publisher takes over and publishes
// newer indexes; then the old one wakes up and publishes its old index.
// Without fencing that write lands and the index goes back in time. With
// the ConfigMap fenced (label fencer.io/lease) and the token sent with the
// write, the webhook refuses it.
//
//	go run ./examples/index-publisher demo      # make demo STORY=index-publisher
package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/examples/internal/story"
	"github.com/fencer-io/fencer/pkg/fence"
)

const lease = "index-publisher"

func main() {
	story.Main("index-publisher", map[string]story.Role{
		"demo": {Run: func(ctx context.Context, _ []string) error { return demo(ctx) }},
		"publisher": {Args: "[--fenced] [--epoch=<unix ms>]", Run: func(ctx context.Context, args []string) error {
			fs := flag.NewFlagSet("publisher", flag.ExitOnError)
			fenced := fs.Bool("fenced", false, "publish to the fenced ConfigMap, sending the token")
			epoch := fs.Int64("epoch", 0, "versions count milliseconds from this Unix time in milliseconds (the run's start)")
			_ = fs.Parse(args)
			return publisher(ctx, *fenced, *epoch)
		}},
	})
}

// indexName is the ConfigMap the publishers write: fenced or not.
func indexName(fenced bool) string {
	if fenced {
		return "search-index"
	}
	return "search-index-unfenced"
}

// publisher is one pod's program: while it holds the lease, build an
// index, then publish it.
func publisher(ctx context.Context, fenced bool, epoch int64) error {
	env, err := story.Connect(ctx)
	if err != nil {
		return err
	}
	k, me := env.K8s, story.Pod()
	var tok fence.Token
	var held context.Context
	for {
		if held == nil || held.Err() != nil {
			if tok, held, err = story.Acquire(ctx, env, lease); err != nil {
				return err
			}
			story.Say(me, "elected publisher, token %d", tok.Value)
		}
		// Building takes a while; the version is when it started, in
		// milliseconds since the run began. Both publishers share the epoch,
		// so versions compare across them and never wrap within a run.
		version := time.Now().UnixMilli() - epoch
		time.Sleep(300 * time.Millisecond)
		story.Say(me, "built index v%d", version)
		time.Sleep(1200 * time.Millisecond) // uploading
		if err := publish(ctx, k, fenced, tok, me, version); err != nil {
			story.Say(me, "publish of v%d REFUSED: %v", version, err)
		} else {
			story.Say(me, "published index v%d", version)
		}
	}
}

func publish(ctx context.Context, k client.Client, fenced bool, tok fence.Token, me string, version int64) error {
	c := k
	if fenced {
		// Every write carries the token; the webhook compares it with the
		// lease's live token.
		c = fence.NewClient(k, tok)
	}
	data := map[string]string{"version": strconv.FormatInt(version, 10), "publisher": me}
	var cm corev1.ConfigMap
	err := c.Get(ctx, client.ObjectKey{Namespace: story.Namespace, Name: indexName(fenced)}, &cm)
	if apierrors.IsNotFound(err) {
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: story.Namespace, Name: indexName(fenced)}, Data: data}
		if fenced {
			cm.Labels = map[string]string{"fencer.io/lease": lease}
		}
		return c.Create(ctx, &cm)
	}
	if err != nil {
		return err
	}
	cm.Data = data
	return c.Update(ctx, &cm)
}

// demo plays the story twice, without fencing and with it.
func demo(ctx context.Context) error {
	k, err := story.Setup(ctx, "index-publisher", "publisher-0", "publisher-1")
	if err != nil {
		return err
	}
	for _, fenced := range []bool{false, true} {
		if err := run(ctx, k, fenced); err != nil {
			return err
		}
	}
	return nil
}

func run(ctx context.Context, k client.Client, fenced bool) error {
	mode := "without fencer"
	if fenced {
		mode = "with fencer"
	}
	story.Section(fmt.Sprintf("%s: ConfigMap %s", mode, indexName(fenced)))
	flags := []string{fmt.Sprintf("--fenced=%v", fenced), fmt.Sprintf("--epoch=%d", time.Now().UnixMilli())}
	a, err := story.Start("publisher", "publisher-0", flags...)
	if err != nil {
		return err
	}
	b, err := story.Start("publisher", "publisher-1", flags...)
	if err != nil {
		return err
	}
	defer story.KillAll(a, b)
	old, next, err := story.FirstTo(ctx, "published index", a, b)
	if err != nil {
		return err
	}
	// Freeze the leader between building and publishing.
	before := old.Count("built index")
	if err := old.WaitForCount(ctx, "built index", before+1, 10*time.Second); err != nil {
		return err
	}
	old.Pause()
	published := next.Count("published index")
	if err := next.WaitForCount(ctx, "published index", published+2, 30*time.Second); err != nil {
		return err
	}
	refusedOrPublished := old.Count("published index") + old.Count("REFUSED")
	// Freeze the new publisher too, so that the ConfigMap read below shows
	// the old one's write, not a newer index published after it.
	next.Pause()
	old.Resume()
	if err := waitEither(ctx, old, refusedOrPublished); err != nil {
		return err
	}
	story.KillAll(a, b)
	var cm corev1.ConfigMap
	if err := k.Get(ctx, client.ObjectKey{Namespace: story.Namespace, Name: indexName(fenced)}, &cm); err != nil {
		return err
	}
	newest := next.Max("published index v")
	now, _ := strconv.ParseInt(cm.Data["version"], 10, 64)
	story.Say("demo", "the index now: v%d by %s; the newest published: v%d by %s", now, cm.Data["publisher"], newest, next.Pod)
	anomaly := ""
	if now < newest {
		anomaly = fmt.Sprintf("the index went back in time: the frozen %s overwrote v%d with its old v%d", old.Pod, newest, now)
	}
	story.Verdict(mode, anomaly)
	return nil
}

// waitEither waits until the woken publisher's write landed or was refused.
func waitEither(ctx context.Context, a *story.Actor, before int) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if a.Count("published index")+a.Count("REFUSED") > before {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s neither published nor was refused after waking", a.Pod)
}
