package idrange

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/framework"
)

// TestNoPodGetsABlockTheStatusDoesNotCover: blocks are annotated only after
// status.next, which the check for an etcd restored from an old snapshot
// reads, covers them. While the IDRange's status cannot be written, blocks
// are claimed in etcd but no pod carries one.
func TestNoPodGetsABlockTheStatusDoesNotCover(t *testing.T) {
	fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	pods(t, ns, 0, 3)
	probe := blocksRange(ns, 1, 1000, 10)
	probe.Name, probe.Spec.PodSelector.MatchLabels = "probe", map[string]string{"app": "nobody"}
	create(t, probe)
	lift := framework.RefuseUpdates(t, fx.Client, ns,
		admissionregistrationv1.Rule{APIGroups: []string{fencerv1.GroupVersion.Group}, APIVersions: []string{fencerv1.GroupVersion.Version}, Resources: []string{"idranges/status"}}, "false",
		func(ctx context.Context) error {
			r := getRange(t, ns, "probe")
			r.Status.ObservedGeneration = r.Generation + 100
			return fx.Client.Status().Update(ctx, r)
		})
	create(t, blocksRange(ns, 1000, 1_000_000, 100))
	framework.Eventually(t, 30*time.Second, "blocks claimed in etcd", func() error {
		if n := nextInEtcd(t, ns, "ids"); n <= 1000 {
			return fmt.Errorf("etcd next %d", n)
		}
		return nil
	})
	// The controller retries the status write meanwhile; annotating ahead
	// of the status would have given the pods blocks at once.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ann := annotations(t, ns, "ids"); len(ann) > 0 {
			t.Fatalf("pods carry blocks %v while status.next %d covers none", ann, getRange(t, ns, "ids").Status.Next)
		}
	}
	lift()
	waitBlocks(t, ns, 3, 60*time.Second)
	checkStatusCovers(t, ns)
}

// TestOnePodThatCannotBePatchedKeepsNoOtherFromItsBlock: a pod whose
// updates are refused (here by a policy; in a cluster, by any admission
// check) does not stop the pods after it from getting their blocks.
func TestOnePodThatCannotBePatchedKeepsNoOtherFromItsBlock(t *testing.T) {
	fx.StartController(t, "c1")
	ns := fx.Namespace(t)
	pods(t, ns, 0, 3)
	stuck := &corev1.Pod{}
	if err := fx.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "w-000"}, stuck); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(stuck.DeepCopy())
	stuck.Labels["stuck"] = "true"
	if err := fx.Client.Patch(context.Background(), stuck, patch); err != nil {
		t.Fatal(err)
	}
	framework.RefusePodUpdates(t, fx.Client, client.ObjectKeyFromObject(stuck), "!('stuck' in object.metadata.labels)")
	create(t, blocksRange(ns, 1000, 1_000_000, 100))
	framework.Eventually(t, 60*time.Second, "blocks for w-001 and w-002", func() error {
		ann := annotations(t, ns, "ids")
		if ann["w-001"] == "" || ann["w-002"] == "" {
			return fmt.Errorf("annotated: %v", ann)
		}
		return nil
	})
	if ann := annotations(t, ns, "ids"); ann["w-000"] != "" {
		t.Fatalf("w-000 carries %q though its updates are refused", ann["w-000"])
	}
	checkStatusCovers(t, ns)
	// w-000 is offered its one block again and again, not a new one each
	// time: a pod that cannot be patched must not drain the range.
	before := nextInEtcd(t, ns, "ids")
	time.Sleep(3 * time.Second)
	if after := nextInEtcd(t, ns, "ids"); after != before {
		t.Fatalf("etcd next went from %d to %d while w-000 could not be patched: blocks claimed for it and lost", before, after)
	}
	if n := getRange(t, ns, "ids").Status.AllocatedBlocks; n != 3 {
		t.Fatalf("allocatedBlocks %d, want 3: one each", n)
	}
}

// checkStatusCovers fails unless status.next lies above every block a pod
// carries.
func checkStatusCovers(t *testing.T, ns string) {
	t.Helper()
	bs := parseBlocks(t, annotations(t, ns, "ids"))
	checkDisjoint(t, bs, 1000, 1_000_000)
	next := getRange(t, ns, "ids").Status.Next
	for _, b := range bs {
		if b.last >= next {
			t.Fatalf("pod %s carries block %d-%d, but status.next is %d", b.pod, b.first, b.last, next)
		}
	}
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := fx.Client.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

// nextInEtcd is the next-ID key's value, 0 while it does not exist.
func nextInEtcd(t *testing.T, ns, name string) int64 {
	t.Helper()
	resp, err := fx.EtcdCli.Get(context.Background(), etcdkeys.IDRangeNextKey(etcdkeys.DefaultPrefix, ns, name))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	n, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
