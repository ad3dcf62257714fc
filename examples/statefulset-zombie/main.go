// Command statefulset-zombie is the story of a StatefulSet pod that was
// force-deleted while its node was only cut off (README.md). ledger-0 is
// the primary of a small ledger and keeps its head record in etcd. Its
// node stops answering; the operator force-deletes the pod, as the
// Kubernetes docs describe for a lost node, and the StatefulSet starts a
// new ledger-0 elsewhere, which takes over and writes the head. The old
// container was never stopped: it wakes and writes its last head over its
// successor's. With fencer, a WorkloadLease gives each ordinal a Lease: the
// new ledger-0 holds a greater token, and the old one's write is refused.
//
//	go run ./examples/statefulset-zombie demo   # make demo STORY=statefulset-zombie
package main

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/examples/internal/story"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// The StatefulSet's one member, and its Lease: the WorkloadLease names a
// StatefulSet member's Lease after its pod.
const member = "ledger-0"

func main() {
	story.Main("statefulset-zombie", map[string]story.Role{
		"demo":    {Run: func(ctx context.Context, _ []string) error { return demo(ctx) }},
		"primary": {Args: "plain|fenced [ENTRIES]", NArgs: 1, Run: func(ctx context.Context, args []string) error { return primary(ctx, args[0], args[1:]) }},
	})
}

// headKey is the ledger's head record, below the namespace's data prefix.
func headKey(prefix string) string {
	return path.Join(etcdkeys.DataPrefix(etcdkeys.OrDefault(prefix), story.Namespace), "ledger", "head")
}

// primary is ledger-0's program: it appends to the ledger and moves its
// head, once a second (ENTRIES times, then it only serves). Plain, it puts
// the head; fenced, it writes it in a transaction that holds only under
// its token, which it reads as the token of this pod (its UID), never of
// a successor: when it starts, and after a refusal only once this pod
// holds a greater one.
func primary(ctx context.Context, mode string, entries []string) error {
	limit := -1
	if len(entries) > 0 {
		n, err := strconv.Atoi(entries[0])
		if err != nil || n < 1 {
			return fmt.Errorf("ENTRIES is a count of entries to write, not %q", entries[0])
		}
		limit = n
	}
	env, err := story.Connect(ctx)
	if err != nil {
		return err
	}
	me, key := story.Pod(), headKey(env.Prefix)
	uid, err := story.PodUID()
	if err != nil {
		return err
	}
	who := fmt.Sprintf("%s (uid %.8s)", me, uid)
	write := func(ctx context.Context, value string) error {
		_, err := env.Etcd.Put(ctx, key, value)
		return err
	}
	var tok fence.Token
	if mode == "fenced" {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		tok, err = story.WaitToken(wctx, env.K8s, member)
		cancel()
		if err != nil {
			return fmt.Errorf("%s did not hold Lease %s within 60 s (kubectl get flease %s): %w", me, member, member, err)
		}
		story.Say(who, "holds Lease %s, token %d", member, tok.Value)
		write = func(ctx context.Context, value string) error {
			_, err := fence.NewTxn(env.Etcd, env.Prefix, story.Namespace, tok).Then(clientv3.OpPut(key, value)).Commit(ctx)
			return err
		}
	}
	for written := 0; written != limit; written++ {
		// A new tenure starts from the head as etcd has it now: nothing
		// computed under an older token is carried over.
		head, err := readHead(ctx, env.Etcd, key)
		if err != nil {
			return err
		}
		var n int
		_, _ = fmt.Sscanf(head, "entry %d", &n)
		n++
		story.Say(who, "about to write head: entry %d", n)
		time.Sleep(time.Second) // appending the entry
		err = write(ctx, fmt.Sprintf("entry %d by %s", n, who))
		var fenced *fence.FencedError
		switch {
		case errors.As(err, &fenced):
			story.Say(who, "head write REFUSED: %v", err)
			// This pod may hold the Lease again, under a greater token:
			// a member that was NotReady past its TTL is granted anew
			// once Ready. A pod replaced under its name never is: its
			// UID is not its successor's, so it never reads the
			// successor's token.
			if tok, err = newerToken(ctx, env.K8s, tok); err != nil {
				return nil // ctx ended: the pod is stopping
			}
			story.Say(who, "holds Lease %s again, token %d", member, tok.Value)
			written--
			continue
		case err != nil:
			return err
		}
		story.Say(who, "wrote head: entry %d", n)
	}
	story.Say(who, "serving reads")
	<-ctx.Done()
	return nil
}

// newerToken waits until this pod holds the member's Lease under a token
// greater than old, until ctx ends.
func newerToken(ctx context.Context, k client.Client, old fence.Token) (fence.Token, error) {
	for {
		t, err := story.WaitToken(ctx, k, member)
		if err != nil || t.Value > old.Value {
			return t, err
		}
		select {
		case <-ctx.Done():
			return fence.Token{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func readHead(ctx context.Context, etcd *clientv3.Client, key string) (string, error) {
	resp, err := etcd.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return "", err
	}
	return string(resp.Kvs[0].Value), nil
}

func demo(ctx context.Context) error {
	k, err := story.Setup(ctx, "statefulset-zombie")
	if err != nil {
		return err
	}
	etcd, prefix, err := story.Etcd(ctx, k)
	if err != nil {
		return err
	}
	if story.OnRealNode() {
		// Every node schedulable again at the end, whatever happened.
		defer func() { _ = schedule(ctx, k, false); _ = story.Cordon(ctx, k, story.RealNode, false) }()
	}
	for _, mode := range []struct{ role, title string }{
		{"plain", "without fencer: ledger-0 writes the head with a plain put"},
		{"fenced", "with fencer: WorkloadLease ledger, Lease ledger-0"},
	} {
		story.Section(mode.title)
		if err := play(ctx, k, etcd, headKey(prefix), mode.role); err != nil {
			return err
		}
	}
	return nil
}

// play runs ledger-0, cuts it off in the middle of a write, force-deletes
// its pod, lets its replacement write, and wakes the old one.
func play(ctx context.Context, k client.Client, etcd *clientv3.Client, key, mode string) error {
	if _, err := etcd.Delete(ctx, key); err != nil {
		return err
	}
	old, zombie, err := startMember(ctx, k, mode)
	if err != nil {
		return err
	}
	defer zombie.Kill()
	if err := zombie.WaitForCount(ctx, "about to write head: entry 2", 1, 60*time.Second); err != nil {
		return err
	}
	zombie.Pause()
	if story.OnRealNode() {
		// The node itself stops answering, and its pods go elsewhere.
		resume, err := story.FreezeKubelet()
		if err != nil {
			return err
		}
		defer resume()
		if err := schedule(ctx, k, false); err != nil {
			return err
		}
	}
	if !story.OnRealNode() {
		story.Say("demo", "%s's node stops answering (here: its process stays frozen)", member)
	}
	story.Say("demo", "the operator force-deletes %s, as for a lost node", member)
	if err := k.Delete(ctx, old, client.GracePeriodSeconds(0)); err != nil {
		return err
	}
	next, err := readyMember(ctx, k, old.UID)
	if err != nil {
		return err
	}
	story.Say("demo", "the StatefulSet started a new %s (uid %.8s) on %s", member, next.UID, next.Spec.NodeName)
	// The new primary writes the next entry, then serves.
	successor, err := story.StartLocal("primary", member, mode, "1")
	if err != nil {
		return err
	}
	defer successor.Kill()
	if err := successor.WaitForCount(ctx, "serving reads", 1, 60*time.Second); err != nil {
		return err
	}
	zombie.Resume()
	for deadline := time.Now().Add(10 * time.Second); zombie.Count("wrote head") < 2 && !zombie.Printed("REFUSED"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the old %s neither wrote nor was refused within 10 s of waking", member)
		}
	}
	head, err := readHead(ctx, etcd, key)
	if err != nil {
		return err
	}
	story.Say("demo", "the ledger's head: %s", head)
	anomaly := ""
	if !strings.Contains(head, fmt.Sprintf("uid %.8s", next.UID)) {
		anomaly = fmt.Sprintf("the old %s's late write replaced its successor's head: the entry the new primary wrote is lost", member)
	}
	verdict := "without fencer"
	if mode == "fenced" {
		verdict = "with fencer"
	}
	story.Verdict(verdict, anomaly)
	return nil
}

// startMember starts ledger-0's program. On kwok it is a local process
// standing in for the pod. On the real node it is the pod itself: the
// StatefulSet's template is set to run the story's image, with the
// simulated nodes cordoned, and its new pod is followed through its log.
func startMember(ctx context.Context, k client.Client, mode string) (*corev1.Pod, *story.Actor, error) {
	if !story.OnRealNode() {
		p, err := readyMember(ctx, k, "")
		if err != nil {
			return nil, nil, err
		}
		a, err := story.Start("primary", member, mode)
		return p, a, err
	}
	if err := schedule(ctx, k, true); err != nil {
		return nil, nil, err
	}
	sts := &appsv1.StatefulSet{}
	if err := k.Get(ctx, client.ObjectKey{Namespace: story.Namespace, Name: "ledger"}, sts); err != nil {
		return nil, nil, err
	}
	patch := client.MergeFrom(sts.DeepCopy())
	spec := story.ActorPodSpec("primary", mode)
	sts.Spec.Template.Spec.Containers, sts.Spec.Template.Spec.Volumes = spec.Containers, spec.Volumes
	sts.Spec.Template.Labels[story.EtcdClientLabel] = "true"
	if err := k.Patch(ctx, sts, patch); err != nil {
		return nil, nil, err
	}
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		p := &corev1.Pod{}
		err := k.Get(ctx, client.ObjectKey{Namespace: story.Namespace, Name: member}, p)
		if err == nil && live(p) && p.Spec.NodeName == story.RealNode && p.Spec.Containers[0].Image == spec.Containers[0].Image &&
			strings.Join(p.Spec.Containers[0].Args, " ") == strings.Join(spec.Containers[0].Args, " ") {
			story.Say("demo", "%s (uid %.8s) runs on %s", member, p.UID, p.Spec.NodeName)
			a, err := story.Attach(ctx, p)
			return p, a, err
		}
	}
	return nil, nil, fmt.Errorf("%s did not run the story on %s within 90 s", member, story.RealNode)
}

// schedule sends new pods to the real node (onReal) or to the simulated
// ones, by cordoning the others.
func schedule(ctx context.Context, k client.Client, onReal bool) error {
	simulated, err := story.SimulatedNodes(ctx, k)
	if err != nil {
		return err
	}
	for _, n := range simulated {
		if err := story.Cordon(ctx, k, n, onReal); err != nil {
			return err
		}
	}
	return story.Cordon(ctx, k, story.RealNode, !onReal)
}

// live is a Ready pod not being deleted.
func live(p *corev1.Pod) bool { return p.DeletionTimestamp == nil && story.PodReady(p) }

// readyMember waits for the StatefulSet's pod, other than the one with
// UID not, to be Ready, and returns it.
func readyMember(ctx context.Context, k client.Client, not types.UID) (*corev1.Pod, error) {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		p := &corev1.Pod{}
		if err := k.Get(ctx, client.ObjectKey{Namespace: story.Namespace, Name: member}, p); err == nil && p.UID != not && live(p) {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no Ready pod %s within 60 s: is `make dev` running?", member)
}
