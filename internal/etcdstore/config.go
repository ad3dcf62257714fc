// Package etcdstore is everything in fencer that speaks etcd: connection
// settings, the key layout of docs/concepts.md, and (later) the grant, renew,
// release and allocate transactions.
package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// Config is how fencer reaches etcd.
type Config struct {
	// Endpoints are the etcd client URLs.
	Endpoints []string
	// Prefix is the root of fencer's keys, without a trailing slash.
	Prefix string
	// CAFile, CertFile and KeyFile configure client TLS; all empty means plain
	// connections.
	CAFile, CertFile, KeyFile string
	// DialTimeout bounds connecting to etcd.
	DialTimeout time.Duration
	// RequestTimeout bounds each etcd request fencer makes, so a reconcile
	// never hangs on an unreachable etcd.
	RequestTimeout time.Duration
	// TLS, when set, is used instead of the files: the manager's
	// self-issued identity (internal/identity).
	TLS *tls.Config
}

// DefaultPrefix is the root of fencer's etcd keys unless --etcd-prefix says otherwise.
const DefaultPrefix = etcdkeys.DefaultPrefix

// BindFlags registers the --etcd-* flags on fs.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.Func("etcd-endpoints", "Comma-separated etcd client URLs, e.g. https://etcd-0:2379,https://etcd-1:2379. Required.", func(s string) error {
		c.Endpoints = SplitList(s)
		return nil
	})
	fs.StringVar(&c.Prefix, "etcd-prefix", DefaultPrefix, "Root of fencer's etcd keys. Two fencer installs sharing one etcd need different prefixes.")
	fs.StringVar(&c.CAFile, "etcd-ca-file", "", "PEM CA bundle that verifies the etcd servers' certificates. Enables TLS.")
	fs.StringVar(&c.CertFile, "etcd-cert-file", "", "PEM client certificate for etcd (with --etcd-key-file).")
	fs.StringVar(&c.KeyFile, "etcd-key-file", "", "PEM private key of --etcd-cert-file.")
	fs.DurationVar(&c.DialTimeout, "etcd-dial-timeout", 5*time.Second, "How long to wait for a connection to etcd.")
	fs.DurationVar(&c.RequestTimeout, "etcd-request-timeout", 3*time.Second, "Timeout of each etcd request (read, grant, release); 0 means the default, 3s. A Lease whose request times out reports Held=Unknown, reason EtcdUnavailable.")
}

// SplitList splits a comma-separated flag value, dropping blanks.
func SplitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// CheckEndpoint refuses an etcd client URL the etcd client could never
// dial: another scheme, no host, a port that is not a number. (The client
// takes them, and retries until every request's deadline.)
func CheckEndpoint(e string) error {
	if !strings.HasPrefix(e, "http://") && !strings.HasPrefix(e, "https://") {
		return fmt.Errorf("%q must start with http:// or https://", e)
	}
	u, err := url.Parse(e)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", e, err)
	}
	if u.Hostname() == "" {
		return fmt.Errorf("%q has no host: give host:port, e.g. https://etcd-0:2379", e)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q: port %q is not a port number", e, p)
		}
	}
	return nil
}

// CheckTLSEndpoints refuses an http:// URL among endpoints of a client
// that is to use TLS: the etcd client sends an http:// endpoint plain
// text, silently dropping the CA check and the client certificate.
func CheckTLSEndpoints(endpoints []string) error {
	for _, e := range endpoints {
		if rest, ok := strings.CutPrefix(e, "http://"); ok {
			return fmt.Errorf("%q is http://, but TLS is set up: the etcd client would send it plain text, without the CA check or the client certificate; write https://%s", e, rest)
		}
	}
	return nil
}

// Validate reports the first setting that cannot work, naming the flag.
func (c *Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return errors.New("--etcd-endpoints is required: give the etcd client URLs, e.g. http://127.0.0.1:2379")
	}
	for _, e := range c.Endpoints {
		if err := CheckEndpoint(e); err != nil {
			return fmt.Errorf("--etcd-endpoints: %w", err)
		}
	}
	if err := etcdkeys.CheckPrefix(c.Prefix); err != nil {
		return fmt.Errorf("--etcd-prefix: %w", err)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("--etcd-cert-file and --etcd-key-file must be given together")
	}
	if c.TLS != nil || c.CAFile != "" || c.CertFile != "" {
		if err := CheckTLSEndpoints(c.Endpoints); err != nil {
			return fmt.Errorf("--etcd-endpoints: %w", err)
		}
	}
	if c.DialTimeout <= 0 {
		return fmt.Errorf("--etcd-dial-timeout must be positive, got %s", c.DialTimeout)
	}
	if c.RequestTimeout < 0 {
		return fmt.Errorf("--etcd-request-timeout must not be negative, got %s", c.RequestTimeout)
	}
	return nil
}

func (c *Config) tlsConfig() (*tls.Config, error) {
	if c.TLS != nil {
		return c.TLS, nil
	}
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	info := transport.TLSInfo{TrustedCAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile}
	tc, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd client TLS: %w", err)
	}
	return tc, nil
}

// CheckTLS loads the TLS files now, so a wrong path is reported before
// anything else is started.
func (c *Config) CheckTLS() error {
	_, err := c.tlsConfig()
	return err
}

// Connect validates c and opens an etcd client. It does not wait for etcd to
// answer: readiness (Ping) reports that, so the manager can start while etcd
// is still coming up.
func Connect(c Config) (*clientv3.Client, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	tc, err := c.tlsConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints,
		DialTimeout: c.DialTimeout,
		TLS:         tc,
		Logger:      zap.NewNop(),
		// Keepalives notice a dead member quickly, so the balancer moves on.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", c.Endpoints, err)
	}
	return cli, nil
}

// Ping does a linearizable read, which needs a quorum: the one answer that
// means fencer can grant. A reachable member cut off from its peers fails it.
func Ping(ctx context.Context, cli *clientv3.Client, prefix string) error {
	_, err := cli.Get(ctx, etcdkeys.LeaderKey(prefix), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("etcd %v: %w", cli.Endpoints(), err)
	}
	return nil
}
