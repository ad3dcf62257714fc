// Command attempt-ids is the story of attempt IDs that are not fencing
// tokens (README.md). A task system stamps each attempt of task 42 with a
// random attempt ID and accepts a result only if the ID is still the
// task's current one. The check is a read, and the write comes later: an
// attempt frozen between the two writes its result over the newer
// attempt's. With a fencer Lease, each attempt is a tenure and its token is
// checked by the webhook in the same step as the write.
//
//	go run ./examples/attempt-ids demo      # make demo STORY=attempt-ids
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/examples/internal/story"
	"github.com/fencer-io/fencer/pkg/fence"
)

const lease = "task-42"

func main() {
	story.Main("attempt-ids", map[string]story.Role{
		"demo":           {Run: func(ctx context.Context, _ []string) error { return demo(ctx) }},
		"attempt":        {Args: "ATTEMPT-ID", NArgs: 1, Run: func(ctx context.Context, args []string) error { return attempt(ctx, args[0]) }},
		"fenced-attempt": {Run: func(ctx context.Context, _ []string) error { return fencedAttempt(ctx) }},
	})
}

// attempt is the unfenced worker: check that its attempt ID is current,
// compute, write the result.
func attempt(ctx context.Context, id string) error {
	k, err := story.Kube()
	if err != nil {
		return err
	}
	me := story.Pod()
	var task corev1.ConfigMap
	if err := k.Get(ctx, key("task-42-unfenced"), &task); err != nil {
		return err
	}
	if task.Data["attempt"] != id {
		story.Say(me, "attempt %s is not current (%s): giving up", id, task.Data["attempt"])
		return nil
	}
	story.Say(me, "checked: attempt %s is the task's current attempt", id)
	time.Sleep(2 * time.Second) // computing
	// The write the check was for; nothing ties the two together.
	patch := fmt.Sprintf(`{"data":{"result":"computed by attempt %s"}}`, id)
	if err := k.Patch(ctx, &task, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		return err
	}
	story.Say(me, "wrote the result of attempt %s", id)
	return nil
}

// fencedAttempt is the fenced worker: its attempt is its tenure of the
// Lease, and the token goes with the write.
func fencedAttempt(ctx context.Context) error {
	env, err := story.Connect(ctx)
	if err != nil {
		return err
	}
	k, me := env.K8s, story.Pod()
	tok, _, err := story.Acquire(ctx, env, lease)
	if err != nil {
		return err
	}
	story.Say(me, "attempt with token %d started", tok.Value)
	time.Sleep(300 * time.Millisecond)
	story.Say(me, "checked: token %d holds the lease", tok.Value)
	time.Sleep(2 * time.Second) // computing
	if err := writeResult(ctx, fence.NewClient(k, tok), fmt.Sprintf("computed under token %d", tok.Value)); err != nil {
		story.Say(me, "result of token %d REFUSED: %v", tok.Value, err)
		return nil
	}
	story.Say(me, "wrote the result of token %d", tok.Value)
	<-ctx.Done()
	return nil
}

// writeResult writes the fenced task record, creating it on first use; the
// label fencer.io/lease puts every write to it under the Lease's token.
func writeResult(ctx context.Context, c *fence.Client, result string) error {
	task := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: story.Namespace, Name: "task-42", Labels: map[string]string{"fencer.io/lease": lease}}, Data: map[string]string{"result": result}}
	err := c.Create(ctx, task)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	patch := fmt.Sprintf(`{"data":{"result":%q}}`, result)
	return c.Patch(ctx, task, client.RawPatch("application/merge-patch+json", []byte(patch)))
}

func key(name string) client.ObjectKey {
	return client.ObjectKey{Namespace: story.Namespace, Name: name}
}

func demo(ctx context.Context) error {
	k, err := story.Setup(ctx, "attempt-ids", "attempt-0", "attempt-1")
	if err != nil {
		return err
	}
	if err := unfenced(ctx, k); err != nil {
		return err
	}
	return fenced(ctx, k)
}

// unfenced: the driver is the task system's scheduler. It assigns attempt
// IDs, and a new attempt when the first seems stuck.
func unfenced(ctx context.Context, k client.Client) error {
	story.Section("without fencer: attempt IDs, ConfigMap task-42-unfenced")
	first, second := newID(), newID()
	if err := setAttempt(ctx, k, first); err != nil {
		return err
	}
	story.Say("scheduler", "task 42: attempt %s on attempt-0", first)
	a, err := story.Start("attempt", "attempt-0", first)
	if err != nil {
		return err
	}
	defer story.KillAll(a)
	if err := a.WaitForCount(ctx, "checked", 1, 30*time.Second); err != nil {
		return err
	}
	a.Pause()
	time.Sleep(2 * time.Second)
	if err := setAttempt(ctx, k, second); err != nil {
		return err
	}
	story.Say("scheduler", "attempt %s timed out: task 42 gets attempt %s on attempt-1", first, second)
	b, err := story.Start("attempt", "attempt-1", second)
	if err != nil {
		return err
	}
	defer story.KillAll(b)
	if err := b.WaitForCount(ctx, "wrote the result", 1, 30*time.Second); err != nil {
		return err
	}
	a.Resume()
	if err := a.WaitForCount(ctx, "wrote the result", 1, 10*time.Second); err != nil {
		return err
	}
	var task corev1.ConfigMap
	if err := k.Get(ctx, key("task-42-unfenced"), &task); err != nil {
		return err
	}
	story.Say("demo", "task 42: attempt %s, result %q", task.Data["attempt"], task.Data["result"])
	anomaly := ""
	if task.Data["result"] != "computed by attempt "+task.Data["attempt"] {
		anomaly = fmt.Sprintf("the result of superseded attempt %s overwrote that of current attempt %s: it passed its check before the new attempt existed", first, second)
	}
	story.Verdict("without fencer", anomaly)
	return nil
}

func setAttempt(ctx context.Context, k client.Client, id string) error {
	task := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: story.Namespace, Name: "task-42-unfenced"}, Data: map[string]string{"attempt": id}}
	err := k.Create(ctx, &task)
	if apierrors.IsAlreadyExists(err) {
		patch := fmt.Sprintf(`{"data":{"attempt":%q,"result":null}}`, id)
		err = k.Patch(ctx, &task, client.RawPatch("application/merge-patch+json", []byte(patch)))
	}
	return err
}

func newID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// fenced: the Lease's controller is the scheduler; an attempt whose
// process stops renewing loses its tenure, and the next one begins.
func fenced(ctx context.Context, k client.Client) error {
	story.Section("with fencer: tenures of Lease task-42, ConfigMap task-42")
	a, err := story.Start("fenced-attempt", "attempt-0")
	if err != nil {
		return err
	}
	b, err := story.Start("fenced-attempt", "attempt-1")
	if err != nil {
		return err
	}
	defer story.KillAll(a, b)
	first, next, err := story.FirstTo(ctx, "checked", a, b)
	if err != nil {
		return err
	}
	first.Pause()
	if err := next.WaitForCount(ctx, "wrote the result", 1, 30*time.Second); err != nil {
		return err
	}
	first.Resume()
	if err := first.WaitForCount(ctx, "REFUSED", 1, 10*time.Second); err != nil && !first.Printed("wrote the result") {
		return err
	}
	var task corev1.ConfigMap
	if err := k.Get(ctx, key("task-42"), &task); err != nil {
		return err
	}
	story.Say("demo", "task 42: result %q; the live token is the later attempt's", task.Data["result"])
	anomaly := ""
	if first.Printed("wrote the result") {
		anomaly = fmt.Sprintf("the frozen %s's result landed", first.Pod)
	}
	story.Verdict("with fencer", anomaly)
	return nil
}
