// Package framework runs fencer against envtest and a real etcd for the
// integration tests: the manager in-process, pods whose readiness the test
// controls, and polling helpers.
package framework

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/fencer-io/fencer/controllers"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/internal/webhook"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// Fencer is envtest (kube-apiserver and its etcd) plus a separate etcd for
// fencer, which tests may stop and restart, and optionally the fencing
// webhook installed in the apiserver.
type Fencer struct {
	Env    *envtest.Environment
	Config *rest.Config
	Client client.Client
	Etcd   *devcluster.Etcd
	// EtcdPKI is fencer's etcd's CA and certificates: it runs TLS with auth
	// on, as the chart runs it; EtcdCli connects as the manager.
	EtcdPKI *devcluster.EtcdPKI
	EtcdCli *clientv3.Client
	// LeaseDeletionGrace is the controllers' LeaseDeletionGrace in the
	// managers StartController starts from then on (0: the default).
	LeaseDeletionGrace time.Duration
	releaseAtDelete    bool
	dir                string
	nsSeq              atomic.Int32
}

// StartFencer starts everything; stop it with Stop. With webhook true the
// apiserver sends fenced objects to the webhook of StartController.
func StartFencer(webhook bool) (*Fencer, error) {
	return startFencer(webhook, false)
}

// StartFencerReleasingAtDelete is StartFencer with the webhook, and the
// opt-in Lease deletion webhook too (test/support/testenv/leasedeletewebhook): its
// managers release a Lease's grant at its DELETE, and put the finalizer
// only on Leases in kube-system, as --lease-delete-webhook does.
func StartFencerReleasingAtDelete() (*Fencer, error) {
	return startFencer(true, true)
}

func startFencer(webhook, releaseAtDelete bool) (*Fencer, error) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(logLevel())))
	env, err := testenv.New()
	if err != nil {
		return nil, err
	}
	f := &Fencer{Env: env, releaseAtDelete: releaseAtDelete}
	if webhook {
		root, err := testenv.RepoRoot()
		if err != nil {
			return nil, err
		}
		env.WebhookInstallOptions.Paths = []string{filepath.Join(root, "config", "webhook")}
		if releaseAtDelete {
			env.WebhookInstallOptions.Paths = append(env.WebhookInstallOptions.Paths, filepath.Join(root, "test", "support", "testenv", "leasedeletewebhook"))
		}
	}
	if f.Config, err = env.Start(); err != nil {
		return nil, fmt.Errorf("starting envtest: %w", err)
	}
	if err := f.startEtcd(); err != nil {
		f.Stop()
		return nil, err
	}
	return f, nil
}

func (f *Fencer) startEtcd() error {
	var err error
	if f.Client, err = client.New(f.Config, client.Options{Scheme: f.Env.Scheme}); err != nil {
		return err
	}
	// The chart's admission policies (the status guard admits the
	// managers of StartController, which run as the tests do).
	if err := testenv.InstallPolicies(context.Background(), f.Client, ""); err != nil {
		return err
	}
	if f.dir, err = os.MkdirTemp("", "fencer-test"); err != nil {
		return err
	}
	if f.Etcd, err = devcluster.NewEtcd(f.Env.BinaryAssetsDirectory, f.dir, "fencer-etcd"); err != nil {
		return err
	}
	if f.EtcdPKI, err = devcluster.NewEtcdPKI(filepath.Join(f.dir, "etcd-pki"), etcdkeys.DefaultPrefix); err != nil {
		return err
	}
	f.Etcd.Secure(f.EtcdPKI)
	if err := f.Etcd.Start(context.Background()); err != nil {
		return err
	}
	f.EtcdCli, err = f.ConnectEtcd()
	return err
}

// ConnectEtcd opens a new client to fencer's etcd, as the manager.
func (f *Fencer) ConnectEtcd() (*clientv3.Client, error) {
	p := f.EtcdPKI
	return etcdstore.Connect(etcdstore.Config{
		Endpoints: []string{f.Etcd.Endpoint}, Prefix: etcdkeys.DefaultPrefix, DialTimeout: 5 * time.Second,
		CAFile: p.Path("ca.crt"), CertFile: p.Path("manager.crt"), KeyFile: p.Path("manager.key"),
	})
}

// EtcdFlags are the manager binary's flags to reach fencer's etcd.
func (f *Fencer) EtcdFlags() []string {
	return f.EtcdPKI.Flags([]string{f.Etcd.Endpoint}, "manager")
}

// Stop stops everything StartFencer started.
func (f *Fencer) Stop() {
	if f.EtcdCli != nil {
		f.EtcdCli.Close()
	}
	if f.Etcd != nil {
		_ = f.Etcd.Stop()
	}
	_ = f.Env.Stop()
	if f.dir != "" {
		os.RemoveAll(f.dir)
	}
}

// logLevel is quiet unless FENCER_TEST_LOG=debug.
func logLevel() zapcore.Level {
	if os.Getenv("FENCER_TEST_LOG") == "debug" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel
}

// StartController runs a fencer manager (controllers, etcd election and,
// if the environment installed it, the webhook) in the test process until
// the returned stop is called or the test ends.
func (f *Fencer) StartController(t *testing.T, identity string) (stop func()) {
	t.Helper()
	wh := f.Env.WebhookInstallOptions
	opts := ctrl.Options{
		Scheme:                 f.Env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  controllers.CacheOptions(nil),
		// Several managers in one process register the same controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	serveWebhook := len(wh.Paths) > 0
	if serveWebhook {
		opts.WebhookServer = ctrlwebhook.NewServer(ctrlwebhook.Options{Host: wh.LocalServingHost, Port: wh.LocalServingPort, CertDir: wh.LocalServingCertDir})
	}
	mgr, err := ctrl.NewManager(f.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := f.ConnectEtcd()
	if err != nil {
		t.Fatal(err)
	}
	elector := etcdstore.NewElector(cli, etcdkeys.DefaultPrefix, identity, time.Second)
	elector.Log = ctrl.Log.WithName("elector")
	if err := mgr.Add(elector); err != nil {
		t.Fatal(err)
	}
	store := etcdstore.NewStore(cli, etcdkeys.DefaultPrefix, elector, metrics.ObserveEtcd)
	store.Log = ctrl.Log.WithName("etcd")
	id := &controllers.IdentityReconciler{Etcd: cli, CA: f.EtcdPKI.CA, Prefix: etcdkeys.DefaultPrefix, Endpoints: []string{f.Etcd.Endpoint}, SecretName: "fencer-etcd-client"}
	if err := controllers.Setup(mgr, store, elector, controllers.Options{Identity: id, LeaseDeletionGrace: f.LeaseDeletionGrace,
		// As the manager's flags: the finalizer on every Lease, unless the
		// Lease deletion webhook releases at the DELETE; then only in the
		// namespace it skips.
		LeaseDeleteWebhook:       f.releaseAtDelete,
		LeaseFinalizerNamespaces: []string{"kube-system"}}); err != nil {
		t.Fatal(err)
	}
	if serveWebhook {
		if err := webhook.Register(context.Background(), mgr, store, webhook.Options{Exempt: webhook.NewExempt(webhook.DefaultExemptUsers, nil),
			ReleaseAtDelete: f.releaseAtDelete, Finalize: controllers.FinalizeIn([]string{"kube-system"}, !f.releaseAtDelete)}); err != nil {
			t.Fatal(err)
		}
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

// ReadyPod creates a pod labeled app=<app> and marks it Ready, as a kubelet
// would. sa names its service account ("" for none).
func (f *Fencer) ReadyPod(t *testing.T, ns, name, app, sa string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if err := f.Client.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	f.SetReady(t, pod, true)
	return pod
}

// SetReady sets the pod's Ready condition.
func (f *Fencer) SetReady(t *testing.T, pod *corev1.Pod, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	for {
		if err := f.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
		err := f.Client.Status().Update(context.Background(), pod)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

// Eventually polls check until it returns nil, failing the test after
// timeout. Timeouts are generous bounds for progress, not performance claims.
func Eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
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

// WaitHTTP polls url until it answers with status want, or returns an error
// naming the last answer once timeout has passed or ctx is done.
func WaitHTTP(ctx context.Context, url string, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return nil
			}
			last = resp.Status
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: want HTTP %d after %s, last got %s", url, want, timeout, last)
}
