package manager

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

func fencerEtcd(t *testing.T) string { return testenv.Etcd(t) }

// readyPod creates a pod in default labeled app=<app>, marked Ready as a
// kubelet would.
func readyPod(t *testing.T, cl client.Client, name, app string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if err := cl.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := cl.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestReadinessWaitsForTheWebhookCertificate: a replica whose certificate has
// not arrived yet stays up and not Ready, and becomes Ready once it has.
func TestReadinessWaitsForTheWebhookCertificate(t *testing.T) {
	certDir := t.TempDir()
	r := startFencer(t, "fencer", "--leader-elect=false", "--etcd-endpoints="+fencerEtcd(t),
		fmt.Sprintf("--webhook-port=%d", freePort(t)), "--webhook-host=127.0.0.1", "--webhook-cert-dir="+certDir)
	waitStatus(t, r.probeURL+"/healthz", http.StatusOK)
	waitStatus(t, r.probeURL+"/readyz", http.StatusInternalServerError)

	// Any valid pair will do: issue one from a throwaway dev CA.
	ca, err := devcluster.NewTestCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := ca.ServingPair("localhost")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.crt"), crt, 0o600); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, r.probeURL+"/readyz", http.StatusOK)
}

// TestCertRotationIssuesAndInjects: with --webhook-cert-rotation the manager
// creates the CA and serving certificate in the Secret, writes them for its
// server, injects the CA into the ValidatingWebhookConfiguration, and only
// then reports Ready.
func TestCertRotationIssuesAndInjects(t *testing.T) {
	ctx := context.Background()
	cl, err := client.New(env.Config, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fencer-system"}}); err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.Unmarshal(raw, vwc); err != nil {
		t.Fatal(err)
	}
	if err := cl.Create(ctx, vwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(context.Background(), vwc) })

	certDir := t.TempDir()
	r := startFencer(t, "fencer", "--leader-elect=false", "--etcd-endpoints="+fencerEtcd(t),
		fmt.Sprintf("--webhook-port=%d", freePort(t)), "--webhook-host=127.0.0.1", "--webhook-cert-dir="+certDir,
		"--webhook-cert-rotation", "--webhook-namespace=fencer-system")
	waitStatus(t, r.probeURL+"/readyz", http.StatusOK)

	secret := &corev1.Secret{}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "fencer-system", Name: "fencer-webhook-cert"}, secret); err != nil {
		t.Fatal(err)
	}
	ca := secret.Data["ca.crt"]
	if len(ca) == 0 || len(secret.Data["tls.crt"]) == 0 || len(secret.Data["tls.key"]) == 0 {
		t.Fatalf("secret keys: %v", keys(secret.Data))
	}
	onDisk, err := os.ReadFile(filepath.Join(certDir, "tls.crt"))
	if err != nil || !bytes.Equal(onDisk, secret.Data["tls.crt"]) {
		t.Fatalf("serving certificate on disk differs from the Secret's: %v", err)
	}
	block, _ := pem.Decode(onDisk)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("fencer-webhook.fencer-system.svc"); err != nil {
		t.Fatalf("certificate: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(vwc), vwc); err != nil {
			t.Fatal(err)
		}
		injected := 0
		for _, wh := range vwc.Webhooks {
			if bytes.Equal(wh.ClientConfig.CABundle, ca) {
				injected++
			}
		}
		if injected == len(vwc.Webhooks) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CA injected into %d of %d webhooks", injected, len(vwc.Webhooks))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
