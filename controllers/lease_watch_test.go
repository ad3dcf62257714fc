package controllers

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// TestPodEventSuspendsOnlyTheUnqualifiedHoldersRenewal: the pod event that
// shows the holder not Ready stops the renewal of its grant at once, and
// only that one: not for a pod of another UID, not for a Lease whose status
// names another etcd lease (a cache behind a newer grant), not for a Direct
// Lease, and not while the pod is Ready.
func TestPodEventSuspendsOnlyTheUnqualifiedHoldersRenewal(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testenv.Etcd(t)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	store := etcdstore.NewStore(cli, etcdkeys.DefaultPrefix, nil, nil)
	r := NewLeaseReconciler(nil, store, nil, nil, clock.RealClock{})
	grant, err := cli.Grant(context.Background(), 30)
	if err != nil {
		t.Fatal(err)
	}
	key := etcdkeys.LeaseKey(store.Prefix(), "ns", "l")

	holderPod := func(ready corev1.ConditionStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-p"},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}}
	}
	lease := func(edit func(*fencerv1.Lease)) *fencerv1.Lease {
		l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns"},
			Status: fencerv1.LeaseStatus{Holder: "p", HolderUID: "uid-p", LeaseID: int64(grant.ID)}}
		if edit != nil {
			edit(l)
		}
		return l
	}
	r.Renewer.Ensure(key, grant.ID, time.Now())
	for _, c := range []struct {
		name  string
		lease *fencerv1.Lease
		pod   *corev1.Pod
	}{
		{"a Ready holder", lease(nil), holderPod(corev1.ConditionTrue)},
		{"another pod under the holder's name", lease(func(l *fencerv1.Lease) { l.Status.HolderUID = "uid-old" }), holderPod(corev1.ConditionFalse)},
		{"a status behind a newer grant", lease(func(l *fencerv1.Lease) { l.Status.LeaseID++ }), holderPod(corev1.ConditionFalse)},
		{"a Direct Lease", lease(func(l *fencerv1.Lease) { l.Spec.Renewal = fencerv1.RenewalDirect }), holderPod(corev1.ConditionFalse)},
	} {
		r.suspendUnqualified(c.lease, c.pod)
		if !r.Renewer.Renewing(key, grant.ID) {
			t.Fatalf("%s: the renewal was suspended", c.name)
		}
	}
	r.suspendUnqualified(lease(nil), holderPod(corev1.ConditionFalse))
	if r.Renewer.Renewing(key, grant.ID) {
		t.Fatal("the holder went not Ready and its grant is still renewed")
	}
	if _, ok := r.Renewer.Stop(key); !ok {
		t.Fatal("the suspended renewal lost its last renewal time, which ends the tenure")
	}
}
