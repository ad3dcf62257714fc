package manager

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/framework"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// TestGeneratedRBACIsEnough runs the manager as a service account bound to
// nothing but the generated config/rbac/role.yaml (ClusterRole and Role),
// with leader election and certificate rotation on, and checks it becomes
// Ready and grants a Lease: the markers grant all the manager uses.
func TestGeneratedRBACIsEnough(t *testing.T) {
	ctx := context.Background()
	cl, err := client.New(env.Config, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := "fencer-system"
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := "rbac-test"
	if err := framework.BindGeneratedRole(ctx, cl, ns, sa, "rbac-test"); err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The webhook configurations the rotator injects into. Nothing serves
	// their Service in envtest, so they are set to Ignore: the test is about
	// RBAC, which names only these two objects.
	whRaw, err := os.ReadFile(filepath.Join(root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(whRaw), "\n---\n")
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.Unmarshal([]byte(docs[0]), mwc); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(docs[1]), vwc); err != nil {
		t.Fatal(err)
	}
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
	}
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
	}
	for _, o := range []client.Object{mwc, vwc} {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Delete(context.Background(), o) })
	}

	r := startFencer(t, "rbac", "--kubeconfig="+serviceAccountKubeconfig(t, ns, sa),
		"--etcd-endpoints="+fencerEtcd(t),
		"--leader-elect=true", "--leader-election-namespace="+ns,
		fmt.Sprintf("--webhook-port=%d", freePort(t)), "--webhook-host=127.0.0.1", "--webhook-cert-dir="+t.TempDir(),
		"--webhook-cert-rotation", "--webhook-namespace="+ns, "--webhook-secret=rbac-test-cert")
	waitStatus(t, r.probeURL+"/readyz", http.StatusOK)

	pod := readyPod(t, cl, "rbac-w", "rbac")
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "rbac", Namespace: "default"},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 15, HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "rbac"}}}}
	if err := cl.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		l, p := &fencerv1.Lease{}, &corev1.Pod{}
		_ = cl.Get(ctx, client.ObjectKeyFromObject(lease), l)
		_ = cl.Get(ctx, client.ObjectKeyFromObject(pod), p)
		if l.Status.Token != 0 && p.Annotations["lease.fencer.io/rbac"] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not granted as the service account: status %+v, pod annotations %v", l.Status, p.Annotations)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The CA reached both configurations through the name-scoped RBAC.
	framework.Eventually(t, 60*time.Second, "CA injected into both webhook configurations", func() error {
		m, v := &admissionregistrationv1.MutatingWebhookConfiguration{}, &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := cl.Get(ctx, client.ObjectKeyFromObject(mwc), m); err != nil {
			return err
		}
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vwc), v); err != nil {
			return err
		}
		if len(m.Webhooks[0].ClientConfig.CABundle) == 0 || len(v.Webhooks[0].ClientConfig.CABundle) == 0 {
			return fmt.Errorf("caBundle: mutating %d bytes, validating %d bytes", len(m.Webhooks[0].ClientConfig.CABundle), len(v.Webhooks[0].ClientConfig.CABundle))
		}
		return nil
	})
	logs, err := os.ReadFile(r.log)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(logs)), "forbidden") {
		t.Fatalf("the manager was refused something by RBAC:\n%s", logs)
	}
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates as the
// service account with a TokenRequest token.
func serviceAccountKubeconfig(t *testing.T, ns, sa string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := framework.ServiceAccountKubeconfig(context.Background(), env.Config, ns, sa, nil, path); err != nil {
		t.Fatal(err)
	}
	return path
}
