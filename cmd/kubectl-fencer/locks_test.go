package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// --etcd-server-name is the name etcd's certificate is checked for when
// --etcd-endpoints reaches etcd by another (a port-forward, a load
// balancer). gRPC sets the TLS server name to the address it dials, so the
// flag did nothing: etcd reached at an address its certificate does not
// name failed (after 10 s, as a timeout), and a wrong name passed. Now the
// name is checked, and a failed check is named in the error.
func TestTheEtcdServerNameIsTheNameChecked(t *testing.T) {
	e := testenv.StartSecureEtcd(t, "/fencer")
	read := func(name string) []byte {
		raw, err := os.ReadFile(e.PKI.Path(name))
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "fencer-system", Name: "viewer"},
		Data: map[string][]byte{"ca.crt": read("ca.crt"), "tls.crt": read("manager.crt"), "tls.key": read("manager.key")}}
	get := func(endpoint, serverName string) (clientv3.Config, error) {
		cfg, err := viewerConfig(secret, &lockFlags{endpoints: endpoint, serverName: serverName})
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = cli.Get(ctx, "/fencer/locks/", clientv3.WithPrefix())
		return cfg, err
	}

	// 127.0.0.2 is not in etcd's certificate; localhost is.
	proxy := forward(t, "127.0.0.2:0", strings.TrimPrefix(e.Endpoint, "https://"))
	if _, err := get("https://"+proxy, "localhost"); err != nil {
		t.Errorf("through %s with --etcd-server-name localhost: %v", proxy, err)
	}
	cfg, err := get(e.Endpoint, "wrong.example")
	if err == nil {
		t.Fatalf("--etcd-server-name wrong.example was accepted for etcd's certificate")
	}
	if herr := handshake(context.Background(), cfg); herr == nil || !strings.Contains(herr.Error(), "wrong.example") {
		t.Errorf("the handshake's own account of the failure: %v, want it to name wrong.example", herr)
	}
	if _, err := get(e.Endpoint, ""); err != nil {
		t.Errorf("the Secret's endpoint, no --etcd-server-name: %v", err)
	}
}

// forward listens on addr and copies each connection to target; it
// returns the address it listens on.
func forward(t *testing.T, addr, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// The handshake that explains a timeout dials each endpoint as the etcd
// client does: an IPv6 address in brackets, a trailing slash, a bare
// host:port without a scheme. (It took
// everything before the first ':' for the name, so https://[::1]:2379 was
// checked for "[", and a sound endpoint was blamed.)
func TestTheHandshakeReadsEndpointsAsTheClientDoes(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		ln, err = net.Listen("tcp", "127.0.0.1:0") // no IPv6 loopback: the trailing slash still counts
		if err != nil {
			t.Fatal(err)
		}
	}
	srv.Listener = ln
	srv.StartTLS() // its certificate names 127.0.0.1 and ::1
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	for _, ep := range []string{srv.URL, srv.URL + "/", strings.TrimPrefix(srv.URL, "https://")} {
		cfg := clientv3.Config{Endpoints: []string{ep}, TLS: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}
		if err := handshake(context.Background(), cfg); err != nil {
			t.Errorf("the handshake with %s, whose certificate names it: %v", ep, err)
		}
	}
}

func TestDialTarget(t *testing.T) {
	for ep, want := range map[string][3]string{
		"https://127.0.0.1:2379":         {"127.0.0.1:2379", "127.0.0.1", "true"},
		"https://[::1]:2379/":            {"[::1]:2379", "::1", "true"},
		"https://etcd-0.fencer.svc":      {"etcd-0.fencer.svc", "etcd-0.fencer.svc", "true"}, // no port: the dial fails as the client's does
		"127.0.0.1:2379":                 {"127.0.0.1:2379", "127.0.0.1", "true"},
		"fencer-etcd.fencer-system:2379": {"fencer-etcd.fencer-system:2379", "fencer-etcd.fencer-system", "true"},
		"unix:///run/etcd.sock":          {"", "", "false"},
	} {
		addr, name, ok := dialTarget(ep)
		if got := [3]string{addr, name, strconv.FormatBool(ok)}; got != want {
			t.Errorf("dialTarget(%q) = %v, want %v", ep, got, want)
		}
	}
}

// A viewer Secret's certificate sent to an http:// endpoint would go
// nowhere: the etcd client sends such an endpoint plain text. It is
// refused, with the fix.
func TestTheViewerRefusesAnHTTPEndpoint(t *testing.T) {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "fencer-system", Name: "viewer"}, Data: viewerTestData(t)}
	_, err := viewerConfig(secret, &lockFlags{endpoints: "http://127.0.0.1:2379"})
	if err == nil || !strings.Contains(err.Error(), `"http://127.0.0.1:2379" is http://`) {
		t.Fatalf("viewerConfig with an http:// endpoint: %v", err)
	}
}

// viewerTestData is a viewer Secret's ca.crt, tls.crt and tls.key.
func viewerTestData(t *testing.T) map[string][]byte {
	t.Helper()
	ca, err := identity.NewCA("test-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(identity.Request{CommonName: "fencer:viewer"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{"ca.crt": ca.CertPEM, "tls.crt": pair.CertPEM, "tls.key": pair.KeyPEM}
}
