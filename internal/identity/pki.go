package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Lifetimes of what the CA issues. Certificates are renewed once two thirds
// of their life has passed (NeedsRenewal), so a manager that is down for
// up to a third of a lifetime still finds them valid.
const (
	CALifetime   = 10 * 365 * 24 * time.Hour
	CertLifetime = 90 * 24 * time.Hour
)

// CA signs etcd's server certificates and every client identity. etcd
// trusts it for client certificates and maps each certificate's CommonName
// to an etcd user.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// CertPEM is Cert, PEM-encoded, as clients need it in ca.crt.
	CertPEM []byte
}

// NewCA creates a self-signed CA named name, valid for CALifetime.
func NewCA(name string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: encodePEM("CERTIFICATE", der)}, nil
}

// ParseCA reads a CA from its PEM certificate and private key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate and key: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("certificate %q is not a CA (basicConstraints CA:FALSE)", cert.Subject.CommonName)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("CA key is %T; fencer's CA key must be ECDSA", pair.PrivateKey)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// KeyPEM is the CA's private key, PEM-encoded.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return encodePEM("EC PRIVATE KEY", der), nil
}

// Request says what certificate to issue.
type Request struct {
	// CommonName is the etcd user of a client certificate.
	CommonName string
	// Organization becomes the subject's O, which Kubernetes reads as
	// groups (the dev cluster's admin and node certificates).
	Organization []string
	// Server makes a certificate etcd members serve with, and present to
	// their peers, for DNSNames and IPs.
	Server   bool
	DNSNames []string
	IPs      []net.IP
}

// Issued is a certificate and its key, PEM-encoded.
type Issued struct {
	CertPEM, KeyPEM []byte
	NotAfter        time.Time
}

// Issue signs a new key pair for r, valid for CertLifetime from now.
func (ca *CA) Issue(r Request, now time.Time) (Issued, error) {
	if r.CommonName == "" {
		return Issued{}, errors.New("a certificate needs a CommonName")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, err
	}
	serial, err := newSerial()
	if err != nil {
		return Issued{}, err
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if r.Server {
		// Members present the same certificate to clients and to peers.
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	notAfter := now.Add(CertLifetime)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: r.CommonName, Organization: r.Organization},
		NotBefore:    now.Add(-5 * time.Minute), // tolerate small clock skew
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		DNSNames:     r.DNSNames,
		IPAddresses:  r.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Issued{}, fmt.Errorf("issuing %q: %w", r.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Issued{}, err
	}
	return Issued{CertPEM: encodePEM("CERTIFICATE", der), KeyPEM: encodePEM("EC PRIVATE KEY", keyDER), NotAfter: notAfter}, nil
}

// NeedsRenewal reports whether certPEM should be replaced: it does not
// parse, is not signed by ca, is not for want, or has less than a third of
// its life left.
func (ca *CA) NeedsRenewal(certPEM []byte, want Request, now time.Time) bool {
	cert, err := parseCert(certPEM)
	if err != nil {
		return true
	}
	if cert.CheckSignatureFrom(ca.Cert) != nil || cert.Subject.CommonName != want.CommonName {
		return true
	}
	if !sameStrings(cert.DNSNames, want.DNSNames) || len(cert.IPAddresses) != len(want.IPs) {
		return true
	}
	life := cert.NotAfter.Sub(cert.NotBefore)
	return now.After(cert.NotAfter.Add(-life / 3))
}

// RenewAt is when certPEM should be renewed; the zero time if it does not parse.
func RenewAt(certPEM []byte) time.Time {
	cert, err := parseCert(certPEM)
	if err != nil {
		return time.Time{}
	}
	return cert.NotAfter.Add(-cert.NotAfter.Sub(cert.NotBefore) / 3)
}

func parseCert(certPEM []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func encodePEM(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
