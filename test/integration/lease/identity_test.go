package lease

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// mountCredentials writes ns's fencer-etcd Secret to a directory, as the
// kubelet mounts it, once the controller has issued it.
func mountCredentials(t *testing.T, ns string) string {
	t.Helper()
	var s corev1.Secret
	eventually(t, 20*time.Second, "the namespace's fencer-etcd-client Secret", func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "fencer-etcd-client"}, &s)
	})
	dir := t.TempDir()
	for k, v := range s.Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestNamespaceGetsItsOwnEtcdIdentity: a namespace with a Lease gets a
// Secret whose identity reads its lease keys, writes its data keys, and
// cannot write its lease keys or touch another namespace; the identity is
// gone once the namespace's last fencer object is.
func TestNamespaceGetsItsOwnEtcdIdentity(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	a, b := namespace(t), namespace(t)
	la, lb := newLease(a, "report", "w", 30), newLease(b, "report", "w", 30)
	create(t, la)
	create(t, lb)
	readyPod(t, a, "w-0", "w")
	readyPod(t, b, "w-0", "w")

	dir := mountCredentials(t, a)
	access, err := fence.LoadEtcdAccess(dir)
	if err != nil {
		t.Fatal(err)
	}
	if access.Prefix != prefix {
		t.Errorf("prefix %q, want %q", access.Prefix, prefix)
	}
	// The user names the namespace object, not its name alone: a namespace
	// created again under the name gets another user (install.md).
	var nsA corev1.Namespace
	if err := k8s.Get(ctx, client.ObjectKey{Name: a}, &nsA); err != nil {
		t.Fatal(err)
	}
	if cn := certCommonName(t, filepath.Join(dir, "tls.crt")); cn != identity.NamespaceUser(prefix, a, nsA.UID) {
		t.Errorf("the certificate's CommonName (etcd user) is %q, want %q", cn, identity.NamespaceUser(prefix, a, nsA.UID))
	}
	cli, err := clientv3.New(access.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	var tok int64
	eventually(t, 20*time.Second, "a's grant, read with a's identity", func() error {
		resp, err := cli.Get(ctx, etcdkeys.LeaseKey(prefix, a, "report"))
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 {
			return errors.New("no grant yet")
		}
		tok = resp.Kvs[0].CreateRevision
		return nil
	})
	resp, err := fence.NewTxn(cli, access.Prefix, a, fence.Token{Lease: "report", Value: tok}).
		Then(clientv3.OpPut(etcdkeys.DataPrefix(prefix, a)+"index", "v1")).Commit(ctx)
	if err != nil || !resp.Succeeded {
		t.Errorf("fenced write to a data key under the live token: %v, succeeded %v", err, resp != nil && resp.Succeeded)
	}
	for what, op := range map[string]func() error{
		"write its own lease key":  func() error { _, err := cli.Put(ctx, etcdkeys.LeaseKey(prefix, a, "report"), "{}"); return err },
		"read b's lease key":       func() error { _, err := cli.Get(ctx, etcdkeys.LeaseKey(prefix, b, "report")); return err },
		"write b's data key":       func() error { _, err := cli.Put(ctx, etcdkeys.DataPrefix(prefix, b)+"index", "x"); return err },
		"mint a lease key in b":    func() error { _, err := cli.Put(ctx, etcdkeys.LeaseKey(prefix, b, "new"), "{}"); return err },
		"read the controller key":  func() error { _, err := cli.Get(ctx, etcdkeys.LeaderKey(prefix)); return err },
		"delete its own lease key": func() error { _, err := cli.Delete(ctx, etcdkeys.LeaseKey(prefix, a, "report")); return err },
	} {
		if err := op(); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s: want permission denied, got %v", what, err)
		}
	}

	// The last fencer object goes: so do the Secret and the etcd user.
	if err := k8s.Delete(ctx, la); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a's Secret deleted", func() error {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: a, Name: "fencer-etcd-client"}, &corev1.Secret{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%w)", err)
	})
	eventually(t, 10*time.Second, "a's etcd user removed", func() error {
		fresh, err := clientv3.New(access.Config)
		if err != nil {
			return err
		}
		defer fresh.Close()
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := fresh.Get(rctx, etcdkeys.DataPrefix(prefix, a)+"index"); err == nil {
			return errors.New("a's old certificate still reads a's data key")
		}
		return nil
	})
}

// TestOrphanedIdentityIsRemoved: an etcd user left for a namespace whose
// last fencer object went while no manager ran is found by the leader's
// sweep and removed.
func TestOrphanedIdentityIsRemoved(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	if err := identity.EnsureNamespace(ctx, fx.EtcdCli, prefix, ns, "uid-orphaned", nil); err != nil {
		t.Fatal(err)
	}
	startController(t, "c1")
	eventually(t, 30*time.Second, "the orphaned etcd user removed", func() error {
		users, err := identity.Namespaces(ctx, fx.EtcdCli, prefix)
		if err != nil {
			return err
		}
		for _, u := range users {
			if u == ns {
				return fmt.Errorf("%s still has an etcd user", ns)
			}
		}
		return nil
	})
}

func certCommonName(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		t.Fatalf("%s holds no PEM block", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.Subject.CommonName
}
