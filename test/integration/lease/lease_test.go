// Package lease tests the Lease controller against a real kube-apiserver
// (envtest) and a real etcd of its own, which tests stop and restart. There
// is no kubelet: tests play its part by setting pods' Ready condition.
package lease

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/controllers"
	"github.com/fencer-io/fencer/internal/devcluster"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/testenv"
)

var (
	env     *envtest.Environment
	cfg     *rest.Config
	k8s     client.Client
	etcd    *devcluster.Etcd
	etcdCli *clientv3.Client
	nsSeq   atomic.Int32
)

const prefix = etcdstore.DefaultPrefix

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapLevel())))
	var err error
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	if env, err = testenv.New(); err != nil {
		return fail(err)
	}
	if cfg, err = env.Start(); err != nil {
		return fail(err)
	}
	defer env.Stop()
	if k8s, err = client.New(cfg, client.Options{Scheme: env.Scheme}); err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "fencer-lease-test")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	if etcd, err = devcluster.NewEtcd(env.BinaryAssetsDirectory, dir, "fencer-etcd"); err != nil {
		return fail(err)
	}
	if err := etcd.Start(context.Background()); err != nil {
		return fail(err)
	}
	defer etcd.Stop()
	if etcdCli, err = etcdstore.Connect(etcdstore.Config{Endpoints: []string{etcd.Endpoint}, Prefix: prefix, DialTimeout: 5 * time.Second}); err != nil {
		return fail(err)
	}
	defer etcdCli.Close()
	return m.Run()
}

// zapLevel is quiet unless FENCER_TEST_LOG=debug.
func zapLevel() zapcore.Level {
	if os.Getenv("FENCER_TEST_LOG") == "debug" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel
}

// ctrlConfig lets several managers in one test process register the same
// controller name.
func ctrlConfig() config.Controller {
	return config.Controller{SkipNameValidation: ptr.To(true)}
}

// startController runs a fencer manager (Lease controller and etcd election)
// in the test process until the returned stop is called or the test ends.
func startController(t *testing.T, identity string) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlConfig(),
	})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := etcdstore.Connect(etcdstore.Config{Endpoints: []string{etcd.Endpoint}, Prefix: prefix, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := controllers.Setup(mgr, controllers.Options{Etcd: cli, Prefix: prefix, Identity: identity, ElectionTTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager %s: %v", identity, err)
		}
	}()
	var once atomic.Bool
	stop = func() {
		if once.CompareAndSwap(false, true) {
			cancel()
			<-done
			cli.Close()
		}
	}
	t.Cleanup(stop)
	return stop
}

// namespace creates a fresh namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t%d", nsSeq.Add(1))}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// readyPod creates a pod labeled app=<app> and marks it Ready, as a kubelet would.
func readyPod(t *testing.T, ns, name, app string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	setReady(t, pod, true)
	return pod
}

func setReady(t *testing.T, pod *corev1.Pod, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	err := retryOnConflict(func() error {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
		return k8s.Status().Update(context.Background(), pod)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func retryOnConflict(fn func() error) error {
	for {
		err := fn()
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func newLease(ns, name, app string, ttl int32) *v1.Lease {
	return &v1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.LeaseSpec{
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

// eventually polls check until it returns nil or timeout passes. Timeouts
// here are generous bounds for progress, not performance assertions.
func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: still not true after %s: %v", what, timeout, err)
}

func getLease(t *testing.T, ns, name string) *v1.Lease {
	t.Helper()
	l := &v1.Lease{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, l); err != nil {
		t.Fatal(err)
	}
	return l
}

// heldBy waits until the Lease is Held by a pod other than any in notBy, and
// returns its status.
func heldBy(t *testing.T, ns, name string, notBy ...string) v1.LeaseStatus {
	t.Helper()
	var st v1.LeaseStatus
	eventually(t, 60*time.Second, fmt.Sprintf("lease %s/%s held by a new pod", ns, name), func() error {
		st = getLease(t, ns, name).Status
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionHeld)
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
	resp, err := etcdCli.Get(context.Background(), etcdstore.LeaseKey(prefix, ns, name))
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
	return p.Annotations[controllers.TokenAnnotationPrefix+lease]
}

func heldReason(l *v1.Lease) string {
	if c := meta.FindStatusCondition(l.Status.Conditions, v1.ConditionHeld); c != nil {
		return c.Reason
	}
	return ""
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
