package manager

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// TestManagerLocksDownItsEtcd runs the manager binary as the chart does for
// the bundled etcd: it creates the CA Secret, issues the members' server
// certificate into a Secret before etcd exists, connects with an identity
// it issues itself, turns auth on, and only then reports Ready.
func TestManagerLocksDownItsEtcd(t *testing.T) {
	ctx := context.Background()
	_, pki, etcd := lockedDownManager(t, "etcd-access")
	mgr, err := pki.Client([]string{etcd.Endpoint}, "manager")
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	st, err := mgr.AuthStatus(ctx)
	if err != nil || !st.Enabled {
		t.Fatalf("etcd auth after the manager became Ready: %+v, %v", st, err)
	}
	// A certificate of the right CA but of no etcd user opens nothing.
	stranger, err := pki.Client([]string{etcd.Endpoint}, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := stranger.Get(rctx, "/fencer/leases/default/x"); err == nil {
		t.Fatal("a certificate for an unknown user read a lease key")
	}
}

// lockedDownManager runs the manager binary for namespace ns as the chart
// runs it with the bundled etcd (args added), starts that etcd from the
// Secrets the manager writes, and waits until the manager is Ready. pki
// issues further identities.
func lockedDownManager(t *testing.T, ns string, args ...string) (cl client.Client, pki *devcluster.EtcdPKI, etcd *devcluster.Etcd) {
	t.Helper()
	ctx := context.Background()
	var err error
	cl, err = client.New(env.Config, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	etcd, err = devcluster.NewEtcd(bin, dir, "etcd")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "https" + etcd.Endpoint[len("http"):]
	r := startFencer(t, "fencer", append([]string{"--leader-elect=false", "--etcd-endpoints=" + endpoint, "--webhook-namespace=" + ns,
		"--etcd-pki-secret=etcd-ca", "--etcd-server-secret=etcd-server", "--etcd-server-names=localhost,127.0.0.1", "--etcd-enable-auth"}, args...)...)

	var server corev1.Secret
	waitFor(t, "the etcd server Secret", func() error {
		return cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "etcd-server"}, &server)
	})
	var caSecret corev1.Secret
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "etcd-ca"}, &caSecret); err != nil {
		t.Fatal(err)
	}
	ca, err := identity.ParseCA(caSecret.Data["ca.crt"], caSecret.Data["ca.key"])
	if err != nil {
		t.Fatal(err)
	}
	// etcd mounts the Secret, as the chart's StatefulSet does.
	pkiDir := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{"ca.crt": "ca.crt", "tls.crt": "server.crt", "tls.key": "server.key"} {
		if err := os.WriteFile(filepath.Join(pkiDir, to), server.Data[from], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pki = &devcluster.EtcdPKI{Dir: pkiDir, Prefix: "/fencer", CA: ca}
	for name, cn := range map[string]string{"manager": identity.ManagerUser("/fencer"), "stranger": "stranger"} {
		if err := pki.Issue(name, identity.Request{CommonName: cn}); err != nil {
			t.Fatal(err)
		}
	}
	etcd.Secure(pki)
	etcd.ManagerEnablesAuth = true
	if err := etcd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = etcd.Stop() })

	waitStatus(t, r.probeURL+"/readyz", http.StatusOK)
	return cl, pki, etcd
}

func waitFor(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(fmt.Errorf("%s: %w", what, err))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
