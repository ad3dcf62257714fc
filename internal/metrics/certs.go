package metrics

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var certExpiryDesc = prometheus.NewDesc("fencer_certificate_expiry_timestamp_seconds",
	"When a certificate this replica serves or presents stops being valid (its NotAfter, Unix seconds), read when scraped, so a certificate cert-manager renewed shows at once. Label certificate: webhook (the admission webhook's serving certificate: expired, every fenced write fails), metrics (the metrics endpoint's, with --metrics-cert-dir), etcd-client (--etcd-cert-file), etcd-ca (the CA of --etcd-pki-secret, which issues every etcd identity). A certificate whose file is missing or unreadable has no series.",
	[]string{"certificate"}, nil)

// CertExpiry is a Prometheus collector of certificate expiry times: of PEM
// files, read at each scrape (cert-manager and the rotator replace them in
// place), and of certificates held in memory.
type CertExpiry struct {
	// Files maps the certificate label to a PEM file; the first
	// certificate in it counts.
	Files map[string]string
	// Loaded maps the certificate label to a certificate already parsed.
	Loaded map[string]*x509.Certificate
}

// Describe implements prometheus.Collector.
func (c *CertExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- certExpiryDesc }

// Collect implements prometheus.Collector.
func (c *CertExpiry) Collect(ch chan<- prometheus.Metric) {
	expiry := map[string]time.Time{}
	for name, cert := range c.Loaded {
		expiry[name] = cert.NotAfter
	}
	for name, path := range c.Files {
		if t, ok := fileExpiry(path); ok {
			expiry[name] = t
		}
	}
	for name, t := range expiry {
		ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, float64(t.Unix()), name)
	}
}

// fileExpiry is the NotAfter of the first certificate in a PEM file. A file
// not yet written (the webhook's, before the rotator's first issue) is not
// an error worth failing the scrape for: it has no series, and /readyz
// already says the webhook is not serving.
func fileExpiry(path string) (time.Time, bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, false
	}
	for {
		var block *pem.Block
		block, raw = pem.Decode(raw)
		if block == nil {
			return time.Time{}, false
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return time.Time{}, false
		}
		return cert.NotAfter, true
	}
}
