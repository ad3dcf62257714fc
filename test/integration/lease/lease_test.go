// Package lease tests the Lease controller against a real kube-apiserver
// (envtest) and a real etcd of its own, which tests stop and restart. There
// is no kubelet: tests play its part by setting pods' Ready condition.
package lease

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/framework"
)

var (
	fx   *framework.Fencer
	k8s  client.Client
	etcd interface {
		Start(context.Context) error
		Stop() error
		Wipe() error
	}
)

const prefix = etcdkeys.DefaultPrefix

func TestMain(m *testing.M) {
	var err error
	if fx, err = framework.StartFencer(false); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	k8s, etcd = fx.Client, fx.Etcd
	code := m.Run()
	fx.Stop()
	os.Exit(code)
}

func startController(t *testing.T, identity string) (stop func()) {
	t.Helper()
	return fx.StartController(t, identity)
}

func namespace(t *testing.T) string { t.Helper(); return fx.Namespace(t) }

func readyPod(t *testing.T, ns, name, app string) *corev1.Pod {
	t.Helper()
	return fx.ReadyPod(t, ns, name, app, "")
}

func setReady(t *testing.T, pod *corev1.Pod, ready bool) { t.Helper(); fx.SetReady(t, pod, ready) }

func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	framework.Eventually(t, timeout, what, check)
}

func newLease(ns, name, app string, ttl int32) *fencerv1.Lease {
	return &fencerv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: fencerv1.LeaseSpec{
			TTLSeconds:     ttl,
			HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

func getLease(t *testing.T, ns, name string) *fencerv1.Lease {
	t.Helper()
	l := &fencerv1.Lease{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, l); err != nil {
		t.Fatal(err)
	}
	return l
}

// heldBy waits until the Lease is Held by a pod other than any in notBy, and
// returns its status.
func heldBy(t *testing.T, ns, name string, notBy ...string) fencerv1.LeaseStatus {
	t.Helper()
	var st fencerv1.LeaseStatus
	eventually(t, 60*time.Second, fmt.Sprintf("lease %s/%s held by a new pod", ns, name), func() error {
		st = getLease(t, ns, name).Status
		c := meta.FindStatusCondition(st.Conditions, fencerv1.ConditionHeld)
		if c == nil || c.Status != metav1.ConditionTrue || st.Holder == "" {
			return fmt.Errorf("status %+v", st)
		}
		for _, n := range notBy {
			if st.Holder == n {
				return fmt.Errorf("still held by %s", n)
			}
		}
		return nil
	})
	return st
}

// etcdToken is the CreateRevision of the Lease's key, or 0 without a key.
func etcdToken(t *testing.T, ns, name string) int64 {
	t.Helper()
	resp, err := fx.EtcdCli.Get(context.Background(), etcdkeys.LeaseKey(prefix, ns, name))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].CreateRevision
}

// annotation returns the pod's token annotation for lease, "" if absent.
func annotation(t *testing.T, ns, pod, lease string) string {
	t.Helper()
	p := &corev1.Pod{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pod}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return ""
		}
		t.Fatal(err)
	}
	return p.Annotations[fencerv1.HolderTokenAnnotationPrefix+lease]
}

func heldReason(l *fencerv1.Lease) string {
	if c := meta.FindStatusCondition(l.Status.Conditions, fencerv1.ConditionHeld); c != nil {
		return c.Reason
	}
	return ""
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func metaOf(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }
