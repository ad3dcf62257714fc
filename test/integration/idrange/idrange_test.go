// Package idrange tests the IDRange controller against a real kube-apiserver
// (envtest) and etcd: blocks are disjoint and never reissued, slots are
// unique and reused only after their lease expires.
package idrange

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/idgen"
	"github.com/fencer-io/fencer/test/support/framework"
)

var fx *framework.Fencer

func TestMain(m *testing.M) {
	var err error
	if fx, err = framework.StartFencer(false); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	fx.Stop()
	os.Exit(code)
}

func blocksRange(ns string, min, max, size int64) *fencerv1.IDRange {
	return &fencerv1.IDRange{
		ObjectMeta: metav1.ObjectMeta{Name: "ids", Namespace: ns},
		Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeBlocks, Min: min, Max: max, BlockSize: ptr.To(size),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}},
	}
}

func slotsRange(ns string, min, max int64, ttl int32) *fencerv1.IDRange {
	return &fencerv1.IDRange{
		ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: ns},
		Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeSlots, Min: min, Max: max, SlotTTLSeconds: ptr.To(ttl),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}},
	}
}

func pods(t *testing.T, ns string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		fx.ReadyPod(t, ns, fmt.Sprintf("w-%03d", i), "w", "")
	}
}

// annotations returns pod name -> value of idrange.fencer.io/<name>.
func annotations(t *testing.T, ns, name string) map[string]string {
	t.Helper()
	var list corev1.PodList
	if err := fx.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range list.Items {
		if v, ok := p.Annotations["idrange.fencer.io/"+name]; ok {
			out[p.Name] = v
		}
	}
	return out
}

type block struct {
	pod         string
	first, last int64
}

func parseBlocks(t *testing.T, ann map[string]string) []block {
	t.Helper()
	var bs []block
	for pod, v := range ann {
		var b block
		if _, err := fmt.Sscanf(v, "block=%d-%d", &b.first, &b.last); err != nil || b.first > b.last {
			t.Fatalf("pod %s: malformed block annotation %q", pod, v)
		}
		b.pod = pod
		bs = append(bs, b)
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].first < bs[j].first })
	return bs
}

// checkDisjoint fails unless blocks are disjoint and inside [min,max], and
// returns how many IDs they hold.
func checkDisjoint(t *testing.T, bs []block, min, max int64) int64 {
	t.Helper()
	var total int64
	for i, b := range bs {
		if b.first < min || b.last > max {
			t.Fatalf("block %d-%d of %s leaves [%d,%d]", b.first, b.last, b.pod, min, max)
		}
		if i > 0 && b.first <= bs[i-1].last {
			t.Fatalf("blocks overlap: %s %d-%d and %s %d-%d", bs[i-1].pod, bs[i-1].first, bs[i-1].last, b.pod, b.first, b.last)
		}
		total += b.last - b.first + 1
	}
	return total
}

func etcdNext(t *testing.T, ns, name string) int64 {
	t.Helper()
	resp, err := fx.EtcdCli.Get(context.Background(), etcdkeys.IDRangeNextKey(etcdkeys.DefaultPrefix, ns, name))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("next key: %v %v", resp, err)
	}
	n, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitBlocks waits until want pods carry a block of IDRange ns/ids.
func waitBlocks(t *testing.T, ns string, want int, timeout time.Duration) {
	t.Helper()
	framework.Eventually(t, timeout, fmt.Sprintf("%d blocks", want), func() error {
		if n := len(annotations(t, ns, "ids")); n != want {
			return fmt.Errorf("%d of %d pods annotated", n, want)
		}
		return nil
	})
}

func getRange(t *testing.T, ns, name string) *fencerv1.IDRange {
	t.Helper()
	r := &fencerv1.IDRange{}
	if err := fx.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestFiftyPodsGetDisjointBlocks(t *testing.T) {
	fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	pods(t, ns, 0, 50)
	if err := fx.Client.Create(context.Background(), blocksRange(ns, 1000, 1_000_000, 100)); err != nil {
		t.Fatal(err)
	}
	waitBlocks(t, ns, 50, 120*time.Second)
	bs := parseBlocks(t, annotations(t, ns, "ids"))
	total := checkDisjoint(t, bs, 1000, 1_000_000)
	if next := etcdNext(t, ns, "ids"); next != 1000+total {
		t.Fatalf("etcd next %d, but %d IDs were issued from 1000", next, total)
	}
	framework.Eventually(t, 30*time.Second, "status", func() error {
		st := getRange(t, ns, "ids").Status
		if st.Next != 1000+total || st.Remaining != 1_000_000-(1000+total)+1 || st.AllocatedBlocks != 50 {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
}

func TestExhaustion(t *testing.T) {
	fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	pods(t, ns, 0, 4)
	if err := fx.Client.Create(context.Background(), blocksRange(ns, 1, 25, 10)); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 60*time.Second, "exhausted", func() error {
		r := getRange(t, ns, "ids")
		c := meta.FindStatusCondition(r.Status.Conditions, fencerv1.ConditionExhausted)
		if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "waiting: w-003") {
			return fmt.Errorf("conditions %+v", r.Status.Conditions)
		}
		return nil
	})
	// The pods are annotated after the status is written.
	framework.Eventually(t, 30*time.Second, "the blocks on the pods", func() error {
		if got := fmt.Sprint(parseBlocks(t, annotations(t, ns, "ids"))); got != "[{w-000 1 10} {w-001 11 20} {w-002 21 25}]" {
			return fmt.Errorf("blocks %s: want 1-10, 11-20 and the short final block 21-25", got)
		}
		return nil
	})
	r := getRange(t, ns, "ids")
	if r.Status.Remaining != 0 || meta.FindStatusCondition(r.Status.Conditions, fencerv1.ConditionLow).Status != metav1.ConditionTrue {
		t.Fatalf("status %+v", r.Status)
	}
	// Growing max serves the waiting pod from where the range stopped.
	patch := client.MergeFrom(r.DeepCopy())
	r.Spec.Max = 40
	if err := fx.Client.Patch(context.Background(), r, patch); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 60*time.Second, "w-003 served after max grew", func() error {
		if v := annotations(t, ns, "ids")["w-003"]; v != "block=26-35" {
			return fmt.Errorf("w-003: %q", v)
		}
		return nil
	})
}

// TestRestartMidAllocation: a controller replaced while pods keep arriving
// never hands out an overlapping or reissued block.
func TestRestartMidAllocation(t *testing.T) {
	stop := fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	if err := fx.Client.Create(context.Background(), blocksRange(ns, 0, 1_000_000, 7)); err != nil {
		t.Fatal(err)
	}
	pods(t, ns, 0, 10)
	stop()
	pods(t, ns, 10, 20)
	fx.StartController(t, "c2")
	pods(t, ns, 20, 30)
	waitBlocks(t, ns, 30, 120*time.Second)
	bs := parseBlocks(t, annotations(t, ns, "ids"))
	total := checkDisjoint(t, bs, 0, 1_000_000)
	if next := etcdNext(t, ns, "ids"); next < total {
		t.Fatalf("etcd next %d below the %d IDs issued", next, total)
	}
}

func TestSlotsAreUniqueAndReusedOnlyAfterTTL(t *testing.T) {
	fx.StartController(t, "c1")
	ctx := context.Background()
	ns := fx.Namespace(t)
	pods(t, ns, 0, 4)
	if err := fx.Client.Create(ctx, slotsRange(ns, 0, 2, 3)); err != nil {
		t.Fatal(err)
	}
	var ann map[string]string
	framework.Eventually(t, 60*time.Second, "3 slots leased, the 4th pod waits", func() error {
		ann = annotations(t, ns, "workers")
		r := getRange(t, ns, "workers")
		c := meta.FindStatusCondition(r.Status.Conditions, fencerv1.ConditionExhausted)
		if len(ann) != 3 || c == nil || c.Status != metav1.ConditionTrue || r.Status.SlotsInUse != 3 {
			return fmt.Errorf("annotations %v, status %+v", ann, r.Status)
		}
		if !strings.Contains(c.Message, "all 3 slots are leased; waiting: w-003") {
			return fmt.Errorf("condition message %q", c.Message)
		}
		return nil
	})
	slots := map[int64]string{}
	var freed string
	var freedSlot, freedToken int64
	for pod, v := range ann {
		var n, tok int64
		if _, err := fmt.Sscanf(v, "slot=%d,token=%d", &n, &tok); err != nil {
			t.Fatalf("%s: %q", pod, v)
		}
		if other, dup := slots[n]; dup {
			t.Fatalf("slot %d held by %s and %s", n, other, pod)
		}
		slots[n] = pod
		freed, freedSlot, freedToken = pod, n, tok
	}

	deleted := time.Now()
	if err := fx.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: freed, Namespace: ns}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 60*time.Second, "w-003 gets the freed slot", func() error {
		v := annotations(t, ns, "workers")["w-003"]
		var n, tok int64
		if _, err := fmt.Sscanf(v, "slot=%d,token=%d", &n, &tok); err != nil {
			return fmt.Errorf("w-003: %q", v)
		}
		if n != freedSlot || tok <= freedToken {
			t.Fatalf("w-003 got slot %d token %d; want slot %d with a token above %d", n, tok, freedSlot, freedToken)
		}
		return nil
	})
	// A slot returns only after its etcd lease (3 s) expires; renewals
	// happen every TTL/3, so no earlier than 2 s after the deletion.
	if waited := time.Since(deleted); waited < 2*time.Second {
		t.Fatalf("slot reused %s after its pod was deleted, before its lease could expire", waited)
	}
}

// TestEtcdRestartMidAllocation: blocks claimed before and after an etcd
// restart never overlap; the next key survives the restart.
func TestEtcdRestartMidAllocation(t *testing.T) {
	fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	if err := fx.Client.Create(context.Background(), blocksRange(ns, 0, 1_000_000, 5)); err != nil {
		t.Fatal(err)
	}
	pods(t, ns, 0, 5)
	waitBlocks(t, ns, 5, 60*time.Second)
	if err := fx.Etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	pods(t, ns, 5, 10)
	if err := fx.Etcd.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	pods(t, ns, 10, 15)
	waitBlocks(t, ns, 15, 120*time.Second)
	checkDisjoint(t, parseBlocks(t, annotations(t, ns, "ids")), 0, 1_000_000)
}

// TestDeleteReleasesSlotsAndKeepsNext: deleting an IDRange revokes its slot
// leases at once; a Blocks range's next key stays, so a recreated range
// continues where it stopped, unless the opt-in annotation says otherwise.
func TestDeleteReleasesSlotsAndKeepsNext(t *testing.T) {
	fx.StartController(t, "c1")
	ctx := context.Background()
	ns := fx.Namespace(t)
	pods(t, ns, 0, 2)
	slots := slotsRange(ns, 0, 9, 60)
	blocks := blocksRange(ns, 1, 1000, 10)
	for _, o := range []client.Object{slots, blocks} {
		if err := fx.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	framework.Eventually(t, 60*time.Second, "slots and blocks issued", func() error {
		if a, b := len(annotations(t, ns, "workers")), len(annotations(t, ns, "ids")); a != 2 || b != 2 {
			return fmt.Errorf("%d slots, %d blocks", a, b)
		}
		return nil
	})
	for _, o := range []client.Object{slots, blocks} {
		if err := fx.Client.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	framework.Eventually(t, 30*time.Second, "slot keys gone at once", func() error {
		resp, err := fx.EtcdCli.Get(ctx, etcdkeys.IDRangeSlotsPrefix(etcdkeys.DefaultPrefix, ns, "workers"), clientv3.WithPrefix())
		if err != nil || resp.Count != 0 {
			return fmt.Errorf("%d slot keys left (%w)", resp.Count, err)
		}
		return nil
	})
	framework.Eventually(t, 30*time.Second, "both ranges gone", func() error {
		for _, o := range []client.Object{slots, blocks} {
			if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(o), &fencerv1.IDRange{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s: %w", o.GetName(), err)
			}
		}
		return nil
	})
	if next := etcdNext(t, ns, "ids"); next != 21 {
		t.Fatalf("next key after delete: %d, want 21 kept", next)
	}
	again := blocksRange(ns, 1, 1000, 10)
	if err := fx.Client.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 60*time.Second, "recreated range continues at 21", func() error {
		bs := parseBlocks(t, annotations(t, ns, "ids"))
		if len(bs) != 2 || bs[0].first < 21 {
			return fmt.Errorf("blocks %v", bs)
		}
		return nil
	})
}

// TestRepairAnnotationWithoutSlot: when a pod's slot vanishes from etcd
// behind the controller's back, the pod gets a new slot and a new token.
func TestRepairAnnotationWithoutSlot(t *testing.T) {
	fx.StartController(t, "c1")
	ctx := context.Background()
	ns := fx.Namespace(t)
	pods(t, ns, 0, 1)
	if err := fx.Client.Create(ctx, slotsRange(ns, 0, 9, 30)); err != nil {
		t.Fatal(err)
	}
	var before string
	framework.Eventually(t, 60*time.Second, "slot leased", func() error {
		before = annotations(t, ns, "workers")["w-000"]
		if before == "" {
			return fmt.Errorf("no slot yet")
		}
		return nil
	})
	resp, err := fx.EtcdCli.Get(ctx, etcdkeys.IDRangeSlotsPrefix(etcdkeys.DefaultPrefix, ns, "workers"), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("slot keys: %v %v", resp, err)
	}
	if _, err := fx.EtcdCli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 60*time.Second, "a new slot and token", func() error {
		after := annotations(t, ns, "workers")["w-000"]
		if after == "" || after == before {
			return fmt.Errorf("annotation %q (was %q)", after, before)
		}
		return nil
	})
}

// TestNextRegressionRefusesClaims: an etcd that comes back without the
// next-ID key (wiped here; an old snapshot is the same) would hand out the
// same blocks again. The controller refuses to claim, says why, and resumes
// once the operator has set the key to status.next.
func TestNextRegressionRefusesClaims(t *testing.T) {
	fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	if err := fx.Client.Create(context.Background(), blocksRange(ns, 0, 1_000_000, 10)); err != nil {
		t.Fatal(err)
	}
	pods(t, ns, 0, 3)
	framework.Eventually(t, 60*time.Second, "3 blocks in status", func() error {
		if st := getRange(t, ns, "ids").Status; st.Next != 30 {
			return fmt.Errorf("status.next %d, want 30", st.Next)
		}
		return nil
	})
	if err := fx.Etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := fx.Etcd.Wipe(); err != nil {
		t.Fatal(err)
	}
	if err := fx.Etcd.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	pods(t, ns, 3, 4)
	framework.Eventually(t, 60*time.Second, "NextRegressed", func() error {
		c := meta.FindStatusCondition(getRange(t, ns, "ids").Status.Conditions, fencerv1.ConditionReady)
		if c == nil || c.Reason != fencerv1.ReasonNextRegressed {
			return fmt.Errorf("Ready condition %+v", c)
		}
		return nil
	})
	if n := len(annotations(t, ns, "ids")); n != 3 {
		t.Fatalf("%d pods have blocks after the regression, want the 3 from before", n)
	}

	// The operator's repair: put the key back at status.next.
	if _, err := fx.EtcdCli.Put(context.Background(), etcdkeys.IDRangeNextKey(etcdkeys.DefaultPrefix, ns, "ids"), "30"); err != nil {
		t.Fatal(err)
	}
	waitBlocks(t, ns, 4, 60*time.Second)
	checkDisjoint(t, parseBlocks(t, annotations(t, ns, "ids")), 0, 1_000_000)
}

// TestRepairForgedAndCopiedBlock: a Blocks pod whose annotation is not a
// block the controller claimed for it could never consume it:
// idgen.ConsumeBlock refuses it. A pod created with one (its template
// copied from `kubectl get pod -o yaml` of another pod, or forged) gets a
// new block of its own; a pod whose own block is overwritten gets that
// block back, as often as it is overwritten, and no block is burned. The
// pods whose blocks are theirs are left alone.
func TestRepairForgedAndCopiedBlock(t *testing.T) {
	fx.StartController(t, "c1")
	ctx := context.Background()
	ns := fx.Namespace(t)
	pods(t, ns, 0, 2)
	if err := fx.Client.Create(ctx, blocksRange(ns, 1, 1_000_000, 10)); err != nil {
		t.Fatal(err)
	}
	waitBlocks(t, ns, 2, 60*time.Second)
	before := annotations(t, ns, "ids")
	key := fencerv1.IDRangeAnnotationPrefix + "ids"
	uid := func(pod string) types.UID {
		p := &corev1.Pod{}
		if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod}, p); err != nil {
			t.Fatal(err)
		}
		return p.UID
	}
	set := func(pod, value string) {
		p := &corev1.Pod{}
		if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod}, p); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(p.DeepCopy())
		p.Annotations[key] = value
		if value == "" {
			delete(p.Annotations, key)
		}
		if err := fx.Client.Patch(ctx, p, patch); err != nil {
			t.Fatal(err)
		}
	}
	// Created with a copied and a forged annotation.
	bad := map[string]string{"w-002": before["w-000"], "w-003": "block=2-999999"}
	for name, v := range bad {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "w"}, Annotations: map[string]string{key: v}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
		}
		if err := fx.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		fx.SetReady(t, pod, true)
	}
	for name, v := range bad {
		framework.Eventually(t, 60*time.Second, name+" given a block of its own", func() error {
			if now := annotations(t, ns, "ids")[name]; now == v {
				return fmt.Errorf("%s still carries %q", name, now)
			}
			return nil
		})
	}
	after := annotations(t, ns, "ids")
	for name := range bad {
		if _, err := idgen.ConsumeBlock(ctx, fx.EtcdCli, etcdkeys.DefaultPrefix, ns, "ids", after[name], uid(name)); err != nil {
			t.Fatalf("%s's new block %q: %v", name, after[name], err)
		}
	}
	for _, name := range []string{"w-000", "w-001"} {
		if after[name] != before[name] {
			t.Errorf("%s's own block changed from %q to %q", name, before[name], after[name])
		}
	}
	checkDisjoint(t, parseBlocks(t, after), 1, 1_000_000)
	// Overwritten twice (a tool keeping the pod's metadata in line with a
	// copied template), then removed: the pod gets its own block back each
	// time, and no block is burned.
	next := etcdNext(t, ns, "ids")
	for _, v := range []string{before["w-000"], before["w-000"], ""} { // "": removed
		set("w-001", v)
		framework.Eventually(t, 60*time.Second, "w-001's own block restored", func() error {
			if now := annotations(t, ns, "ids")["w-001"]; now != before["w-001"] {
				return fmt.Errorf("w-001 carries %q, want its block %q back", now, before["w-001"])
			}
			return nil
		})
	}
	if n := etcdNext(t, ns, "ids"); n != next {
		t.Errorf("restoring w-001's block moved next from %d to %d: a block was burned", next, n)
	}
}

// TestFinishedPodGetsNoBlock: a pod that has finished (a Job's, Succeeded
// or Failed) issues no more IDs, so it gets no block: one given to it
// would be wasted, as Slots mode already knows. Pods are served in name
// order, and their annotations written in that order after the status, so
// once w-001 shows its block, a block for w-000 would show too.
func TestFinishedPodGetsNoBlock(t *testing.T) {
	fx.StartController(t, "c1")
	ctx := context.Background()
	ns := fx.Namespace(t)
	done := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "w-000", Namespace: ns, Labels: map[string]string{"app": "w"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if err := fx.Client.Create(ctx, done); err != nil {
		t.Fatal(err)
	}
	done.Status.Phase = corev1.PodSucceeded
	if err := fx.Client.Status().Update(ctx, done); err != nil {
		t.Fatal(err)
	}
	pods(t, ns, 1, 2)
	if err := fx.Client.Create(ctx, blocksRange(ns, 1, 1_000_000, 10)); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 60*time.Second, "w-001's block", func() error {
		if annotations(t, ns, "ids")["w-001"] == "" {
			return fmt.Errorf("no block yet")
		}
		return nil
	})
	if v := annotations(t, ns, "ids")["w-000"]; v != "" {
		t.Fatalf("the finished pod w-000 was given %q", v)
	}
}
