package webhook

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// CertGatedServer starts the webhook server only once its certificate and
// key exist, so a replica whose certificate is still being issued (a Secret
// not yet mounted, cert-manager or the rotator still at work) stays up and
// not Ready, instead of crash-looping. Readiness comes from the inner
// server's StartedChecker.
//
// With ClientAuth set, every path it serves answers only callers that
// present a client certificate ClientAuth accepts; the inner server must
// have been built with ClientAuth.TLS among its TLSOpts.
type CertGatedServer struct {
	ctrlwebhook.Server
	CertDir    string
	ClientAuth *ClientAuth
}

// Register serves hook at path, behind ClientAuth when it is set.
func (s *CertGatedServer) Register(path string, hook http.Handler) {
	if s.ClientAuth != nil {
		hook = s.ClientAuth.Wrap(hook)
	}
	s.Server.Register(path, hook)
}

// Start waits for tls.crt and tls.key in CertDir, then serves.
func (s *CertGatedServer) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("webhook")
	crt, key := filepath.Join(s.CertDir, "tls.crt"), filepath.Join(s.CertDir, "tls.key")
	for waited := false; !exists(crt) || !exists(key); waited = true {
		if !waited {
			log.Info("waiting for the webhook serving certificate", "certDir", s.CertDir)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	return s.Server.Start(ctx)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
