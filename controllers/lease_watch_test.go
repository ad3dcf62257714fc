package controllers

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// TestPodEventsSuspendAndResumeOnlyTheHoldersRenewal drives the Lease
// controller's pod event handler. The update that shows the holder not
// Ready suspends the renewal of its grant at once; the one that shows it
// Ready again resumes it, even though that update's old pod was not Ready
// (the map function also sees the old pod). Nothing is suspended for a pod
// of another UID, for a Lease whose status names another etcd lease (a
// cache behind a newer grant), or for a Direct Lease.
func TestPodEventsSuspendAndResumeOnlyTheHoldersRenewal(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testenv.Etcd(t)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	names := []string{"held", "other-uid", "newer-grant", "direct"}
	ids := map[string]clientv3.LeaseID{} // each Lease's grant has its own etcd lease
	for _, name := range names {
		g, err := cli.Grant(context.Background(), 30)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = g.ID
	}
	lease := func(name string, edit func(*fencerv1.Lease)) *fencerv1.Lease {
		l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
			Status: fencerv1.LeaseStatus{Holder: "p", HolderUID: "uid-p", LeaseID: int64(ids[name])}}
		if edit != nil {
			edit(l)
		}
		return l
	}
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&fencerv1.Lease{}, indexHolder, holderValues).WithObjects(
		lease("held", nil),
		lease("other-uid", func(l *fencerv1.Lease) { l.Status.HolderUID = "uid-old" }),
		lease("newer-grant", func(l *fencerv1.Lease) { l.Status.LeaseID++ }),
		lease("direct", func(l *fencerv1.Lease) { l.Spec.Renewal = fencerv1.RenewalDirect }),
	).Build()
	store := etcdstore.NewStore(cli, etcdkeys.DefaultPrefix, nil, nil)
	r := NewLeaseReconciler(c, store, nil, nil, clock.RealClock{})
	key := func(name string) string { return etcdkeys.LeaseKey(store.Prefix(), "ns", name) }
	for _, name := range names {
		r.Renewer.Ensure(key(name), ids[name], time.Now())
	}

	pod := func(ready corev1.ConditionStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-p"},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}}
	}
	h := r.podEvents()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	update := func(from, to corev1.ConditionStatus) {
		h.Update(context.Background(), event.UpdateEvent{ObjectOld: pod(from), ObjectNew: pod(to)}, q)
	}
	renewing := func(name string) bool { return r.Renewer.Renewing(key(name), ids[name]) }

	update(corev1.ConditionTrue, corev1.ConditionFalse)
	if renewing("held") {
		t.Fatal("the holder went not Ready and its grant is still renewed")
	}
	for _, name := range []string{"other-uid", "newer-grant", "direct"} {
		if !renewing(name) {
			t.Errorf("Lease %s: its renewal was suspended for a pod that does not hold its grant", name)
		}
	}
	update(corev1.ConditionFalse, corev1.ConditionTrue)
	if !renewing("held") {
		t.Fatal("the holder is Ready again and its renewal waits for a reconcile")
	}
	h.Delete(context.Background(), event.DeleteEvent{Object: pod(corev1.ConditionTrue)}, q)
	if renewing("held") {
		t.Fatal("the holder's pod was deleted and its grant is still renewed")
	}
	if _, ok := r.Renewer.Stop(key("held")); !ok {
		t.Fatal("the suspended renewal lost its last renewal time, which ends the tenure")
	}
	if q.Len() == 0 {
		t.Fatal("the pod events queued no Lease")
	}
}
