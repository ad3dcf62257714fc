package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/test/support/devcluster"
)

// TestOnlyTheApiserversCertificateIsAnswered serves a webhook path the way
// the manager does with --webhook-client-ca-file (controller-runtime's
// server behind a CertGatedServer), and calls it as a forger would: with no
// client certificate, with one from another CA, and with one from the CA
// whose name is not in --webhook-client-names. Only the apiserver's
// certificate reaches the handler; the readiness check, which dials with no
// certificate, still passes.
func TestOnlyTheApiserversCertificateIsAnswered(t *testing.T) {
	now := time.Now()
	serving := newCA(t, "serving-ca", now)
	clients := newCA(t, "webhook-client-ca", now)
	forgers := newCA(t, "another-ca", now)

	dir := t.TempDir()
	srv := issue(t, serving, identity.Request{CommonName: "fencer-webhook", Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}}, now)
	writeFile(t, filepath.Join(dir, "tls.crt"), srv.CertPEM)
	writeFile(t, filepath.Join(dir, "tls.key"), srv.KeyPEM)
	writeFile(t, filepath.Join(dir, "client-ca.crt"), clients.CertPEM)
	auth, err := LoadClientAuth(filepath.Join(dir, "client-ca.crt"), []string{"kube-apiserver"})
	if err != nil {
		t.Fatal(err)
	}
	ports, err := devcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	server := &CertGatedServer{
		Server:     ctrlwebhook.NewServer(ctrlwebhook.Options{Host: "127.0.0.1", Port: ports[0], CertDir: dir, TLSOpts: []func(*tls.Config){auth.TLS}}),
		CertDir:    dir,
		ClientAuth: auth,
	}
	reached := 0
	server.Register("/validate-fenced", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached++
		_, _ = io.WriteString(w, "judged")
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	ready := server.StartedChecker()
	for deadline := time.Now().Add(10 * time.Second); ready(nil) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the readiness check never passed: %v", ready(nil))
		}
	}

	roots := x509.NewCertPool()
	roots.AddCert(serving.Cert)
	url := "https://127.0.0.1:" + strconv.Itoa(ports[0]) + "/validate-fenced"
	post := func(cert *identity.Issued) (int, string, error) {
		cfg := &tls.Config{RootCAs: roots}
		if cert != nil {
			pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
			if err != nil {
				t.Fatal(err)
			}
			// Sent whatever CAs the server names, as a forger would.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
		resp, err := c.Post(url, "application/json", strings.NewReader(`{"kind":"AdmissionReview"}`))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), nil
	}

	apiserver := issue(t, clients, identity.Request{CommonName: "kube-apiserver"}, now)
	otherClient := issue(t, clients, identity.Request{CommonName: "system:node:n1"}, now)
	forged := issue(t, forgers, identity.Request{CommonName: "kube-apiserver"}, now)

	if code, body, err := post(nil); err != nil || code != http.StatusForbidden || !strings.Contains(body, "presented no client certificate signed by the --webhook-client-ca-file CA") {
		t.Errorf("no client certificate: %d %q %v, want 403 naming the missing certificate", code, body, err)
	}
	if code, body, err := post(&otherClient); err != nil || code != http.StatusForbidden || !strings.Contains(body, `CN "system:node:n1"`) {
		t.Errorf("a certificate from the CA for another name: %d %q %v, want 403 naming it", code, body, err)
	}
	if code, body, err := post(&forged); err == nil {
		t.Errorf("a certificate from another CA: %d %q, want the handshake refused", code, body)
	}
	if reached != 0 {
		t.Fatalf("the handler was reached %d times by callers without the apiserver's certificate", reached)
	}
	if code, body, err := post(&apiserver); err != nil || code != http.StatusOK || body != "judged" {
		t.Errorf("the apiserver's certificate: %d %q %v, want the handler's answer", code, body, err)
	}
}

func newCA(t *testing.T, name string, now time.Time) *identity.CA {
	t.Helper()
	ca, err := identity.NewCA(name, now)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *identity.CA, r identity.Request, now time.Time) identity.Issued {
	t.Helper()
	got, err := ca.Issue(r, now)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
