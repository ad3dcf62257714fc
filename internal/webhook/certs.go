package webhook

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultConfigName names both the Mutating- and the
// ValidatingWebhookConfiguration of an install (config/webhook/manifests.yaml);
// the chart names them <release>-fencing, so several installs can coexist.
const DefaultConfigName = "fencer-fencing"

// RotationOptions configure self-managed webhook certificates.
type RotationOptions struct {
	// Secret holds the CA and serving certificate, shared by every replica.
	Secret types.NamespacedName
	// Service is the webhook Service; the certificate is issued for
	// <service>.<namespace>.svc.
	Service string
	// CertDir is where the serving certificate is written for the server.
	CertDir string
	// ConfigName names the webhook configurations the CA is injected into.
	ConfigName string
}

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch,namespace=fencer-system
// The rotator watches webhook configurations (list and watch cannot be
// narrowed to a name) but may change only fencer's own:
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations;mutatingwebhookconfigurations,verbs=list;watch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations;mutatingwebhookconfigurations,verbs=get;update;patch,resourceNames=fencer-fencing
// (The chart renames fencer-fencing to its own --webhook-config-name.)

// AddCertRotation has every replica keep the webhook's certificate valid
// with open-policy-agent/cert-controller: it creates a CA and serving
// certificate in the Secret, rotates them before they expire, writes them to
// CertDir (certSync), and injects the CA into both webhook configurations. The
// webhook server (a CertGatedServer) starts once the files exist.
func AddCertRotation(ctx context.Context, mgr ctrl.Manager, o RotationOptions) error {
	if o.Secret.Namespace == "" || o.Secret.Name == "" || o.Service == "" || o.ConfigName == "" {
		return fmt.Errorf("certificate rotation needs the Secret's namespace and name, the webhook Service's name and the webhook configurations' name")
	}
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	if err := ensureSecret(ctx, direct, o.Secret); err != nil {
		return err
	}
	if err := mgr.Add(&certSync{client: direct, secret: o.Secret, dir: o.CertDir, every: 2 * time.Second}); err != nil {
		return err
	}
	return rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      o.Secret,
		CertDir:        o.CertDir,
		CAName:         "fencer-webhook-ca",
		CAOrganization: "fencer",
		DNSName:        fmt.Sprintf("%s.%s.svc", o.Service, o.Secret.Namespace),
		ExtraDNSNames:  []string{fmt.Sprintf("%s.%s.svc.cluster.local", o.Service, o.Secret.Namespace)},
		IsReady:        make(chan struct{}),
		Webhooks:       []rotator.WebhookInfo{{Name: o.ConfigName, Type: rotator.Mutating}, {Name: o.ConfigName, Type: rotator.Validating}},
		// Every replica serves the webhook, so every replica keeps its files
		// current, not only the leader.
		RequireLeaderElection: false,
	})
}

// ensureSecret creates the (empty) certificate Secret if it is missing:
// cert-controller only updates it, and an install that forgot it should not
// leave fencer crash-looping.
func ensureSecret(ctx context.Context, c client.Client, key types.NamespacedName) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	err := c.Create(ctx, s)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the webhook certificate Secret %s: %w", key, err)
	}
	return nil
}

// certSync copies the serving certificate from the Secret into the cert
// directory on every replica, replacing the kubelet's Secret volume, which
// refreshes only on its sync period and does not exist out of a cluster. The
// webhook server's certificate watcher picks up each change.
type certSync struct {
	client client.Client
	secret types.NamespacedName
	dir    string
	every  time.Duration
}

func (s *certSync) NeedLeaderElection() bool { return false }

func (s *certSync) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("webhook-cert-sync").WithValues("secret", s.secret, "certDir", s.dir)
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	for {
		if err := s.sync(ctx); err != nil {
			log.Error(err, "syncing the webhook certificate")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.every):
		}
	}
}

func (s *certSync) sync(ctx context.Context) error {
	sec := &corev1.Secret{}
	if err := s.client.Get(ctx, s.secret, sec); err != nil {
		return err
	}
	crt, key := sec.Data["tls.crt"], sec.Data["tls.key"]
	if len(crt) == 0 || len(key) == 0 {
		return nil // not issued yet
	}
	// Key first: the server loads once tls.crt exists.
	if err := writeIfChanged(filepath.Join(s.dir, "tls.key"), key); err != nil {
		return err
	}
	return writeIfChanged(filepath.Join(s.dir, "tls.crt"), crt)
}

// writeIfChanged replaces path atomically when its content differs.
func writeIfChanged(path string, data []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
