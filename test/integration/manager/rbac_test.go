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
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/testenv"
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
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "rbac-test", Namespace: ns}}
	objs := []client.Object{sa}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: ns}}
		switch meta.Kind {
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			if err := yaml.Unmarshal([]byte(doc), r); err != nil {
				t.Fatal(err)
			}
			r.Name = "rbac-test"
			objs = append(objs, r, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rbac-test"},
				RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: r.Name}, Subjects: subject})
		case "Role":
			r := &rbacv1.Role{}
			if err := yaml.Unmarshal([]byte(doc), r); err != nil {
				t.Fatal(err)
			}
			r.Name = "rbac-test"
			objs = append(objs, r, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rbac-test", Namespace: ns},
				RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: r.Name}, Subjects: subject})
		}
	}
	// The webhook configuration the rotator injects into. Nothing serves its
	// Service in envtest, so it is set to Ignore: the test is about RBAC.
	whRaw, err := os.ReadFile(filepath.Join(root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.Unmarshal(whRaw, vwc); err != nil {
		t.Fatal(err)
	}
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
	}
	objs = append(objs, vwc)
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%T: %v", o, err)
		}
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), vwc) })

	r := startFencer(t, "rbac", "--kubeconfig="+serviceAccountKubeconfig(t, ns, sa.Name),
		"--etcd-endpoints="+fencerEtcd(t),
		"--leader-elect=true", "--leader-election-namespace="+ns,
		fmt.Sprintf("--webhook-port=%d", freePort(t)), "--webhook-host=127.0.0.1", "--webhook-cert-dir="+t.TempDir(),
		"--webhook-cert-rotation", "--webhook-namespace="+ns, "--webhook-secret=rbac-test-cert")
	waitStatus(t, r.probeURL+"/readyz", http.StatusOK)

	pod := readyPod(t, cl, "rbac-w", "rbac")
	lease := &v1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "rbac", Namespace: "default"},
		Spec: v1.LeaseSpec{TTLSeconds: 15, HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "rbac"}}}}
	if err := cl.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		l, p := &v1.Lease{}, &corev1.Pod{}
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
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["sa"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "sa"}
	cfg.CurrentContext = "sa"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
