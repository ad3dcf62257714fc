package controllers

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/identity"
)

// Keys a namespace's etcd credentials Secret has besides ca.crt, tls.crt
// and tls.key; pkg/fence.LoadEtcdAccess reads them where it is mounted.
const (
	credEndpoints = "endpoints"
	credPrefix    = "prefix"
)

// identityResync bounds how long a deleted or edited credentials Secret
// stays wrong: Secrets are not watched, since caching every Secret of the
// cluster would cost the manager far more memory than it saves.
const identityResync = 10 * time.Minute

// namespaceRecheck is how soon a namespace that should have an identity
// but does not exist (yet) is looked at again.
const namespaceRecheck = 5 * time.Second

// IdentityReconciler gives every namespace that has a Lease or an IDRange,
// and each one named by --identity-namespaces, an etcd identity
// (docs/install.md): an etcd user and role limited to that
// namespace's keys, and a Secret with a client certificate for it, renewed
// well before it expires. A namespace whose last fencer object is gone loses
// both.
type IdentityReconciler struct {
	client.Client
	// Reader reads Secrets uncached.
	Reader client.Reader
	Etcd   *clientv3.Client
	CA     *identity.CA
	// Prefix is the install's etcd key prefix.
	Prefix string
	// Endpoints are the etcd client URLs workloads use.
	Endpoints []string
	// SecretName is the credentials Secret's name in every namespace.
	SecretName string
	// Always are namespaces that get an identity with no Lease or IDRange
	// (--identity-namespaces): their workloads use keyed locks only.
	Always []string
	Clock  clock.Clock

	wake waker[fencerv1.Lease, *fencerv1.Lease]
	// missingLogged holds the --identity-namespaces entries already
	// reported missing (reportMissing).
	missingLogged sync.Map
}

// Secrets can be created anywhere (create cannot be narrowed to a name), but
// read, changed and deleted only under the credentials Secret's name; the
// chart renames fencer-etcd-client to its own --etcd-credentials-secret.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;update;delete,resourceNames=fencer-etcd-client

// The namespace's UID is part of its etcd user's name (identity.NamespaceUser).
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// Reconcile brings one namespace's etcd identity in line; the request's
// Namespace names it.
func (r *IdentityReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns := req.Namespace
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("namespace", ns, "etcdRole", identity.NamespaceRole(r.Prefix, ns)))
	used, direct, err := r.fencerObjects(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !used {
		return ctrl.Result{}, r.remove(ctx, ns)
	}
	uid, err := r.namespaceUID(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	if uid == "" {
		// Gone, or not created yet (an --identity-namespaces entry): no
		// identity without the object; look again, as no event of a
		// namespace wakes this controller.
		r.reportMissing(ctx, ns)
		return ctrl.Result{RequeueAfter: namespaceRecheck}, r.remove(ctx, ns)
	}
	// Without auth every certificate of the CA opens all of etcd: issue
	// none until it is on.
	st, err := r.Etcd.AuthStatus(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !st.Enabled {
		ctrl.LoggerFrom(ctx).Info("etcd auth is off, so a namespace identity would open all of etcd; issuing none until it is on (--etcd-enable-auth, or `etcdctl auth enable`)")
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}
	if err := identity.EnsureNamespace(ctx, r.Etcd, r.Prefix, ns, uid, direct); err != nil {
		return ctrl.Result{}, err
	}
	// The namespace may have been deleted and created again since its UID
	// was read: then the users just made right are the old object's, and
	// the Secret must not get its certificate. Start over, at once.
	if now, err := r.namespaceUID(ctx, ns); err != nil || now != uid {
		return ctrl.Result{RequeueAfter: time.Millisecond}, err
	}
	renewAt, err := r.ensureSecret(ctx, ns, uid)
	if err != nil {
		return requeueOnConflict(err)
	}
	wait := min(renewAt.Sub(r.Clock.Now()), identityResync)
	return ctrl.Result{RequeueAfter: max(wait, time.Second)}, nil
}

// reportMissing logs, once per process, that a namespace named by
// --identity-namespaces does not exist: a misspelt entry is otherwise
// looked for every 5 s without a word. A namespace that has fencer objects
// but is gone is being deleted; its identity goes with it, unlogged.
func (r *IdentityReconciler) reportMissing(ctx context.Context, ns string) {
	if !slices.Contains(r.Always, ns) {
		return
	}
	if _, logged := r.missingLogged.LoadOrStore(ns, true); !logged {
		ctrl.LoggerFrom(ctx).Info("the namespace named by --identity-namespaces does not exist; it gets its identity once it is created (looked for every 5s)")
	}
}

// fencerObjects reports whether ns has a Lease or an IDRange, or is one of
// Always, and the names of its Direct Leases, whose holders renew their
// grants themselves.
func (r *IdentityReconciler) fencerObjects(ctx context.Context, ns string) (used bool, direct []string, err error) {
	// From the apiserver, not the cache: a cache behind it may still list
	// a deleted namespace's Leases while the namespace read next is its
	// successor, which would get the old Direct Leases' keys to write.
	var leases fencerv1.LeaseList
	if err := r.Reader.List(ctx, &leases, client.InNamespace(ns)); err != nil {
		return false, nil, err
	}
	for _, l := range leases.Items {
		if l.Spec.Renewal == fencerv1.RenewalDirect && l.DeletionTimestamp.IsZero() {
			direct = append(direct, l.Name)
		}
	}
	var ranges fencerv1.IDRangeList
	if err := r.Reader.List(ctx, &ranges, client.InNamespace(ns), client.Limit(1)); err != nil {
		return false, nil, err
	}
	return len(leases.Items)+len(ranges.Items) > 0 || slices.Contains(r.Always, ns), direct, nil
}

// namespaceUID is the UID of namespace ns as the apiserver has it now, ""
// when it is gone: its identity goes with it. A namespace being deleted
// keeps its identity while its pods, which may still hold locks and
// grants, shut down.
func (r *IdentityReconciler) namespaceUID(ctx context.Context, ns string) (types.UID, error) {
	var n corev1.Namespace
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	return n.UID, nil
}

func (r *IdentityReconciler) want(ns string, uid types.UID) identity.Request {
	return identity.Request{CommonName: identity.NamespaceUser(r.Prefix, ns, uid)}
}

// ensureSecret issues the namespace's certificate when the Secret is
// missing, stale (for another user: a namespace of the same name before,
// or a release before the UID was part of the user) or about to expire,
// and returns when to renew it next.
func (r *IdentityReconciler) ensureSecret(ctx context.Context, ns string, uid types.UID) (time.Time, error) {
	key := types.NamespacedName{Namespace: ns, Name: r.SecretName}
	extra := map[string][]byte{credEndpoints: []byte(strings.Join(r.Endpoints, ",")), credPrefix: []byte(r.Prefix)}
	renewAt, issued, err := identity.EnsureCertSecret(ctx, r.Reader, r.Client, r.CA, key, r.want(ns, uid), extra, r.Clock.Now())
	if err == nil && issued {
		ctrl.LoggerFrom(ctx).Info("issued the namespace's etcd credentials", "secret", r.SecretName, "renewAt", renewAt)
	}
	return renewAt, err
}

func (r *IdentityReconciler) managed(s *corev1.Secret) bool {
	return s.Labels[fencerv1.ManagedByLabel] == fencerv1.ManagedByValue
}

// remove takes a namespace's identity away once it has no fencer objects.
func (r *IdentityReconciler) remove(ctx context.Context, ns string) error {
	var s corev1.Secret
	err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: r.SecretName}, &s)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	case r.managed(&s):
		if err := r.Delete(ctx, &s); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return identity.RemoveNamespace(ctx, r.Etcd, r.Prefix, ns)
}

// SetupWithManager reconciles a namespace whenever one of its Leases or
// IDRanges changes, and every namespace that has an etcd user at the
// leader's start and every identityResync: a namespace whose last object
// went while no leader watched still loses its identity.
func (r *IdentityReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.wake = newWaker[fencerv1.Lease]()
	if err := mgr.Add(manager.RunnableFunc(r.sweep)); err != nil {
		return err
	}
	toNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace()}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("identity").
		Watches(&fencerv1.Lease{}, toNamespace, builder.WithPredicates(specOrDeletion)).
		Watches(&fencerv1.IDRange{}, toNamespace, builder.WithPredicates(specOrDeletion)).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.alwaysNamespace), builder.OnlyMetadata, builder.WithPredicates(createdOrDeleted)).
		WatchesRawSource(r.wake.source()).
		Complete(r)
}

// alwaysNamespace wakes a namespace named by --identity-namespaces when the
// namespace object is created or deleted. It has no Lease or IDRange whose
// change would wake it: without this, one deleted and created again
// between two sweeps kept its predecessor's etcd user, and the old
// certificates with it, and got no Secret of its own, for up to
// identityResync.
func (r *IdentityReconciler) alwaysNamespace(_ context.Context, o client.Object) []reconcile.Request {
	if !slices.Contains(r.Always, o.GetName()) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetName()}}}
}

// createdOrDeleted passes a namespace's creation and its deletion, which
// change its UID and so its identity's user, and nothing else. An update
// passes when the UID changed: a namespace deleted and created again while
// the watch was down comes back from the relist as one update.
var createdOrDeleted = predicate.Funcs{
	UpdateFunc:  func(e event.UpdateEvent) bool { return e.ObjectOld.GetUID() != e.ObjectNew.GetUID() },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// specOrDeletion passes the object changes a namespace's identity depends
// on: an object created or deleted, its spec (a Lease's renewal mode)
// changed, or its deletion begun. A status write, which every grant and
// every block is, changes none of them: waking the namespace for it cost
// an etcd auth read and a Secret read per grant.
var specOrDeletion = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	o, n := e.ObjectOld, e.ObjectNew
	return o.GetGeneration() != n.GetGeneration() || !o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp())
}}

// sweep queues every namespace with an etcd user, now and every
// identityResync, until ctx ends. It runs on the leader only.
func (r *IdentityReconciler) sweep(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("identity-sweep")
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		namespaces, err := identity.Namespaces(ctx, r.Etcd, r.Prefix)
		if err != nil {
			log.Error(err, "listing the namespaces' etcd users")
			return
		}
		// Always: a namespace named by --identity-namespaces has no object
		// whose change would wake it.
		for _, ns := range append(namespaces, r.Always...) {
			r.wake.wake(ns, "")
		}
	}, identityResync)
	return nil
}
