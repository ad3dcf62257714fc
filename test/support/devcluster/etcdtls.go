package devcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/internal/identity"
)

// EtcdPKI is a locked-down etcd's certificates, as files in Dir: the CA
// (ca.crt, ca.key), the members' server certificate (server.crt, server.key)
// and the fencer manager's client certificate (manager.crt, manager.key),
// whose CommonName is identity.ManagerUser(Prefix). It is what the chart's
// manager creates in the cluster, made on disk for dev clusters and tests.
type EtcdPKI struct {
	Dir    string
	Prefix string
	CA     *identity.CA
}

// NewEtcdPKI creates the CA and certificates for an etcd on loopback.
func NewEtcdPKI(dir, prefix string) (*EtcdPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	now := time.Now()
	ca, err := identity.NewCA("fencer-etcd-ca", now)
	if err != nil {
		return nil, err
	}
	p := &EtcdPKI{Dir: dir, Prefix: prefix, CA: ca}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := p.write("ca", ca.CertPEM, keyPEM); err != nil {
		return nil, err
	}
	// The bridge address too: pods on the real node connect there.
	server := identity.Request{CommonName: "etcd", Server: true, DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(realBridgeIP)}}
	if err := p.Issue("server", server); err != nil {
		return nil, err
	}
	return p, p.Issue("manager", identity.Request{CommonName: identity.ManagerUser(prefix)})
}

// Path names a file of the PKI.
func (p *EtcdPKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// Issue writes <name>.crt and <name>.key for r.
func (p *EtcdPKI) Issue(name string, r identity.Request) error {
	c, err := p.CA.Issue(r, time.Now())
	if err != nil {
		return err
	}
	return p.write(name, c.CertPEM, c.KeyPEM)
}

func (p *EtcdPKI) write(name string, certPEM, keyPEM []byte) error {
	if err := os.WriteFile(p.Path(name+".crt"), certPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(p.Path(name+".key"), keyPEM, 0o600)
}

// TLS is a client configuration presenting the certificate <name>.crt.
func (p *EtcdPKI) TLS(name string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(p.Path(name+".crt"), p.Path(name+".key"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.CA.CertPEM)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// Flags are the manager's --etcd-* flags to connect as <name>.crt.
func (p *EtcdPKI) Flags(endpoints []string, name string) []string {
	return []string{
		"--etcd-endpoints=" + strings.Join(endpoints, ","),
		"--etcd-ca-file=" + p.Path("ca.crt"),
		"--etcd-cert-file=" + p.Path(name+".crt"),
		"--etcd-key-file=" + p.Path(name+".key"),
	}
}

// Client connects to endpoints as the certificate <name>.crt.
func (p *EtcdPKI) Client(endpoints []string, name string) (*clientv3.Client, error) {
	tc, err := p.TLS(name)
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// serverArgs are the etcd flags for TLS between members and with clients,
// with client certificates required: their CommonName is the etcd user.
func (p *EtcdPKI) serverArgs() []string {
	return []string{
		"--client-cert-auth",
		"--trusted-ca-file=" + p.Path("ca.crt"),
		"--cert-file=" + p.Path("server.crt"),
		"--key-file=" + p.Path("server.key"),
		"--peer-client-cert-auth",
		"--peer-trusted-ca-file=" + p.Path("ca.crt"),
		"--peer-cert-file=" + p.Path("server.crt"),
		"--peer-key-file=" + p.Path("server.key"),
		// The CA signs client identities too; only members may be peers.
		"--peer-cert-allowed-cn=etcd",
	}
}

// Secure makes e serve TLS only and require client certificates from pki.
// Call it before the first Start.
func (e *Etcd) Secure(pki *EtcdPKI) {
	e.pki = pki
	e.Endpoint = strings.Replace(e.Endpoint, "http://", "https://", 1)
	e.peer = strings.Replace(e.peer, "http://", "https://", 1)
	e.cluster = e.name + "=" + e.peer
}

// EnableAuth turns on etcd authentication with the manager's user as root,
// as the manager does at start. Only for an etcd made Secure; Start does it.
func (e *Etcd) EnableAuth(ctx context.Context) error {
	if e.pki == nil {
		return fmt.Errorf("etcd %s: auth needs TLS client certificates; call Secure first", e.name)
	}
	cli, err := e.pki.Client([]string{e.Endpoint}, "manager")
	if err != nil {
		return err
	}
	defer cli.Close()
	return identity.EnableAuth(ctx, cli, identity.ManagerUser(e.pki.Prefix))
}

func (e *Etcd) healthClient() (*http.Client, error) {
	if e.pki == nil {
		return http.DefaultClient, nil
	}
	tc, err := e.pki.TLS("manager")
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 5 * time.Second}, nil
}

// SecureCluster makes every member of a NewEtcdCluster Secure, peers included.
func SecureCluster(members []*Etcd, pki *EtcdPKI) {
	var initial []string
	for _, m := range members {
		m.Secure(pki)
		initial = append(initial, m.cluster)
	}
	for _, m := range members {
		m.cluster = strings.Join(initial, ",")
	}
}

// PeerURL is the member's peer URL.
func (e *Etcd) PeerURL() string { return e.peer }
