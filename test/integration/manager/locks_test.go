package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/support/framework"
)

// TestKeyedLocksThroughTheManager runs the manager as the chart does and
// checks what keyed locks need of it: a namespace with no Lease or IDRange
// gets an identity when --identity-namespaces names it, and locks with it;
// the viewer's Secret reads locks and writes nothing; and a revision below
// the one recorded closes keyed locks until etcd passes it.
func TestKeyedLocksThroughTheManager(t *testing.T) {
	ctx := context.Background()
	const ns, app = "locks-mgr", "locks-only"
	cl, pki, etcd := lockedDownManager(t, ns, "--etcd-viewer-secret=etcd-viewer", "--identity-namespaces="+app)
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: app}}); err != nil {
		t.Fatal(err)
	}

	var creds corev1.Secret
	waitFor(t, "the lock-only namespace's credentials", func() error {
		return cl.Get(ctx, client.ObjectKey{Namespace: app, Name: "fencer-etcd-client"}, &creds)
	})
	appCli := secretClient(t, &creds, etcd.Endpoint)
	l, err := fence.NewLocker(appCli, string(creds.Data["prefix"]), app, fence.LockerOptions{Pod: "p", PodUID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	lk, err := l.Lock(ctx, "dir/1")
	if err != nil {
		t.Fatalf("locking with a --identity-namespaces identity: %v", err)
	}

	var viewer corev1.Secret
	waitFor(t, "the viewer's Secret", func() error {
		return cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "etcd-viewer"}, &viewer)
	})
	if got := string(viewer.Data["prefix"]); got != "/fencer" || len(viewer.Data["endpoints"]) == 0 {
		t.Fatalf("viewer Secret prefix %q endpoints %q", got, viewer.Data["endpoints"])
	}
	view := secretClient(t, &viewer, etcd.Endpoint)
	waitFor(t, "the viewer reading the locks", func() error {
		resp, err := view.Get(ctx, etcdkeys.LocksPrefix("/fencer"), clientv3.WithPrefix())
		if err != nil {
			return err
		}
		waiters := 0 // the session's marker key is none
		for _, kv := range resp.Kvs {
			if _, _, _, ok := etcdkeys.ParseLockWaiterKey("/fencer", string(kv.Key)); ok {
				waiters++
			}
		}
		if waiters != 1 {
			return fmt.Errorf("%d lock waiters seen, want 1", waiters)
		}
		return nil
	})
	for what, op := range map[string]func() error{
		"delete a lock": func() error {
			_, err := view.Delete(ctx, etcdkeys.LockWaiterKey("/fencer", app, "dir/1", lk.Tokens()[0].Waiter))
			return err
		},
		"write a lock": func() error {
			_, err := view.Put(ctx, etcdkeys.LockWaiterKey("/fencer", app, "x", "w"), "{}")
			return err
		},
		"read a lease": func() error { _, err := view.Get(ctx, etcdkeys.LeaseKey("/fencer", app, "l")); return err },
	} {
		if err := op(); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("the viewer could %s: %v", what, err)
		}
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// etcd "went back": the recorded revision is above etcd's.
	var record corev1.ConfigMap
	waitFor(t, "the recorded revision", func() error {
		return cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fencer-etcd-revision"}, &record)
	})
	if n, err := strconv.ParseInt(record.Data["revision"], 10, 64); err != nil || n <= 0 {
		t.Fatalf("recorded revision %q", record.Data["revision"])
	}
	setRevision := func(rev string) func(client.Object) {
		return func(o client.Object) { o.(*corev1.ConfigMap).Data["revision"] = rev }
	}
	if err := framework.Update(ctx, t, cl, client.ObjectKeyFromObject(&record), &record, setRevision("100000000")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keyed locks closed", func() error {
		lk, err := l.Lock(ctx, "dir/1")
		if err == nil {
			_ = lk.Unlock(ctx)
			return errors.New("a lock was granted below the recorded revision")
		}
		if !errors.Is(err, fence.ErrEtcdRegressed) {
			t.Fatalf("Lock below the floor: %v, want ErrEtcdRegressed", err)
		}
		return nil
	})
	// The recovery from a false alarm (docs/operations.md): the record put
	// back below etcd's revision, and the floor deleted by hand. Either
	// alone keeps the locks closed (TestLockFloorCheckKeepsAFloorWhoseRecordWasLost):
	// the record alone leaves the floor above it, and the floor alone is
	// written again from the record.
	if err := framework.Update(ctx, t, cl, client.ObjectKeyFromObject(&record), &record, setRevision("1")); err != nil {
		t.Fatal(err)
	}
	root, err := pki.Client([]string{etcd.Endpoint}, "manager")
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := root.Delete(ctx, etcdkeys.LockFloorKey("/fencer")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keyed locks open again", func() error {
		lk, err := l.Lock(ctx, "dir/1")
		if err != nil {
			return err
		}
		return lk.Unlock(ctx)
	})
}

// secretClient connects to etcd with a credentials Secret's certificate.
func secretClient(t *testing.T, s *corev1.Secret, endpoint string) *clientv3.Client {
	t.Helper()
	dir := t.TempDir()
	access, err := writeAccess(dir, s, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	access.Config.Logger = zap.NewNop()
	cli, err := clientv3.New(access.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// writeAccess mounts the Secret's keys in dir, as a pod's volume would,
// with the test's etcd endpoint, and loads them as the SDK does.
func writeAccess(dir string, s *corev1.Secret, endpoint string) (fence.EtcdAccess, error) {
	for k, v := range s.Data {
		if k == "endpoints" {
			v = []byte(strings.Replace(endpoint, "http://", "https://", 1))
		}
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			return fence.EtcdAccess{}, err
		}
	}
	return fence.LoadEtcdAccess(dir)
}
