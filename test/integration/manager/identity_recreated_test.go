package manager

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// A namespace named by --identity-namespaces is deleted and created again
// under its name: a new object, a new UID, perhaps a new tenant. It has no
// Lease or IDRange whose change would wake its identity, so the namespace
// itself must: within moments, not at the next sweep (10 minutes), the
// certificate of the namespace gone opens nothing of its successor, and
// the successor has credentials of its own.
func TestANamespaceCreatedAgainGetsAnIdentityOfItsOwn(t *testing.T) {
	ctx := context.Background()
	const ns, app = "recreate-mgr", "recreate-locks"
	cl, _, etcd := lockedDownManager(t, ns, "--identity-namespaces="+app)
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: app}}); err != nil {
		t.Fatal(err)
	}
	var creds corev1.Secret
	waitFor(t, "the namespace's credentials", func() error {
		return cl.Get(ctx, client.ObjectKey{Namespace: app, Name: "fencer-etcd-client"}, &creds)
	})
	old := secretClient(t, &creds, etcd.Endpoint)
	key := etcdkeys.NamespaceLocksPrefix("/fencer", app) + "dir%2F1/w"
	if _, err := old.Put(ctx, key, "{}"); err != nil {
		t.Fatalf("the namespace's own certificate: %v", err)
	}
	var first corev1.Namespace
	if err := cl.Get(ctx, client.ObjectKey{Name: app}, &first); err != nil {
		t.Fatal(err)
	}
	if err := cl.Delete(ctx, &creds); err != nil {
		t.Fatal(err)
	}
	if err := cl.Delete(ctx, &first); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(env.Config)
	waitFor(t, "the namespace gone", func() error {
		n, err := cs.CoreV1().Namespaces().Get(ctx, app, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		n.Spec.Finalizers = nil // envtest runs no namespace controller
		_, _ = cs.CoreV1().Namespaces().Finalize(ctx, n, metav1.UpdateOptions{})
		return errors.New("still there")
	})
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: app}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the certificate of the namespace gone refused, and credentials for its successor", func() error {
		if _, err := old.Put(ctx, key, `{"pod":"intruder"}`); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			return errors.New("the certificate of the namespace gone still writes its successor's lock keys")
		}
		var again corev1.Secret
		return cl.Get(ctx, client.ObjectKey{Namespace: app, Name: "fencer-etcd-client"}, &again)
	})
}
