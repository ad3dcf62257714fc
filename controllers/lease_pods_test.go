package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// The removals that go ahead of the status write take away only tokens
// etcd had released by the revision the pass read: a pass that read before
// a newer grant (a replica deposed without knowing it yet, a pass that
// found the key empty a moment before the new leader granted) must not
// strip the new holder's annotation, whatever grant it saw.
func TestRemoveReleasedSparesTokensGrantedAfterTheRead(t *testing.T) {
	store, live := liveGrantTo(t, "new-holder")
	g := &etcdstore.Grant{Token: live - 3, GrantValue: etcdstore.GrantValue{Holder: "kept-holder", HolderUID: "uid-kept-holder"}}
	tok := func(d int64) string { return strconv.FormatInt(live+d, 10) }
	checkPass(t, store, map[string]string{"ex-holder": tok(-4), "new-holder": tok(0), "copied": tok(-1), "kept-holder": tok(-3), "forged": "999999999"},
		map[string]string{"ex-holder": "", "copied": "", "new-holder": tok(0), "kept-holder": tok(-3), "forged": ""},
		func(r *LeaseReconciler, lease *fencerv1.Lease) error {
			return r.removeReleased(context.Background(), lease, nil, g, live-1)
		})
}

// A pass that cannot read etcd again cannot tell a later grant's token
// from a forged one: it leaves the token, says why, and runs again. A live
// holder's token is not taken away on an outage.
func TestAFailedReadSparesATokenAboveThePass(t *testing.T) {
	cli, store, _ := storeWithTerm(t)
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	g := &etcdstore.Grant{Token: 40, GrantValue: etcdstore.GrantValue{Holder: "holder", HolderUID: "uid-holder"}}
	for name, pass := range map[string]func(*LeaseReconciler, *fencerv1.Lease) error{
		"publish": func(r *LeaseReconciler, l *fencerv1.Lease) error {
			return r.publish(context.Background(), l, nil, g, 50)
		},
		"removeReleased": func(r *LeaseReconciler, l *fencerv1.Lease) error {
			return r.removeReleased(context.Background(), l, nil, g, 50)
		},
	} {
		t.Run(name, func(t *testing.T) {
			checkPass(t, store, map[string]string{"new-holder": "60", "ex-holder": "30"}, map[string]string{"new-holder": "60", "ex-holder": ""},
				func(r *LeaseReconciler, l *fencerv1.Lease) error {
					if err := pass(r, l); err == nil || !strings.Contains(err.Error(), "reading the grant again") {
						t.Errorf("%s with etcd unreadable: %v; want the failed read reported", name, err)
					}
					return nil
				})
		})
	}
}

// liveGrantTo grants the Lease ns/job to pod holder (UID uid-<holder>) in
// a real etcd, and returns the store and the grant's token.
func liveGrantTo(t *testing.T, holder string) (*etcdstore.Store, int64) {
	t.Helper()
	cli, store, _ := storeWithTerm(t)
	for i := 0; i < 10; i++ { // room for tokens below the grant's
		if _, err := cli.Put(context.Background(), "/elsewhere", "x"); err != nil {
			t.Fatal(err)
		}
	}
	g, err := store.GrantLease(context.Background(), "ns", "job", "", holder, "uid-"+holder, 30*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return store, g.Token
}

// A holder granted again (its grant expired while the manager was cut off
// from etcd, and it was still the pod to elect) must not keep its earlier,
// released token while the new grant's status write is refused: it would
// report a token it does not hold for as long as the refusal lasts.
func TestRemoveReleasedTakesAReleasedTokenFromTheNewHolderToo(t *testing.T) {
	g := &etcdstore.Grant{Token: 60, GrantValue: etcdstore.GrantValue{Holder: "w-0", HolderUID: "uid-w-0"}}
	checkRemoveReleased(t, g, 50, map[string]string{"w-0": "40"}, map[string]string{"w-0": ""})
}

// A pass whose copy of the holder predates its new token (the cache had
// not yet seen the patch that published it) must not remove that token:
// each removal holds only if the pod still carries what the copy shows.
func TestRemoveReleasedLeavesATokenItsCopyDidNotShow(t *testing.T) {
	g := &etcdstore.Grant{Token: 55, GrantValue: etcdstore.GrantValue{Holder: "w-0", HolderUID: "uid-w-0"}}
	checkStaleCopyRemovesNothing(t, "55", func(r *LeaseReconciler, lease *fencerv1.Lease, stale corev1.Pod) error {
		return r.removeReleased(context.Background(), lease, []corev1.Pod{stale}, g, 56)
	})
}

// checkStaleCopyRemovesNothing runs pass over a stale copy of pod w-0,
// which shows token 40 where the pod carries live: the pass must report
// the failed removal and leave live in place.
func checkStaleCopyRemovesNothing(t *testing.T, live string, pass func(*LeaseReconciler, *fencerv1.Lease, corev1.Pod) error) {
	t.Helper()
	const key = fencerv1.HolderTokenAnnotationPrefix + "job"
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w-0", Namespace: "ns", UID: "uid-w-0", Annotations: map[string]string{key: live}}}
	stale := pod.DeepCopy()
	stale.Annotations[key] = "40"
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pod).WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).
		WithInterceptorFuncs(interceptor.Funcs{Patch: patchAsTheAPIServer}).Build()
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ns"}}
	err := pass(&LeaseReconciler{Client: c}, lease, *stale)
	if !errors.Is(err, errPodCopyBehind) {
		t.Errorf("a removal whose copy was stale reported %v, not that the copy was behind (errPodCopyBehind)", err)
	}
	// The pass runs again soon, with no error for the workqueue's
	// backoff and the error log: the cache is a moment behind the
	// controller's own patches at every handover.
	if res, err := retryWhenPodCopyBehind(context.Background(), ctrl.Result{}, err); err != nil || res.RequeueAfter != staleRetry {
		t.Errorf("a stale copy's refused removal gave %+v, %v; want a retry in %v and no error", res, err, staleRetry)
	}
	var got corev1.Pod
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(pod), &got); err != nil {
		t.Fatal(err)
	}
	if got.Annotations[key] != live {
		t.Fatalf("a live token was removed on a stale copy: annotations now %v", got.Annotations)
	}
}

// A pass that publishes a grant after its status write (a replica paused
// between its read and its write, whose status write still went through
// before the new leader's) must neither take a later grant's token from
// its holder nor overwrite it with an older one: it removes only tokens
// etcd had released by its read, and sets only its own grant's.
func TestPublishSparesATokenGrantedAfterTheRead(t *testing.T) {
	store, live := liveGrantTo(t, "new-holder")
	tok := func(d int64) string { return strconv.FormatInt(live+d, 10) }
	g := &etcdstore.Grant{Token: live - 1, LeaseID: 99, GrantValue: etcdstore.GrantValue{Holder: "holder", HolderUID: "uid-holder"}}
	tokens := map[string]string{"ex-holder": tok(-2), "new-holder": tok(0), "holder": tok(-1), "forged": "999999999"}
	// A token above any the pass knows of stays only where etcd holds it
	// for that pod: not a forged one, nor one left from an etcd since
	// restored from an older snapshot.
	want := map[string]string{"ex-holder": "", "new-holder": tok(0), "holder": tok(-1), "forged": ""}
	checkPass(t, store, tokens, want, func(r *LeaseReconciler, lease *fencerv1.Lease) error {
		return r.publish(context.Background(), lease, nil, g, live-1)
	})
}

// A grant this pass made itself is above the revision it read: publishing
// it must still set it, and take every older token away.
func TestPublishSetsAGrantMadeAfterTheRead(t *testing.T) {
	g := &etcdstore.Grant{Token: 55, LeaseID: 99, GrantValue: etcdstore.GrantValue{Holder: "holder", HolderUID: "uid-holder"}}
	// "between" carries a token above the read (50) and below this grant
	// (55): older than the grant, so removed, with no etcd read (the
	// pass has no store to read with).
	tokens := map[string]string{"ex-holder": "45", "holder": "30", "between": "52"}
	want := map[string]string{"ex-holder": "", "holder": "55", "between": ""}
	checkPass(t, nil, tokens, want, func(r *LeaseReconciler, lease *fencerv1.Lease) error {
		return r.publish(context.Background(), lease, nil, g, 50)
	})
}

// publish's removals hold only if the pod still carries what the pass's
// copy of it shows: a copy from before another grant's token reached the
// pod must not remove that token.
func TestPublishLeavesATokenItsCopyDidNotShow(t *testing.T) {
	g := &etcdstore.Grant{Token: 45, GrantValue: etcdstore.GrantValue{Holder: "w-1", HolderUID: "uid-w-1"}}
	checkStaleCopyRemovesNothing(t, "60", func(r *LeaseReconciler, lease *fencerv1.Lease, stale corev1.Pod) error {
		return r.publish(context.Background(), lease, []corev1.Pod{stale}, g, 50)
	})
}

// checkRemoveReleased runs removeReleased of g, read at rev, over pods
// named with their token annotations, and checks each pod's token after
// it ("" for none, and then no lease ID either).
func checkRemoveReleased(t *testing.T, g *etcdstore.Grant, rev int64, tokens, want map[string]string) {
	t.Helper()
	checkPass(t, nil, tokens, want, func(r *LeaseReconciler, lease *fencerv1.Lease) error {
		return r.removeReleased(context.Background(), lease, nil, g, rev)
	})
}

// checkPass runs pass over pods named with their token annotations (each
// with the etcd lease ID 99 too, and the UID "uid-<name>") of a Lease
// renewed Direct, and checks each pod's
// token after it ("" for none, and then no lease ID either).
func checkPass(t *testing.T, store *etcdstore.Store, tokens, want map[string]string, pass func(*LeaseReconciler, *fencerv1.Lease) error) {
	t.Helper()
	const key = fencerv1.HolderTokenAnnotationPrefix + "job"
	const idKey = fencerv1.HolderLeaseIDAnnotationPrefix + "job"
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues)
	for name, tok := range tokens {
		b = b.WithObjects(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Annotations: map[string]string{key: tok, idKey: "99"}}})
	}
	c := b.Build()
	r := &LeaseReconciler{Client: c, Store: store}
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ns"}, Spec: fencerv1.LeaseSpec{Renewal: fencerv1.RenewalDirect}}
	if err := pass(r, lease); err != nil {
		t.Fatal(err)
	}
	for name, want := range want {
		var got corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		if got.Annotations[key] != want || (want == "") != (got.Annotations[idKey] == "") {
			t.Errorf("%s: token %q, lease ID %q; want token %q", name, got.Annotations[key], got.Annotations[idKey], want)
		}
	}
}

// patchAsTheAPIServer patches through the fake client, and answers a JSON
// patch that does not apply as kube-apiserver does (its patch handler's
// applyJSPatch): 422 Invalid with the patch library's message as the
// cause. The fake client returns the library's error as it is.
func patchAsTheAPIServer(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := c.Patch(ctx, obj, patch, opts...)
	if err != nil && patch.Type() == types.JSONPatchType && !apierrors.IsNotFound(err) {
		return apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", err.Error(), 0, false)
	}
	return err
}

// A removal refused because its copy was behind is retried quietly only
// when every error of the pass is such a refusal: any other pod's failed
// patch is reported, and goes to the workqueue's backoff, with no Result
// beside it.
func TestAnotherPodsFailureIsNotHiddenBehindAStaleCopy(t *testing.T) {
	behind := fmt.Errorf("annotating pod w-0: %w", podCopyBehind{patchNotApplied})
	failed := errors.New("annotating pod w-1: the server is currently unable to handle the request")
	for name, err := range map[string]error{
		"beside":     errors.Join(behind, failed),
		"nested":     errors.Join(errors.Join(behind, behind), failed),
		"not joined": failed,
	} {
		if res, got := retryWhenPodCopyBehind(context.Background(), ctrl.Result{RequeueAfter: time.Second}, err); got == nil || !res.IsZero() {
			t.Errorf("%s: a failed patch came out as %+v, %v", name, res, got)
		}
	}
	if res, err := retryWhenPodCopyBehind(context.Background(), ctrl.Result{}, errors.Join(behind, behind)); err != nil || res.RequeueAfter != staleRetry {
		t.Errorf("two stale copies' removals came out as %+v, %v", res, err)
	}
	// A pass that asked to run again sooner keeps its time.
	if res, _ := retryWhenPodCopyBehind(context.Background(), ctrl.Result{RequeueAfter: time.Millisecond}, behind); res.RequeueAfter != time.Millisecond {
		t.Errorf("a retry asked in 1ms was put off to %v", res.RequeueAfter)
	}
}

// publish joins its pods' errors with a failed etcd read (the read that
// decides whether a token above the pass's is a later grant's): a stale
// copy's refused removal beside it must not turn that failure into a
// quiet retry.
func TestAFailedEtcdReadIsNotHiddenBehindAStaleCopy(t *testing.T) {
	cli, store, _ := storeWithTerm(t)
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	const key = fencerv1.HolderTokenAnnotationPrefix + "job"
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ex := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ex", Namespace: "ns", UID: "uid-ex", Annotations: map[string]string{key: "35"}}}
	later := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "later", Namespace: "ns", UID: "uid-later", Annotations: map[string]string{key: "60"}}}
	stale := ex.DeepCopy()
	stale.Annotations[key] = "30"
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ex, later).WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).
		WithInterceptorFuncs(interceptor.Funcs{Patch: patchAsTheAPIServer}).Build()
	r := &LeaseReconciler{Client: c, Store: store}
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ns"}}
	g := &etcdstore.Grant{Token: 40, GrantValue: etcdstore.GrantValue{Holder: "holder", HolderUID: "uid-holder"}}
	err := r.publish(context.Background(), lease, []corev1.Pod{*stale}, g, 50)
	if !errors.Is(err, errPodCopyBehind) {
		t.Fatalf("the stale copy's removal was not refused: %v", err)
	}
	if _, got := retryWhenPodCopyBehind(context.Background(), ctrl.Result{}, err); got == nil {
		t.Errorf("the failed etcd read was retried quietly, behind a stale copy: %v", err)
	}
}

// finish passes an afterStatus failure on with no Result, as before the
// quiet retry: controller-runtime ignores a Result beside an error, and
// logs a warning for it.
func TestFinishReportsAFailureWithoutAResult(t *testing.T) {
	lease := &fencerv1.Lease{}
	out := outcome{result: ctrl.Result{RequeueAfter: 5 * time.Second},
		afterStatus: func(context.Context) error { return errors.New("annotating pod w-0: 503") }}
	res, err := finish(context.Background(), apiClient{}, nil, lease, &lease.Status, &lease.Status, out)
	if err == nil || !res.IsZero() {
		t.Errorf("finish gave %+v, %v; want the error alone", res, err)
	}
}

// A removal a policy of the cluster's own refuses (a
// ValidatingAdmissionPolicy denies with 422 Invalid, as a failed JSON
// patch test is answered) is a failure to report, with the workqueue's
// backoff, never a stale copy retried quietly every 200 ms for ever.
func TestAPolicysRefusalOfARemovalIsReported(t *testing.T) {
	policy := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "w-0",
		errors.New("ValidatingAdmissionPolicy 'frozen' with binding 'frozen' denied request: annotations are frozen"))
	policy.ErrStatus.Reason = metav1.StatusReasonInvalid
	policy.ErrStatus.Code = http.StatusUnprocessableEntity
	policy.ErrStatus.Details.Causes = append(policy.ErrStatus.Details.Causes, metav1.StatusCause{Message: policy.ErrStatus.Message})
	testFailed := apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", "testing value /metadata/uid failed: test failed", 0, false)
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{policy, false},
		{testFailed, true},
		{apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "w-0", nil), false},
		{apierrors.NewServiceUnavailable("etcd is down"), false},
	} {
		if got := jsonPatchTestFailed(tc.err); got != tc.want {
			t.Errorf("jsonPatchTestFailed(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
