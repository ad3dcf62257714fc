package identity

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// Keys of the CA Secret.
const (
	caCertKey = "ca.crt"
	caKeyKey  = "ca.key"
)

// LoadOrCreateCA reads the CA from Secret key, creating it first if it does
// not exist. Replicas starting together may race: the one whose create
// loses reads the winner's CA, so all of them share one. With create false
// (cert-manager issues the CA) it waits for the Secret instead.
func LoadOrCreateCA(ctx context.Context, c client.Client, key types.NamespacedName, create bool) (*CA, error) {
	var s corev1.Secret
	err := c.Get(ctx, key, &s)
	for !create && apierrors.IsNotFound(err) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the etcd CA secret %s: %w", key, ctx.Err())
		case <-time.After(2 * time.Second):
		}
		err = c.Get(ctx, key, &s)
	}
	if apierrors.IsNotFound(err) {
		ca, cerr := NewCA("fencer-etcd-ca", time.Now())
		if cerr != nil {
			return nil, cerr
		}
		keyPEM, cerr := ca.KeyPEM()
		if cerr != nil {
			return nil, cerr
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{fencerv1.ManagedByLabel: fencerv1.ManagedByValue}},
			Data:       map[string][]byte{caCertKey: ca.CertPEM, caKeyKey: keyPEM},
		}
		if err = c.Create(ctx, &s); err == nil {
			return ca, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the etcd CA secret %s: %w", key, err)
		}
		err = c.Get(ctx, key, &s)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the etcd CA secret %s: %w", key, err)
	}
	certPEM, keyPEM := s.Data[caCertKey], s.Data[caKeyKey]
	if len(keyPEM) == 0 {
		// cert-manager keeps a CA Certificate's own pair in tls.crt and tls.key.
		certPEM, keyPEM = s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("etcd CA secret %s (keys ca.crt and ca.key, or tls.crt and tls.key): %w", key, err)
	}
	return ca, nil
}

// SelfIssued is a client TLS configuration for the manager: it trusts the
// CA for etcd's servers and presents a certificate for user that it issues
// itself from the CA, in memory, and renews before it expires. No key of the
// manager's identity is ever stored.
func SelfIssued(ca *CA, user string) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	var (
		mu      sync.Mutex
		cur     *tls.Certificate
		renewAt time.Time
	)
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    pool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			mu.Lock()
			defer mu.Unlock()
			if cur != nil && time.Now().Before(renewAt) {
				return cur, nil
			}
			issued, err := ca.Issue(Request{CommonName: user}, time.Now())
			if err != nil {
				return nil, err
			}
			pair, err := tls.X509KeyPair(issued.CertPEM, issued.KeyPEM)
			if err != nil {
				return nil, err
			}
			cur, renewAt = &pair, RenewAt(issued.CertPEM)
			return cur, nil
		},
	}
}

// CertSecret keeps a certificate from the CA (ca.crt, tls.crt, tls.key) in
// a Secret: the bundled etcd members' serving certificate, or the backup
// job's client identity. It is renewed when a third of its life is left;
// etcd and fencer read the mounted files on every new connection, so a
// renewal needs no restart.
type CertSecret struct {
	// Client writes the Secret; Reader reads it uncached (a cached read
	// would watch every Secret of the cluster, which the manager may not).
	Client client.Client
	Reader client.Reader
	CA     *CA
	Key    types.NamespacedName
	// Request is what to issue; a server certificate's Names that parse
	// as IP addresses become IP SANs.
	Request Request
	// Extra are further keys of the Secret, such as the endpoints and
	// prefix a client needs besides its certificate.
	Extra map[string][]byte
	Log   logr.Logger
}

// ServerRequest is the etcd members' certificate for names (DNS names
// and IP addresses).
func ServerRequest(names []string) Request {
	r := Request{CommonName: "etcd", Server: true}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			r.IPs = append(r.IPs, ip)
		} else {
			r.DNSNames = append(r.DNSNames, n)
		}
	}
	return r
}

// Start checks the Secret at once and then hourly, until ctx ends. Every
// replica runs it: members must get a certificate before any manager can
// reach etcd, and optimistic concurrency settles races.
func (s *CertSecret) Start(ctx context.Context) error {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := s.Ensure(ctx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			s.Log.Error(err, "etcd certificate", "secret", s.Key)
		}
	}, time.Hour)
	return nil
}

// NeedLeaderElection is false: see Start.
func (s *CertSecret) NeedLeaderElection() bool { return false }

// Ensure issues the certificate if the Secret lacks a current one.
func (s *CertSecret) Ensure(ctx context.Context) error {
	_, issued, err := EnsureCertSecret(ctx, s.Reader, s.Client, s.CA, s.Key, s.Request, s.Extra, time.Now())
	if err == nil && issued {
		s.Log.Info("issued an etcd certificate", "secret", s.Key, "commonName", s.Request.CommonName)
	}
	return err
}

// EnsureCertSecret keeps a TLS Secret (ca.crt, tls.crt, tls.key, and the
// extra keys) holding a current certificate from ca for r: it issues one
// when the Secret is missing, holds another CA's certificate, differing
// extra data, or a certificate due for renewal. It never touches a Secret
// without fencer's label. It returns when to renew next, and whether it
// issued now. Secrets are read through reader, uncached: caching them would
// mean watching every Secret of the cluster.
func EnsureCertSecret(ctx context.Context, reader client.Reader, writer client.Writer, ca *CA, key types.NamespacedName, r Request, extra map[string][]byte, now time.Time) (renewAt time.Time, issued bool, err error) {
	var sec corev1.Secret
	err = reader.Get(ctx, key, &sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, false, err
	}
	exists := err == nil
	if exists && sec.Labels[fencerv1.ManagedByLabel] != fencerv1.ManagedByValue {
		return time.Time{}, false, fmt.Errorf("secret %s exists and is not fencer's (label %s=%s missing): rename it or delete it so fencer can issue its certificate", key, fencerv1.ManagedByLabel, fencerv1.ManagedByValue)
	}
	if exists && current(&sec, ca, r, extra, now) {
		return RenewAt(sec.Data[corev1.TLSCertKey]), false, nil
	}
	c, err := ca.Issue(r, now)
	if err != nil {
		return time.Time{}, false, err
	}
	sec.ObjectMeta = metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{fencerv1.ManagedByLabel: fencerv1.ManagedByValue}, ResourceVersion: sec.ResourceVersion}
	sec.Type = corev1.SecretTypeTLS
	sec.Data = map[string][]byte{caCertKey: ca.CertPEM, corev1.TLSCertKey: c.CertPEM, corev1.TLSPrivateKeyKey: c.KeyPEM}
	maps.Copy(sec.Data, extra)
	if exists {
		err = writer.Update(ctx, &sec)
	} else {
		err = writer.Create(ctx, &sec)
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return RenewAt(c.CertPEM), true, nil
}

// current reports whether sec already holds what EnsureCertSecret would write.
func current(sec *corev1.Secret, ca *CA, r Request, extra map[string][]byte, now time.Time) bool {
	if !bytes.Equal(sec.Data[caCertKey], ca.CertPEM) || ca.NeedsRenewal(sec.Data[corev1.TLSCertKey], r, now) {
		return false
	}
	for k, v := range extra {
		if !bytes.Equal(sec.Data[k], v) {
			return false
		}
	}
	return true
}

// AuthEnabler turns etcd auth on once etcd answers, retrying until then.
type AuthEnabler struct {
	Etcd *clientv3.Client
	// Root are the users given etcd's root role: the manager's, and the
	// backup job's if there is one.
	Root []string
	// ViewerPrefix, when set, also keeps the read-only lock viewer of the
	// install with that key prefix (EnsureViewer).
	ViewerPrefix string
	Log          logr.Logger
	enabled      atomic.Bool
}

// Checker is a readiness check that fails until auth is on, so a replica
// does not serve before etcd is locked.
func (a *AuthEnabler) Checker(*http.Request) error {
	if !a.enabled.Load() {
		return errors.New("etcd auth is not enabled yet")
	}
	return nil
}

// Start retries EnableAuth every few seconds until it succeeds or ctx ends.
func (a *AuthEnabler) Start(ctx context.Context) error {
	err := wait.PollUntilContextCancel(ctx, 3*time.Second, true, func(ctx context.Context) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := EnableAuth(rctx, a.Etcd, a.Root...); err != nil {
			a.Log.Info("etcd auth not enabled yet; retrying", "reason", err.Error())
			return false, nil
		}
		if a.ViewerPrefix != "" {
			if err := EnsureViewer(rctx, a.Etcd, a.ViewerPrefix); err != nil {
				a.Log.Info("the lock viewer's etcd user is not set up yet; retrying", "reason", err.Error())
				return false, nil
			}
		}
		a.enabled.Store(true)
		a.Log.Info("etcd auth is on", "rootUsers", a.Root)
		return true, nil
	})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// NeedLeaderElection is false: EnableAuth is idempotent and etcd must be
// locked before the first grant.
func (a *AuthEnabler) NeedLeaderElection() bool { return false }
