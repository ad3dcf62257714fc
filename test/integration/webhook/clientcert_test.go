package webhook

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/internal/webhook"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// TestTheApiserverPresentsItsWebhookClientCertificate configures a real
// kube-apiserver as install.md tells an operator to (an admission
// configuration whose kubeconfig gives it a client certificate for
// webhooks) and serves two webhook servers as the manager does with
// --webhook-client-ca-file: one whose --webhook-client-names holds the
// apiserver's name, whose answer reaches the writer, and one that holds
// another name, which the apiserver cannot call (failurePolicy Fail).
func TestTheApiserverPresentsItsWebhookClientCertificate(t *testing.T) {
	now := time.Now()
	serving, err := identity.NewCA("webhook-serving-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	clients, err := identity.NewCA("webhook-client-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	issueTo(t, serving, identity.Request{CommonName: "webhook", Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}}, dir, "tls")
	apiserver := issueTo(t, clients, identity.Request{CommonName: "kube-apiserver-webhook-client"}, dir, "apiserver")
	writeTo(t, filepath.Join(dir, "client-ca.crt"), clients.CertPEM)

	// The apiserver's admission configuration: its certificate for every
	// webhook ("*"), as install.md shows it.
	kubeconfig := filepath.Join(dir, "webhook-kubeconfig.yaml")
	writeTo(t, kubeconfig, fmt.Appendf(nil, "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user:\n    client-certificate-data: %s\n    client-key-data: %s\n",
		base64.StdEncoding.EncodeToString(apiserver.CertPEM), base64.StdEncoding.EncodeToString(apiserver.KeyPEM)))
	admissionConfig := filepath.Join(dir, "admission.yaml")
	writeTo(t, admissionConfig, fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %s
`, kubeconfig))
	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	env.ControlPlane.GetAPIServer().Configure().Append("admission-control-config-file", admissionConfig)
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}

	ports, err := devcluster.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, dir, ports[0], "kube-apiserver-webhook-client")
	serve(t, dir, ports[1], "someone-else")
	ctx := context.Background()
	hooks := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "client-cert"}}
	for i, port := range ports {
		hooks.Webhooks = append(hooks.Webhooks, admissionregistrationv1.ValidatingWebhook{
			Name:                    fmt.Sprintf("hook-%d.fencer.io", i),
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d/validate", port)), CABundle: serving.CertPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"hook": fmt.Sprint(i)}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		})
	}
	if err := c.Create(ctx, hooks); err != nil {
		t.Fatal(err)
	}

	create := func(hook string) error {
		return c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "cm-", Namespace: "default", Labels: map[string]string{"hook": hook}}})
	}
	// The webhook configuration takes a moment to reach the apiserver's
	// admission chain; until then the create is not sent to the hook.
	deadline := time.Now().Add(30 * time.Second)
	for err := create("0"); err == nil || !strings.Contains(err.Error(), "judged, with the apiserver's certificate"); err = create("0") {
		if time.Now().After(deadline) {
			t.Fatalf("a create judged by the webhook that accepts the apiserver's certificate: %v, want its refusal", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	err = create("1")
	if err == nil || !strings.Contains(err.Error(), "failed calling webhook") || !strings.Contains(err.Error(), `CN "kube-apiserver-webhook-client"`) {
		t.Fatalf("a create sent to the webhook that wants another name: %v, want the apiserver's call refused, naming its certificate", err)
	}
}

// serve starts a webhook server on port as the manager does with
// --webhook-client-ca-file and --webhook-client-names=name, whose one path
// refuses every review, saying the review was judged.
func serve(t *testing.T, dir string, port int, name string) {
	t.Helper()
	auth, err := webhook.LoadClientAuth(filepath.Join(dir, "client-ca.crt"), []string{name})
	if err != nil {
		t.Fatal(err)
	}
	srv := &webhook.CertGatedServer{
		Server:     ctrlwebhook.NewServer(ctrlwebhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir, TLSOpts: []func(*tls.Config){auth.TLS}}),
		CertDir:    dir,
		ClientAuth: auth,
	}
	srv.Register("/validate", &admission.Webhook{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Denied("judged, with the apiserver's certificate")
	})})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	})
	ready := srv.StartedChecker()
	for deadline := time.Now().Add(10 * time.Second); ready(nil) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the webhook server on %d never started: %v", port, ready(nil))
		}
	}
}

// issueTo issues r from ca into dir/<name>.crt and .key (tls.crt and
// tls.key for "tls", the webhook server's file names).
func issueTo(t *testing.T, ca *identity.CA, r identity.Request, dir, name string) identity.Issued {
	t.Helper()
	got, err := ca.Issue(r, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	writeTo(t, filepath.Join(dir, name+".crt"), got.CertPEM)
	writeTo(t, filepath.Join(dir, name+".key"), got.KeyPEM)
	return got
}

func writeTo(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
