package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// There are no workload controllers in envtest: the tests create the
// StatefulSets, Jobs and CronJobs, and play their part by creating the
// pods, labelled as those controllers label them.

func statefulSet(ns, name string, replicas int32) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}},
		},
	}
}

func workloadLease(ns, name string, kind fencerv1.WorkloadKind, workload string, renewal fencerv1.RenewalMode) *fencerv1.WorkloadLease {
	return &fencerv1.WorkloadLease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: kind, Name: workload},
			TTLSeconds: 2, Renewal: renewal},
	}
}

// memberPod creates a Ready pod with labels, as a workload controller
// would, optionally with a finalizer that keeps it terminating once
// deleted.
func memberPod(t *testing.T, ns, name string, labels map[string]string, finalizer bool) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if finalizer {
		pod.Finalizers = []string{"test.fencer.io/keep"}
	}
	create(t, pod)
	fx.SetReady(t, pod, true)
	return pod
}

// indexedJobMembers creates Indexed Job ns/shard of n completions and its
// WorkloadLease (PodReady), waits for the member Leases shard-0..n-1, and
// returns the labels the Job controller puts on index 0's pods.
func indexedJobMembers(t *testing.T, ns string, n int32) map[string]string {
	t.Helper()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "shard", Namespace: ns},
		Spec: batchv1.JobSpec{Completions: ptr.To(n), Parallelism: ptr.To(n), CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}},
	}
	create(t, job)
	wl := workloadLease(ns, "shard", fencerv1.WorkloadJob, "shard", fencerv1.RenewalPodReady)
	create(t, wl)
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("shard-%d", i))
	}
	memberLeases(t, ns, wl, names...)
	return map[string]string{"batch.kubernetes.io/job-name": job.Name, "batch.kubernetes.io/controller-uid": string(job.UID), "batch.kubernetes.io/job-completion-index": "0"}
}

// editIsSetBack edits member Lease ns/name's TTL, a field its
// WorkloadLease owns (2 s here), and waits until it is set back. The
// controller may write the Lease meanwhile (its status, as its holder
// comes and goes): the edit retries on a conflict, as kubectl edit would.
func editIsSetBack(t *testing.T, ns, name string) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l := getLease(t, ns, name)
		l.Spec.TTLSeconds = 30
		return k8s.Update(context.Background(), l)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, name+"'s TTL set back to 2", func() error {
		if ttl := getLease(t, ns, name).Spec.TTLSeconds; ttl != 2 {
			return fmt.Errorf("ttlSeconds %d", ttl)
		}
		return nil
	})
}

// memberLeases waits until the WorkloadLease's Leases are exactly names,
// each controlled by it, and returns them.
func memberLeases(t *testing.T, ns string, wl *fencerv1.WorkloadLease, names ...string) map[string]*fencerv1.Lease {
	t.Helper()
	got := map[string]*fencerv1.Lease{}
	eventually(t, 30*time.Second, fmt.Sprintf("member Leases %v", names), func() error {
		var list fencerv1.LeaseList
		if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		got = map[string]*fencerv1.Lease{}
		for i := range list.Items {
			l := &list.Items[i]
			if metav1.IsControlledBy(l, wl) {
				got[l.Name] = l
			}
		}
		if len(got) != len(names) {
			return fmt.Errorf("have %d: %v", len(got), keys(got))
		}
		for _, n := range names {
			if got[n] == nil {
				return fmt.Errorf("no %s among %v", n, keys(got))
			}
		}
		return nil
	})
	return got
}

func keys(m map[string]*fencerv1.Lease) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func readyCondition(t *testing.T, ns, name string) *metav1.Condition {
	t.Helper()
	wl := &fencerv1.WorkloadLease{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, wl); err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(wl.Status.Conditions, fencerv1.ConditionReady)
}

// A StatefulSet's members: a Lease per ordinal, owned by the
// WorkloadLease, following scale up and down and a change of target; an
// edit of a member Lease is set back; a name taken by another Lease is
// reported, not overwritten.
func TestWorkloadLeaseFollowsTheStatefulSet(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	sts := statefulSet(ns, "web", 2)
	create(t, sts)
	wl := workloadLease(ns, "web", fencerv1.WorkloadStatefulSet, "web", fencerv1.RenewalPodReady)
	create(t, wl)
	ls := memberLeases(t, ns, wl, "web-0", "web-1")
	l0 := ls["web-0"]
	if !l0.Spec.SoleCandidate || l0.Spec.TTLSeconds != 2 || l0.Spec.HolderSelector.MatchLabels["statefulset.kubernetes.io/pod-name"] != "web-0" ||
		l0.Spec.HolderSelector.MatchLabels["app"] != "web" {
		t.Fatalf("member Lease web-0: %+v", l0.Spec)
	}
	if ref := metav1.GetControllerOf(l0); ref == nil || ref.Kind != "WorkloadLease" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
		t.Fatalf("web-0's controller reference %+v: want the WorkloadLease, blocking its deletion (garbage collection deletes the members with it)", ref)
	}

	// A hand-written Lease takes web-2's name before the scale-up.
	create(t, newLease(ns, "web-2", "other", 30))
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(sts), sts); err != nil {
		t.Fatal(err)
	}
	sts.Spec.Replicas = ptr.To[int32](3)
	if err := k8s.Update(ctx, sts); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Ready False, NameTaken", func() error {
		if c := readyCondition(t, ns, "web"); c == nil || c.Reason != fencerv1.ReasonNameTaken {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	if l := getLease(t, ns, "web-2"); metav1.GetControllerOf(l) != nil || l.Spec.HolderSelector.MatchLabels["app"] != "other" {
		t.Fatalf("the hand-written web-2 was changed: %+v", l)
	}

	// An edit of a field the WorkloadLease owns is set back.
	editIsSetBack(t, ns, "web-0")

	// The hand-written web-2 deleted, the member gets its own.
	if err := k8s.Delete(ctx, getLease(t, ns, "web-2")); err != nil {
		t.Fatal(err)
	}
	memberLeases(t, ns, wl, "web-0", "web-1", "web-2")
	eventually(t, 30*time.Second, "Ready True once the name is free", func() error {
		if c := readyCondition(t, ns, "web"); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})

	// A member Lease's label removed (by anyone who may edit Leases): the
	// WorkloadLease still finds it by its controller reference, and puts
	// the label back.
	// The controller writes the new member's status meanwhile: retry on
	// a conflict, as kubectl edit would.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l2 := getLease(t, ns, "web-2")
		delete(l2.Labels, "fencer.io/workloadlease")
		return k8s.Update(ctx, l2)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "web-2's label put back", func() error {
		if v := getLease(t, ns, "web-2").Labels["fencer.io/workloadlease"]; v != "web" {
			return fmt.Errorf("label %q", v)
		}
		return nil
	})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l2 := getLease(t, ns, "web-2")
		delete(l2.Labels, "fencer.io/workloadlease")
		return k8s.Update(ctx, l2)
	}); err != nil {
		t.Fatal(err)
	}

	// Scale down: the Leases of ordinals 1 and 2 go, web-2's whatever its label.
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(sts), sts); err != nil {
		t.Fatal(err)
	}
	sts.Spec.Replicas = ptr.To[int32](1)
	if err := k8s.Update(ctx, sts); err != nil {
		t.Fatal(err)
	}
	memberLeases(t, ns, wl, "web-0")

	// Another target: web's member Leases go, db's come.
	create(t, statefulSet(ns, "db", 1))
	// The controller writes the WorkloadLease's status meanwhile.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(wl), wl); err != nil {
			return err
		}
		wl.Spec.Workload.Name = "db"
		return k8s.Update(ctx, wl)
	}); err != nil {
		t.Fatal(err)
	}
	memberLeases(t, ns, wl, "db-0")
	eventually(t, 30*time.Second, "Ready True", func() error {
		if c := readyCondition(t, ns, "web"); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
}

// A StatefulSet deleted with --cascade=orphan (the way to change its
// immutable fields) leaves its pods running, and its members keep their
// Leases. They still follow the WorkloadLease: spec.suspend set meanwhile
// suspends them, and an edit of a member's TTL is set back; the status's
// observedGeneration says so truly. Before, nothing reached the members
// until the StatefulSet was back, while observedGeneration claimed the
// new spec was in force.
func TestMembersFollowTheWorkloadLeaseWhileTheStatefulSetIsGone(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	sts, wl, first := heldWebMember(t, ns)
	selector := getLease(t, ns, "web-0").Spec.HolderSelector
	// envtest runs no garbage collector: the pod stays, as with an orphan
	// deletion.
	if err := k8s.Delete(ctx, sts); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Ready False, WorkloadNotFound", func() error {
		if c := readyCondition(t, ns, "web"); c == nil || c.Reason != fencerv1.ReasonWorkloadNotFound {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	if l := getLease(t, ns, "web-0"); l.Status.Holder != first.Holder {
		t.Fatalf("web-0 lost its holder with the StatefulSet: %+v", l.Status)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(wl), wl); err != nil {
			return err
		}
		wl.Spec.Suspend = true
		return k8s.Update(ctx, wl)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "web-0 suspended, its tenure ended", func() error {
		l := getLease(t, ns, "web-0")
		if !l.Spec.Suspend || l.Status.Holder != "" {
			return fmt.Errorf("suspend %v, holder %q", l.Spec.Suspend, l.Status.Holder)
		}
		return nil
	})
	if l := getLease(t, ns, "web-0"); !equality.Semantic.DeepEqual(l.Spec.HolderSelector, selector) {
		t.Fatalf("web-0's selector changed to %+v while the StatefulSet was away; want it kept, %+v", l.Spec.HolderSelector, selector)
	}
	editIsSetBack(t, ns, "web-0")
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(wl), wl); err != nil {
		t.Fatal(err)
	}
	if wl.Status.ObservedGeneration != wl.Generation || wl.Status.Held != 0 {
		t.Fatalf("status %+v at generation %d", wl.Status, wl.Generation)
	}
}

// The replacement of a zombie StatefulSet pod: the old pod object is
// force-deleted and a pod of the same name and a new UID replaces it. The
// token moves to the replacement, strictly greater, under both renewal
// modes (under Direct the old holder keeps renewing, as a zombie would).
func TestStatefulSetReplacementGetsAGreaterToken(t *testing.T) {
	for _, renewal := range []fencerv1.RenewalMode{fencerv1.RenewalPodReady, fencerv1.RenewalDirect} {
		t.Run(string(renewal), func(t *testing.T) {
			startController(t, "c1")
			ns := namespace(t)
			create(t, statefulSet(ns, "web", 1))
			wl := workloadLease(ns, "web", fencerv1.WorkloadStatefulSet, "web", renewal)
			create(t, wl)
			memberLeases(t, ns, wl, "web-0")
			labels := map[string]string{"app": "web", "statefulset.kubernetes.io/pod-name": "web-0"}
			old := memberPod(t, ns, "web-0", labels, false)
			first := heldBy(t, ns, "web-0")
			if first.HolderUID != old.UID {
				t.Fatalf("held by %s (%s), want the pod %s", first.Holder, first.HolderUID, old.UID)
			}
			if renewal == fencerv1.RenewalDirect {
				holdAsHolder(t, ns, "web-0", first) // the zombie keeps renewing
			}
			if err := k8s.Delete(context.Background(), old, client.GracePeriodSeconds(0)); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the old pod object gone", func() error {
				err := k8s.Get(context.Background(), client.ObjectKeyFromObject(old), &corev1.Pod{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return fmt.Errorf("still there (%w)", err)
			})
			repl := memberPod(t, ns, "web-0", labels, false)
			var second fencerv1.LeaseStatus
			eventually(t, 60*time.Second, "the replacement holds web-0", func() error {
				second = getLease(t, ns, "web-0").Status
				if second.HolderUID != repl.UID {
					return fmt.Errorf("held by %q", second.HolderUID)
				}
				return nil
			})
			if second.Token <= first.Token {
				t.Fatalf("replacement's token %d, not above the zombie's %d", second.Token, first.Token)
			}
		})
	}
}

// An Indexed Job's pod replaced while the old one is still terminating
// (podReplacementPolicy TerminatingOrFailed): the replacement gets the
// index's Lease only once the old pod object is gone.
func TestJobReplacementWaitsForTheTerminatingPod(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	labels := indexedJobMembers(t, ns, 2)
	old := memberPod(t, ns, "shard-0-a", labels, true)
	first := heldBy(t, ns, "shard-0")
	if err := k8s.Delete(ctx, old); err != nil { // terminating, kept by its finalizer
		t.Fatal(err)
	}
	repl := memberPod(t, ns, "shard-0-b", labels, false)
	eventually(t, 30*time.Second, "shard-0 waiting for the terminating pod", func() error {
		l := getLease(t, ns, "shard-0")
		c := meta.FindStatusCondition(l.Status.Conditions, fencerv1.ConditionHeld)
		if c == nil || c.Reason != fencerv1.ReasonOtherPodsRemain {
			return fmt.Errorf("Held %+v", c)
		}
		return nil
	})
	time.Sleep(3 * time.Second) // two TTLs: still not granted
	if l := getLease(t, ns, "shard-0"); l.Status.Holder != "" {
		t.Fatalf("shard-0 granted to %s while the old pod terminates", l.Status.Holder)
	}
	// The controller may patch the pod's annotations meanwhile.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(old), old); err != nil {
			return err
		}
		old.Finalizers = nil
		return k8s.Update(ctx, old)
	}); err != nil {
		t.Fatal(err)
	}
	second := heldBy(t, ns, "shard-0", first.Holder)
	if second.HolderUID != repl.UID || second.Token <= first.Token {
		t.Fatalf("second tenure %+v: want the replacement %s with a token above %d", second, repl.UID, first.Token)
	}
}

// A pod marked Failed while its Ready condition still says True, as the
// pod garbage collector marks the pods of an out-of-service node (a status
// patch of the phase alone) before it force-deletes them, has finished: it
// counts as gone, so its tenure ends at once and the Job's replacement is
// granted, with a greater token. Before, a PodReady holder in that state
// kept renewing, since it still looked Ready, and the replacement was never
// granted; with no holder, the older, Failed pod was picked over it.
func TestJobReplacementOfAFailedPodStillReady(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	labels := indexedJobMembers(t, ns, 1)
	old := memberPod(t, ns, "shard-0-a", labels, false)
	first := heldBy(t, ns, "shard-0")
	if first.HolderUID != old.UID {
		t.Fatalf("first tenure %+v, want the first pod's", first)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(old), old); err != nil {
			return err
		}
		old.Status.Phase = corev1.PodFailed // the Ready condition left True
		return k8s.Status().Update(ctx, old)
	}); err != nil {
		t.Fatal(err)
	}
	repl := memberPod(t, ns, "shard-0-b", labels, false)
	second := heldBy(t, ns, "shard-0", first.Holder)
	if second.HolderUID != repl.UID || second.Token <= first.Token {
		t.Fatalf("second tenure %+v: want the replacement %s with a token above %d", second, repl.UID, first.Token)
	}
	l := getLease(t, ns, "shard-0")
	found := false
	for _, h := range l.Status.History {
		if h.Token == first.Token {
			found = true
			if h.EndReason != fencerv1.TenureHolderGone {
				t.Fatalf("the Failed pod's tenure ended %q, want %q", h.EndReason, fencerv1.TenureHolderGone)
			}
		}
	}
	if !found {
		t.Fatalf("no tenure of token %d in the history %+v", first.Token, l.Status.History)
	}
}

// A CronJob's newer run takes its Lease over from an older run still
// running: the older run's pod leaves the selector and loses the tenure.
func TestCronJobNewerRunTakesOver(t *testing.T) {
	stop := startController(t, "c1")
	ns := namespace(t)
	cj := leasedCronJob(t, ns, "nightly")
	run := func(n int) *corev1.Pod {
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "nightly-" + strconv.Itoa(n), Namespace: ns,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "CronJob", Name: cj.Name, UID: cj.UID, Controller: ptr.To(true)}}},
			Spec: cj.Spec.JobTemplate.Spec,
		}
		create(t, job)
		return runPod(t, ns, job.Name+"-pod", job.Name, job.UID)
	}
	p1 := run(1)
	first := heldBy(t, ns, "nightly")
	if first.HolderUID != p1.UID {
		t.Fatalf("held by %s, want the first run's pod", first.Holder)
	}
	time.Sleep(1100 * time.Millisecond) // a later creationTimestamp (seconds)
	p2 := run(2)
	second := heldBy(t, ns, "nightly", p1.Name)
	if second.HolderUID != p2.UID || second.Token <= first.Token {
		t.Fatalf("second tenure %+v: want the newer run's pod with a token above %d", second, first.Token)
	}
	if r := second.History[1].EndReason; r != fencerv1.TenureHolderNotSelected {
		t.Fatalf("the older run's tenure ended %s, want HolderNotSelected", r)
	}
	// From then on the older run's writes are refused, and the newer's pass.
	olderRefused(t, ns, "nightly", first.Token, second.Token)
	// The newer run's Job deleted (a history limit, a user) while its pod
	// still runs: the Lease stays with it, never back to the older run.
	// Background propagation, as kubectl deletes: a Job's API default is
	// orphan, which leaves it Terminating until the garbage collector
	// (not running here) removes its finalizer, and the Job still listed.
	if err := k8s.Delete(context.Background(), &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nightly-2", Namespace: ns}},
		client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "Job nightly-2 gone", func() error {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "nightly-2"}, &batchv1.Job{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("get: %w", err)
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	if st := getLease(t, ns, "nightly").Status; st.HolderUID != p2.UID || st.Token != second.Token {
		t.Fatalf("after the newer run's Job was deleted: held by %s under %d, want the newer run's pod under %d", st.Holder, st.Token, second.Token)
	}
	// A Lease editor who records a run of its own making (the annotations
	// an earlier version kept: a run order a minute from now, past every
	// run, and a Job UID) and makes a pod that claims to be that run's
	// cannot point the Lease at it: the run that stays is the one the
	// manager selected, never one read from the Lease.
	editMember(t, ns, "nightly", func(l *fencerv1.Lease) {
		l.Annotations["fencer.io/workloadlease-run"] = fmt.Sprintf("%020d/zzz", time.Now().Unix()+60)
		l.Annotations["fencer.io/workloadlease-run-uid"] = "forged-run"
	})
	forger := runPod(t, ns, "forged-run-pod", "forged", "forged-run")
	time.Sleep(3 * time.Second)
	if l := getLease(t, ns, "nightly"); l.Status.HolderUID != p2.UID || l.Status.Token != second.Token ||
		l.Spec.HolderSelector.MatchLabels["batch.kubernetes.io/controller-uid"] != p2.Labels["batch.kubernetes.io/controller-uid"] {
		t.Fatalf("after a forged run: held by %s under %d, selector %v; want the deleted run's pod under %d (the forger's pod is %s)",
			l.Status.Holder, l.Status.Token, l.Spec.HolderSelector.MatchLabels, second.Token, forger.Name)
	}
	// The WorkloadLease's status records the run, so a manager that
	// replaces this one keeps the Lease with it too: it sets the edit
	// below back to the deleted run's pods, not to the older run's, which
	// still runs.
	wl := &fencerv1.WorkloadLease{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "nightly"}, wl); err != nil {
		t.Fatal(err)
	}
	if rec := wl.Status.CronJobRun; rec == nil || string(rec.JobUID) != p2.Labels["batch.kubernetes.io/controller-uid"] || !strings.HasSuffix(rec.Order, "/nightly-2") || rec.CronJobUID != cj.UID {
		t.Fatalf("status.cronJobRun %+v, want the run of Job nightly-2 of CronJob %s", rec, cj.UID)
	}
	stop()
	startController(t, "c2")
	// While it stays, an edit of its selector is set back, as at any time.
	editMember(t, ns, "nightly", func(l *fencerv1.Lease) {
		l.Spec.HolderSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "edited"}}
	})
	eventually(t, 30*time.Second, "the edited selector set back to the deleted run's pods", func() error {
		l := getLease(t, ns, "nightly")
		if got := l.Spec.HolderSelector.MatchLabels; len(got) != 1 || got["batch.kubernetes.io/controller-uid"] != string(p2.Labels["batch.kubernetes.io/controller-uid"]) {
			return fmt.Errorf("selector %v", got)
		}
		if l.Status.HolderUID != p2.UID {
			return fmt.Errorf("held by %q", l.Status.Holder)
		}
		return nil
	})
	// A newer run still takes over.
	time.Sleep(1100 * time.Millisecond)
	p3 := run(3)
	third := heldBy(t, ns, "nightly", p2.Name)
	if third.HolderUID != p3.UID {
		t.Fatalf("after a forged run and a new run: held by %s, want the new run's pod %s", third.Holder, p3.Name)
	}
}

// A Job that claims, in the CronJob controller's annotation, to be
// scheduled far in the future (anyone who may create Jobs can write it)
// is ordered by its creation: once it is deleted, the next run created
// takes the Lease over, where ordering by the claim kept the Lease on the
// deleted Job, for any pod labelled as its own, until a restart.
func TestCronJobRunClaimingAFutureScheduleDoesNotStick(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	cj := leasedCronJob(t, ns, "hourly")
	job := func(name string, scheduled time.Time) *batchv1.Job {
		j := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				Annotations:     map[string]string{"batch.kubernetes.io/cronjob-scheduled-timestamp": scheduled.UTC().Format(time.RFC3339)},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "CronJob", Name: cj.Name, UID: cj.UID, Controller: ptr.To(true)}}},
			Spec: cj.Spec.JobTemplate.Spec,
		}
		create(t, j)
		return j
	}
	selects := func(uid types.UID) {
		t.Helper()
		eventually(t, 30*time.Second, "the Lease selecting Job "+string(uid), func() error {
			if got := getLease(t, ns, "hourly").Spec.HolderSelector.MatchLabels["batch.kubernetes.io/controller-uid"]; got != string(uid) {
				return fmt.Errorf("selects %q", got)
			}
			return nil
		})
	}
	j1 := job("hourly-1", time.Now().Add(-time.Second))
	runPod(t, ns, "hourly-1-pod", j1.Name, j1.UID)
	heldBy(t, ns, "hourly")
	time.Sleep(1100 * time.Millisecond) // a later creationTimestamp (seconds)
	claim := job("hourly-claim", time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC))
	selects(claim.UID) // created after hourly-1, it is the newest run
	if err := k8s.Delete(context.Background(), claim, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	j3 := job("hourly-3", time.Now())
	p3 := runPod(t, ns, "hourly-3-pod", j3.Name, j3.UID)
	selects(j3.UID)
	if st := heldBy(t, ns, "hourly", "hourly-1-pod"); st.HolderUID != p3.UID {
		t.Fatalf("held by %s, want the run created after the deleted claim, %s", st.Holder, p3.Name)
	}
}

// leasedCronJob creates CronJob ns/name and a WorkloadLease of it, and
// waits for its member Lease.
func leasedCronJob(t *testing.T, ns, name string) *batchv1.CronJob {
	t.Helper()
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}}}},
	}
	create(t, cj)
	wl := workloadLease(ns, name, fencerv1.WorkloadCronJob, name, fencerv1.RenewalPodReady)
	create(t, wl)
	memberLeases(t, ns, wl, name)
	return cj
}

// runPod makes a Ready pod of the Job named job with UID uid, labelled and
// controlled as the Job controller makes them.
func runPod(t *testing.T, ns, name, job string, uid types.UID) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:          map[string]string{"batch.kubernetes.io/controller-uid": string(uid), "batch.kubernetes.io/job-name": job},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job, UID: uid, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	create(t, pod)
	fx.SetReady(t, pod, true)
	return pod
}

// editMember changes member Lease ns/name with edit, as kubectl edit would.
func editMember(t *testing.T, ns, name string, edit func(*fencerv1.Lease)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l := getLease(t, ns, name)
		edit(l)
		return k8s.Update(context.Background(), l)
	}); err != nil {
		t.Fatal(err)
	}
}

// olderRefused writes a fenced etcd key under the older run's token, which
// must be refused, and under the newer run's, which must pass.
func olderRefused(t *testing.T, ns, lease string, older, newer int64) {
	t.Helper()
	cli, err := fx.ConnectEtcd()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	key := etcdkeys.DataPrefix(prefix, ns) + "report"
	write := func(tok int64) error {
		_, err := fence.NewTxn(cli, prefix, ns, fence.Token{Lease: lease, Value: tok}).
			Then(clientv3.OpPut(key, strconv.FormatInt(tok, 10))).Commit(context.Background())
		return err
	}
	var fenced *fence.FencedError
	if err := write(older); !errors.As(err, &fenced) || fenced.Current != newer {
		t.Fatalf("a write under the older run's token %d: %v, want it fenced off by the newer run's %d", older, err, newer)
	}
	if err := write(newer); err != nil {
		t.Fatalf("a write under the newer run's token %d: %v", newer, err)
	}
}

// An edit that drops a member Lease's controller reference along with its
// selector (kubectl replace -f of a manifest without ownerReferences) is
// set back too: the WorkloadLease adopts the Lease its label still names
// it on, the intruder's tenure ends and the member's pod is granted a
// greater token. A Lease of a member's name without the label stays
// someone else's (NameTaken).
func TestAMemberLeaseThatLostItsControllerIsAdopted(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	_, _, first := heldWebMember(t, ns)
	readyPod(t, ns, "intruder", "intruder")
	editMember(t, ns, "web-0", func(l *fencerv1.Lease) {
		l.OwnerReferences = nil
		l.Spec.HolderSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "intruder"}}
		l.Spec.SoleCandidate = false
	})
	eventually(t, 60*time.Second, "web-0 adopted again, selecting web-0 alone, and granted to it anew", func() error {
		l := getLease(t, ns, "web-0")
		if !metav1.IsControlledBy(l, getWorkloadLease(t, ns, "web")) || !l.Spec.SoleCandidate || l.Spec.HolderSelector.MatchLabels["statefulset.kubernetes.io/pod-name"] != "web-0" {
			return fmt.Errorf("controller %v, soleCandidate %v, selector %v", metav1.GetControllerOf(l), l.Spec.SoleCandidate, l.Spec.HolderSelector.MatchLabels)
		}
		if l.Status.Holder != "web-0" || l.Status.Token <= first.Token {
			return fmt.Errorf("held by %q with token %d (first grant %d)", l.Status.Holder, l.Status.Token, first.Token)
		}
		return nil
	})

	// Without the label, the Lease is not the WorkloadLease's to take.
	editMember(t, ns, "web-0", func(l *fencerv1.Lease) {
		l.OwnerReferences = nil
		delete(l.Labels, "fencer.io/workloadlease")
	})
	eventually(t, 30*time.Second, "the WorkloadLease Ready=False/NameTaken", func() error {
		if c := readyCondition(t, ns, "web"); c == nil || c.Reason != fencerv1.ReasonNameTaken {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	if l := getLease(t, ns, "web-0"); metav1.GetControllerOf(l) != nil {
		t.Fatalf("a Lease without the WorkloadLease's label was adopted: %v", metav1.GetControllerOf(l))
	}
}

func getWorkloadLease(t *testing.T, ns, name string) *fencerv1.WorkloadLease {
	t.Helper()
	wl := &fencerv1.WorkloadLease{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, wl); err != nil {
		t.Fatal(err)
	}
	return wl
}

// An Indexed Job with a manual selector: the apiserver labels its pods
// with nothing of its own (no batch.kubernetes.io/job-name), so its
// members select by the Job's selector and the completion index, and the
// index's pod is granted.
func TestAnIndexedJobWithAManualSelectorIsLeased(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	sel := map[string]string{"app": "manual"}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "manual", Namespace: ns}, Spec: batchv1.JobSpec{
		Completions: ptr.To[int32](2), Parallelism: ptr.To[int32](2), CompletionMode: ptr.To(batchv1.IndexedCompletion),
		ManualSelector: ptr.To(true), Selector: &metav1.LabelSelector{MatchLabels: sel},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}}}
	create(t, job)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		t.Fatal(err)
	}
	if _, ok := job.Spec.Template.Labels["batch.kubernetes.io/job-name"]; ok {
		t.Fatalf("the apiserver labelled a manual-selector Job's template: %v", job.Spec.Template.Labels)
	}
	wl := workloadLease(ns, "manual", fencerv1.WorkloadJob, "manual", fencerv1.RenewalPodReady)
	create(t, wl)
	memberLeases(t, ns, wl, "manual-0", "manual-1")
	// As the Job controller makes them: the template's labels and the index.
	memberPod(t, ns, "manual-0-x", map[string]string{"app": "manual", "batch.kubernetes.io/job-completion-index": "0"}, false)
	memberPod(t, ns, "manual-1-x", map[string]string{"app": "manual", "batch.kubernetes.io/job-completion-index": "1"}, false)
	for i, lease := range []string{"manual-0", "manual-1"} {
		if st := heldBy(t, ns, lease); st.Holder != fmt.Sprintf("manual-%d-x", i) {
			t.Fatalf("%s held by %s, want the pod of index %d", lease, st.Holder, i)
		}
	}
}

// A member Lease whose deletion waits on another finalizer (a tool's)
// after a scale-down is not the member's Lease when the StatefulSet scales
// up again: the WorkloadLease says so (Ready=False/MemberLeaseDeleting),
// the old Lease shows its grant released, and once it is gone the member
// gets a new Lease and a greater token.
func TestAMemberLeaseStuckInDeletionIsNotCountedAsLeased(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	sts, _, first := heldWebMember(t, ns)
	editMember(t, ns, "web-0", func(l *fencerv1.Lease) { l.Finalizers = append(l.Finalizers, "example.com/keep") })
	scale := func(n int32) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(sts), sts); err != nil {
				return err
			}
			sts.Spec.Replicas = ptr.To(n)
			return k8s.Update(ctx, sts)
		}); err != nil {
			t.Fatal(err)
		}
	}
	scale(0)
	eventually(t, 30*time.Second, "web-0 being deleted, its grant released", func() error {
		l := getLease(t, ns, "web-0")
		if l.DeletionTimestamp.IsZero() || l.Status.Holder != "" || l.Status.Token != 0 {
			return fmt.Errorf("deletionTimestamp %v, holder %q, token %d", l.DeletionTimestamp, l.Status.Holder, l.Status.Token)
		}
		return nil
	})
	scale(1)
	eventually(t, 30*time.Second, "the WorkloadLease Ready=False/MemberLeaseDeleting", func() error {
		if c := readyCondition(t, ns, "web"); c == nil || c.Reason != fencerv1.ReasonMemberLeaseDeleting || !strings.Contains(c.Message, "example.com/keep") {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	editMember(t, ns, "web-0", func(l *fencerv1.Lease) { l.Finalizers = nil })
	eventually(t, 60*time.Second, "a new web-0 held by web-0 with a greater token, and the WorkloadLease Ready", func() error {
		l := &fencerv1.Lease{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web-0"}, l); err != nil {
			return err // gone, not yet created again
		}
		if !l.DeletionTimestamp.IsZero() || l.Status.Holder != "web-0" || l.Status.Token <= first.Token {
			return fmt.Errorf("deletionTimestamp %v, holder %q, token %d (first %d)", l.DeletionTimestamp, l.Status.Holder, l.Status.Token, first.Token)
		}
		if c := readyCondition(t, ns, "web"); c == nil || c.Reason != fencerv1.ReasonMembersLeased {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
}

// heldWebMember creates StatefulSet web (1 replica), its WorkloadLease and
// the pod web-0, and returns them with member web-0's first grant.
func heldWebMember(t *testing.T, ns string) (*appsv1.StatefulSet, *fencerv1.WorkloadLease, fencerv1.LeaseStatus) {
	t.Helper()
	sts := statefulSet(ns, "web", 1)
	create(t, sts)
	wl := workloadLease(ns, "web", fencerv1.WorkloadStatefulSet, "web", fencerv1.RenewalPodReady)
	create(t, wl)
	memberLeases(t, ns, wl, "web-0")
	memberPod(t, ns, "web-0", map[string]string{"app": "web", "statefulset.kubernetes.io/pod-name": "web-0"}, false)
	return sts, wl, heldBy(t, ns, "web-0")
}
