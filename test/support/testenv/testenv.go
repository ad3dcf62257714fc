// Package testenv starts envtest (a real kube-apiserver and etcd) with the
// binaries `make tools` built into bin/, and fencer's CRDs installed.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fencerv1alpha1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/devcluster"
)

// RepoRoot is the directory of fencer's go.mod, found from the working
// directory upwards (go test runs in the package's directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if raw, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && isFencerModule(raw) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("fencer's go.mod not found above the working directory")
		}
		dir = parent
	}
}

func isFencerModule(gomod []byte) bool {
	const want = "module github.com/fencer-io/fencer\n"
	return len(gomod) >= len(want) && string(gomod[:len(want)]) == want
}

// BinDir is where the tool binaries are: $FENCER_BIN, else <repo>/bin. It
// fails, naming the fix, when a binary envtest needs is missing: a test run
// must never quietly skip the integration tests.
func BinDir() (string, error) {
	dir := os.Getenv("FENCER_BIN")
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s is missing from %s: run `make tools` (or `make test`, which builds it)", b, dir)
		}
	}
	return dir, nil
}

// Scheme knows the built-in kinds and fencer's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(fencerv1alpha1.AddToScheme(s))
	return s
}

// New returns an envtest environment with fencer's CRDs, not yet started.
func New() (*envtest.Environment, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return &envtest.Environment{
		BinaryAssetsDirectory: bin,
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                Scheme(),
	}, nil
}

// Start starts an apiserver with fencer's CRDs for one test, stopped when
// the test ends, and returns it with an admin client of it.
func Start(t testing.TB) (*envtest.Environment, client.Client) {
	t.Helper()
	env, err := New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return env, c
}

// Etcd starts a single-member etcd from the tool binaries for one test (or
// benchmark), with extraArgs added to its flags, and returns its client
// URL; it stops when the test ends.
func Etcd(t testing.TB, extraArgs ...string) string {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	e, err := devcluster.NewEtcd(bin, t.TempDir(), "etcd")
	if err != nil {
		t.Fatal(err)
	}
	e.ExtraArgs = extraArgs
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	return e.Endpoint
}

// SecureEtcd is a single-member etcd as the chart runs it: TLS only, client
// certificates required, auth on, and the manager's certificate holding the
// root role. PKI issues further identities.
type SecureEtcd struct {
	Endpoint string
	// PeerURL is the member's peer URL.
	PeerURL string
	PKI     *devcluster.EtcdPKI
}

// StartSecureEtcd starts a SecureEtcd for fencer keys below prefix for one
// test; it stops when the test ends.
func StartSecureEtcd(t testing.TB, prefix string) *SecureEtcd {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pki, err := devcluster.NewEtcdPKI(filepath.Join(dir, "pki"), prefix)
	if err != nil {
		t.Fatal(err)
	}
	e, err := devcluster.NewEtcd(bin, dir, "etcd")
	if err != nil {
		t.Fatal(err)
	}
	e.Secure(pki)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	return &SecureEtcd{Endpoint: e.Endpoint, PeerURL: e.PeerURL(), PKI: pki}
}

// Client connects as the certificate <name>.crt of PKI ("manager", or one
// issued with PKI.Issue); it is closed when the test ends.
func (s *SecureEtcd) Client(t testing.TB, name string) *clientv3.Client {
	t.Helper()
	cli, err := s.PKI.Client([]string{s.Endpoint}, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
