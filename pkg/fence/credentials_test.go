package fence

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writePair writes a self-signed certificate for cn and its key into dir,
// as tls.crt and tls.key, and the CA file (the certificate itself).
func writePair(t *testing.T, dir, cn string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	files := map[string][]byte{
		"tls.crt":   certPEM,
		"tls.key":   pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":    certPEM,
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
