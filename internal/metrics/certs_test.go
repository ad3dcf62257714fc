package metrics

import (
	"crypto/x509"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencer-io/fencer/internal/identity"
)

// selfSigned is a certificate that expires at notAfter, and its PEM.
func selfSigned(t *testing.T, notAfter time.Time) (*x509.Certificate, []byte) {
	t.Helper()
	ca, err := identity.NewCA("x", notAfter.Add(-identity.CALifetime))
	if err != nil {
		t.Fatal(err)
	}
	return ca.Cert, ca.CertPEM
}

func TestCertExpiry(t *testing.T) {
	dir := t.TempDir()
	webhookAt := time.Unix(2000000000, 0)
	caAt := time.Unix(2100000000, 0)
	_, webhookPEM := selfSigned(t, webhookAt)
	ca, _ := selfSigned(t, caAt)
	// A key first, as some tools write combined files: the certificate after it counts.
	keyFirst := append([]byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"), webhookPEM...)
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), keyFirst, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "garbage.crt"), []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &CertExpiry{
		Files: map[string]string{
			"webhook":     filepath.Join(dir, "tls.crt"),
			"metrics":     filepath.Join(dir, "missing.crt"),
			"etcd-client": filepath.Join(dir, "garbage.crt"),
		},
		Loaded: map[string]*x509.Certificate{"etcd-ca": ca},
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{"webhook": float64(webhookAt.Unix()), "etcd-ca": float64(caAt.Unix())}
	if !maps.Equal(got, want) {
		t.Errorf("expiry series: got %v, want %v (a missing or unreadable file has none)", got, want)
	}
}
