package fence

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencer-io/fencer/internal/identity"
)

// writePair writes into dir what a namespace's etcd credentials Secret
// holds: a client certificate for cn and its key, as tls.crt and tls.key,
// the CA that signed it, the endpoints and the prefix.
func writePair(t *testing.T, dir, cn string) {
	t.Helper()
	ca, err := identity.NewCA("test-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(identity.Request{CommonName: cn}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"tls.crt":   pair.CertPEM,
		"tls.key":   pair.KeyPEM,
		"ca.crt":    ca.CertPEM,
		"endpoints": []byte("https://127.0.0.1:2379"),
		"prefix":    []byte("/fencer"),
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, raw := range files {
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// The credentials as a Secret volume holds them: files in a timestamped
// directory named by the ..data link, and each file a link through
// ..data. When the kubelet swaps ..data for a renewal, the client reads
// the certificate and its key through one resolution of the link: here
// the per-file links are left stale on purpose, naming the old pair, and
// the new pair is read whole. (Two reads through the per-file links could
// pair a renewed certificate with the old key across the swap.)
func TestTheClientPairIsReadThroughOneResolutionOfDotData(t *testing.T) {
	dir := t.TempDir()
	writePair(t, filepath.Join(dir, "..2026_12_07_old"), "old")
	if err := os.Symlink("..2026_12_07_old", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tls.crt", "tls.key", "ca.crt", "endpoints", "prefix"} {
		if err := os.Symlink(filepath.Join("..2026_12_07_old", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	access, err := LoadEtcdAccess(dir)
	if err != nil {
		t.Fatal(err)
	}
	commonName := func() string {
		t.Helper()
		pair, err := access.Config.TLS.GetClientCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.Subject.CommonName
	}
	if got := commonName(); got != "old" {
		t.Fatalf("before the renewal: %q", got)
	}
	writePair(t, filepath.Join(dir, "..2026_12_07_new"), "new")
	if err := os.Symlink("..2026_12_07_new", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if got := commonName(); got != "new" {
		t.Fatalf("after the swap of ..data: %q, want the renewed pair, read whole", got)
	}
}

// The etcd client sends an http:// endpoint plain text, dropping the CA
// check and the client certificate without a word: credentials that name
// one are refused, with the fix.
func TestCredentialsRefuseAnHTTPEndpoint(t *testing.T) {
	dir := t.TempDir()
	writePair(t, dir, "ns:pods")
	if err := os.WriteFile(filepath.Join(dir, "endpoints"), []byte("https://etcd-0:2379,http://etcd-1:2379"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadEtcdAccess(dir)
	if err == nil || !strings.Contains(err.Error(), `endpoint "http://etcd-1:2379" is http://, but these credentials are for TLS`) {
		t.Fatalf("LoadEtcdAccess with an http:// endpoint: %v", err)
	}
}
