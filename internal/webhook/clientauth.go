package webhook

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"slices"
)

// ClientAuth lets only the apiserver call the webhook paths. The webhook
// server cannot otherwise tell who calls it, and a review posted by any pod
// that reaches the port would be judged: its refusal logged, counted and
// put in a Warning Event naming whatever user it claims, the live token and
// holder of any Lease disclosed, and with the Lease deletion webhook a
// tenure ended. The apiserver presents a client certificate to a webhook
// when its admission configuration (--admission-control-config-file, a
// kubeConfigFile entry for the webhook's Service) gives it one.
type ClientAuth struct {
	// CAs verify the caller's certificate.
	CAs *x509.CertPool
	// Names, when not empty, are the only common names or DNS names a
	// caller's certificate may carry: for a CA that signs other clients'
	// certificates too.
	Names []string
}

// LoadClientAuth reads a PEM bundle of CA certificates from file.
func LoadClientAuth(file string, names []string) (*ClientAuth, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--webhook-client-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, fmt.Errorf("--webhook-client-ca-file %s holds no PEM certificate (want the CA that signs the apiserver's webhook client certificate)", file)
	}
	return &ClientAuth{CAs: pool, Names: names}, nil
}

// TLS asks every client for a certificate and verifies one given. It does
// not require one at the handshake: the readiness check dials the port
// without a certificate. Wrap refuses the requests that came without.
func (a *ClientAuth) TLS(c *tls.Config) {
	c.ClientCAs = a.CAs
	c.ClientAuth = tls.VerifyClientCertIfGiven
}

// Wrap answers 403, before any review is read, a request whose connection
// presented no certificate that verified against CAs, or one whose names
// are not in Names.
func (a *ClientAuth) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := a.check(r.TLS); err != nil {
			http.Error(w, "fencer: "+err.Error(), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (a *ClientAuth) check(state *tls.ConnectionState) error {
	if state == nil || len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return fmt.Errorf("this webhook answers only the apiserver: the caller presented no client certificate signed by the --webhook-client-ca-file CA")
	}
	if len(a.Names) == 0 {
		return nil
	}
	leaf := state.VerifiedChains[0][0]
	if slices.Contains(a.Names, leaf.Subject.CommonName) || slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(a.Names, n) }) {
		return nil
	}
	return fmt.Errorf("this webhook answers only the apiserver: the client certificate's names (CN %q, DNS %v) are not in --webhook-client-names", leaf.Subject.CommonName, leaf.DNSNames)
}
