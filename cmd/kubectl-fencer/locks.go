package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/lockview"
)

// lockRow is one row of `locks`.
type lockRow struct {
	Namespace string    `json:"namespace"`
	Key       string    `json:"key"`
	Token     int64     `json:"token"`
	Holder    string    `json:"holder"`
	HolderUID string    `json:"holderUID"`
	Since     time.Time `json:"since"`
	Waiting   int       `json:"waiting"`
}

// lockFlags say where the read-only viewer's credentials are.
type lockFlags struct {
	all        bool
	secret     string
	secretNS   string
	endpoints  string
	serverName string
}

func locksCmd(o *options) *cobra.Command {
	f := &lockFlags{}
	cmd := &cobra.Command{
		Use:   "locks [KEY-PREFIX]",
		Short: "The keyed locks held: key, token, holder, since when, and how many wait",
		Long: `The keyed locks held in the namespace (all namespaces with -A), whose keys
start with KEY-PREFIX. It reads etcd as the install's read-only lock viewer:
its certificate comes from the viewer Secret in the manager's namespace
(--viewer-secret, --fencer-namespace), so reading it takes RBAC on that one
Secret, and the viewer can read keyed locks and nothing else.

SINCE is how long the holder has held the lock: from its acquisition, or,
for one that queued, from when its turn came.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := o.client()
			if err != nil {
				return err
			}
			if f.all {
				ns = ""
			}
			keyPrefix := ""
			if len(args) == 1 {
				keyPrefix = args[0]
			}
			locks, err := readLocks(cmd.Context(), c, f, ns, keyPrefix)
			if err != nil {
				return err
			}
			return printLocks(o, locks, f.all, time.Now())
		},
	}
	cmd.Flags().BoolVarP(&f.all, "all-namespaces", "A", false, "List the locks of every namespace")
	cmd.Flags().StringVar(&f.secret, "viewer-secret", "fencer-etcd-viewer", "The lock viewer's credentials Secret (the chart's <fullname>-etcd-viewer)")
	cmd.Flags().StringVar(&f.secretNS, "fencer-namespace", "fencer-system", "The namespace fencer's manager runs in, which holds the viewer Secret")
	cmd.Flags().StringVar(&f.endpoints, "etcd-endpoints", "", "etcd client URLs to use instead of the Secret's, e.g. https://127.0.0.1:2379 through kubectl port-forward")
	cmd.Flags().StringVar(&f.serverName, "etcd-server-name", "", "The name to verify etcd's certificate for, when --etcd-endpoints reaches it by another (a port-forward: the Service's name, e.g. fencer-etcd.fencer-system.svc)")
	return cmd
}

func readLocks(ctx context.Context, c client.Client, f *lockFlags, ns, keyPrefix string) ([]lockview.Lock, error) {
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: f.secretNS, Name: f.secret}, &s); err != nil {
		return nil, fmt.Errorf("the lock viewer's Secret %s/%s: %w (the manager writes it with --etcd-viewer-secret; see --viewer-secret and --fencer-namespace)", f.secretNS, f.secret, err)
	}
	cfg, err := viewerConfig(&s, f)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd: %w", err)
	}
	defer cli.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	locks, err := lockview.List(rctx, cli, string(s.Data["prefix"]), ns, keyPrefix)
	if errors.Is(rctx.Err(), context.DeadlineExceeded) {
		// The etcd client retries a failed handshake until the deadline and
		// says only that: one handshake of its own says why.
		if herr := handshake(ctx, cfg); herr != nil {
			err = herr
		}
		return nil, fmt.Errorf("etcd at %s did not answer within 10s: %w (from outside the cluster, port-forward etcd's Service and pass --etcd-endpoints and --etcd-server-name)", cfg.Endpoints, err)
	}
	return locks, err
}

// handshake makes one TLS handshake with each of cfg's endpoints, as the
// etcd client makes it, and returns the first failure.
func handshake(ctx context.Context, cfg clientv3.Config) error {
	for _, ep := range cfg.Endpoints {
		addr, name, ok := dialTarget(ep)
		if !ok {
			continue // not a TCP address: the client's own error stands
		}
		d := tls.Dialer{Config: cfg.TLS.Clone()}
		d.Config.ServerName = name
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := d.DialContext(hctx, "tcp", addr)
		cancel()
		if err != nil {
			return fmt.Errorf("the TLS handshake with %s: %w", ep, err)
		}
		_ = conn.Close()
	}
	return nil
}

// dialTarget is the address the etcd client dials for endpoint ep, and the
// name gRPC checks its certificate for: a URL's host as it is written (the
// scheme only says whether to use TLS), or a bare host:port as it is; an
// IPv6 address's name without its brackets. A unix socket is not one.
func dialTarget(ep string) (addr, name string, ok bool) {
	if !strings.Contains(ep, "://") {
		host, _, err := net.SplitHostPort(ep)
		if err != nil {
			host = ep
		}
		return ep, host, true
	}
	u, err := url.Parse(ep)
	if err != nil || strings.HasPrefix(u.Scheme, "unix") {
		return "", "", false
	}
	return u.Host, u.Hostname(), true
}

// verifiedAs checks etcd's certificate chain against roots for name. The
// etcd client hands gRPC its endpoints, and gRPC sets tls.Config's
// ServerName to the address it dials, so a ServerName set here would be
// overwritten: the check by name is made here instead.
func verifiedAs(name string, roots *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("etcd presented no certificate")
		}
		intermediates := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			intermediates.AddCert(c)
		}
		opts := x509.VerifyOptions{DNSName: name, Roots: roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			return fmt.Errorf("etcd's certificate for --etcd-server-name %s: %w", name, err)
		}
		return nil
	}
}

// viewerConfig is an etcd client configuration from the viewer Secret's
// certificate, kept in memory.
func viewerConfig(s *corev1.Secret, f *lockFlags) (clientv3.Config, error) {
	pair, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	if err != nil {
		return clientv3.Config{}, fmt.Errorf("the lock viewer's Secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data["ca.crt"]) {
		return clientv3.Config{}, fmt.Errorf("the lock viewer's Secret %s/%s has no ca.crt", s.Namespace, s.Name)
	}
	endpoints := string(s.Data["endpoints"])
	if f.endpoints != "" {
		endpoints = f.endpoints
	}
	if endpoints == "" {
		return clientv3.Config{}, fmt.Errorf("the lock viewer's Secret %s/%s has no endpoints; pass --etcd-endpoints", s.Namespace, s.Name)
	}
	if err := etcdstore.CheckTLSEndpoints(strings.Split(endpoints, ",")); err != nil {
		return clientv3.Config{}, fmt.Errorf("the lock viewer's etcd endpoints: %w (pass --etcd-endpoints)", err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}
	if f.serverName != "" {
		// Verified by name in VerifyConnection, not skipped.
		tc.InsecureSkipVerify = true //nolint:gosec // the chain and the name are checked by verifiedAs
		tc.VerifyConnection = verifiedAs(f.serverName, pool)
	}
	return clientv3.Config{
		Endpoints:   strings.Split(endpoints, ","),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		TLS:         tc,
	}, nil
}

func printLocks(o *options, locks []lockview.Lock, all bool, now time.Time) error {
	rows := make([]lockRow, len(locks))
	for i, l := range locks {
		rows[i] = lockRow{Namespace: l.Namespace, Key: l.Key, Token: l.Token, Holder: l.Pod, HolderUID: l.PodUID, Since: l.Since, Waiting: l.Waiting}
	}
	return o.print(rows, func(w *tabwriter.Writer) {
		if len(rows) == 0 {
			fmt.Fprintln(w, "No keyed locks held.")
			return
		}
		head := "KEY\tTOKEN\tHOLDER\tHOLDER-UID\tSINCE\tWAITING"
		if all {
			head = "NAMESPACE\t" + head
		}
		fmt.Fprintln(w, head)
		for _, r := range rows {
			if all {
				fmt.Fprintf(w, "%s\t", r.Namespace)
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%d\n", r.Key, r.Token, orDash(r.Holder), orDash(r.HolderUID), ago(now, r.Since), r.Waiting)
		}
	})
}
