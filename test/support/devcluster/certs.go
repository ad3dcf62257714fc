package devcluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/fencer-io/fencer/internal/identity"
)

// pki is the dev cluster's certificate authority and the files made from it.
// Everything is regenerated on each start: a dev cluster lives for one run.
type pki struct {
	dir string
	ca  *identity.CA
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := identity.NewCA("fencer-dev-ca", time.Now())
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, ca: ca}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.path("ca.crt"), ca.CertPEM, 0o600); err != nil {
		return nil, err
	}
	return p, os.WriteFile(p.path("ca.key"), keyPEM, 0o600)
}

// issue writes <name>.crt and <name>.key, signed by the CA: a serving
// certificate for dnsNames and ips when server is set, else a client one.
func (p *pki) issue(name string, subject pkix.Name, server bool, dnsNames []string, ips []net.IP) error {
	c, err := p.ca.Issue(identity.Request{CommonName: subject.CommonName, Organization: subject.Organization, Server: server, DNSNames: dnsNames, IPs: ips}, time.Now())
	if err != nil {
		return fmt.Errorf("issuing %s: %w", name, err)
	}
	if err := os.WriteFile(p.path(name+".crt"), c.CertPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.path(name+".key"), c.KeyPEM, 0o600)
}

// serviceAccountKeys writes the RSA key pair the apiserver signs and verifies
// service-account tokens with (sa.key, sa.pub), so TokenRequest and bound pod
// tokens work.
func (p *pki) serviceAccountKeys() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	if err := writePEM(p.path("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	return writePEM(p.path("sa.pub"), "PUBLIC KEY", pub)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// TestCA is a throwaway certificate authority for tests.
type TestCA struct{ p *pki }

// NewTestCA creates a CA whose files live in dir.
func NewTestCA(dir string) (*TestCA, error) {
	p, err := newPKI(dir)
	if err != nil {
		return nil, err
	}
	return &TestCA{p: p}, nil
}

// ServingPair issues a serving certificate for host and returns it and its
// key, PEM-encoded.
func (c *TestCA) ServingPair(host string) (crt, key []byte, err error) {
	if err := c.p.issue("serving", pkix.Name{CommonName: host}, true, []string{host}, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return nil, nil, err
	}
	if crt, err = os.ReadFile(c.p.path("serving.crt")); err != nil {
		return nil, nil, err
	}
	key, err = os.ReadFile(c.p.path("serving.key"))
	return crt, key, err
}
