package fence

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultCredentialsDir is where the examples mount a namespace's etcd
// credentials Secret (named fencer-etcd-client, or <release>-etcd-client
// for a Helm release not named fencer).
const DefaultCredentialsDir = "/var/run/fencer/etcd"

// EtcdAccess is a namespace's etcd identity, read from the mounted
// credentials Secret fencer keeps in every namespace that has a Lease or an
// IDRange. Its user reads the namespace's lease keys, uses its IDRanges and
// writes keys below etcdkeys.DataPrefix; nothing else.
type EtcdAccess struct {
	// Config connects as the namespace's identity; pass it to clientv3.New.
	Config clientv3.Config
	// Prefix is the install's key prefix, for NewTxn, Compare and idgen.
	Prefix string
}

// LoadEtcdAccess reads the credentials mounted at dir (ca.crt, tls.crt,
// tls.key, endpoints, prefix). The client certificate is read again on
// every new connection, so the renewals fencer writes into the Secret reach
// a long-running process without a restart.
func LoadEtcdAccess(dir string) (EtcdAccess, error) {
	read := func(name string) (string, error) {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("fencer etcd credentials: %w (mount the namespace's fencer-etcd-client Secret at %s)", err, dir)
		}
		return strings.TrimSpace(string(raw)), nil
	}
	endpoints, err := read("endpoints")
	if err != nil {
		return EtcdAccess{}, err
	}
	prefix, err := read("prefix")
	if err != nil {
		return EtcdAccess{}, err
	}
	caPEM, err := read("ca.crt")
	if err != nil {
		return EtcdAccess{}, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(caPEM)) {
		return EtcdAccess{}, fmt.Errorf("fencer etcd credentials: %s holds no PEM certificate", filepath.Join(dir, "ca.crt"))
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	// Fail now, not at the first connection, if the pair is unusable.
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		return EtcdAccess{}, fmt.Errorf("fencer etcd credentials: %w", err)
	}
	eps := strings.Split(endpoints, ",")
	if endpoints == "" {
		return EtcdAccess{}, errors.New("fencer etcd credentials: the endpoints file is empty")
	}
	for _, e := range eps {
		// The etcd client would send an http:// endpoint plain text,
		// without the CA check or the certificate.
		if strings.HasPrefix(e, "http://") {
			return EtcdAccess{}, fmt.Errorf("fencer etcd credentials: endpoint %q is http://, but these credentials are for TLS; fencer's --etcd-workload-endpoints must be https://", e)
		}
	}
	return EtcdAccess{
		Prefix: prefix,
		Config: clientv3.Config{
			Endpoints:   eps,
			DialTimeout: 5 * time.Second,
			TLS: &tls.Config{
				MinVersion: tls.VersionTLS12,
				RootCAs:    pool,
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
					d := pairDir(dir)
					pair, err := tls.LoadX509KeyPair(filepath.Join(d, "tls.crt"), filepath.Join(d, "tls.key"))
					return &pair, err
				},
			},
			// A connection whose packets are dropped is found dead, and
			// replaced, instead of holding every call until its deadline.
			DialKeepAliveTime:    10 * time.Second,
			DialKeepAliveTimeout: 5 * time.Second,
		},
	}, nil
}

// pairDir is the directory to read the certificate and its key from as one
// snapshot. A Secret volume keeps its files in a timestamped directory that
// its ..data link names, and the kubelet swaps that link when the Secret
// changes: reading both files through one resolution of the link never
// pairs a renewed certificate with the old key, as two reads through
// dir/tls.crt and dir/tls.key could. A dir that is no Secret volume is
// read as it is.
func pairDir(dir string) string {
	if d, err := filepath.EvalSymlinks(filepath.Join(dir, "..data")); err == nil {
		return d
	}
	return dir
}
