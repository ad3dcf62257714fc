package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/holder"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/internal/renew"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// statusRefresh is how often a held Lease's status (renewTime, expireTime)
// is refreshed while nothing else changes. Renewals themselves happen in
// etcd every TTL/3; writing each to the apiserver would cost more than it
// tells.
const statusRefresh = 30 * time.Second

// statusRefreshRate caps those refreshes, over all held Leases, in writes
// per second: with 10,000 Leases a 30 s refresh would cost 333 writes/s for
// a timestamp, so the interval grows with the number held instead.
const statusRefreshRate = 10

// refreshInterval is when a held Lease's status is next refreshed. A Lease
// with a refresh still ahead keeps it. Otherwise it gets a new slot, at
// least statusRefresh from now and 1/statusRefreshRate after the latest
// slot handed out, or one TTL from now if that is later. Slots are handed
// out in order, so refreshes never come faster than statusRefreshRate,
// even after a burst of grants, when every Lease granted at once would
// otherwise be due at once. A long TTL delays only its own Lease.
func (r *LeaseReconciler) refreshInterval(key string, ttl time.Duration, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if at, ok := r.refreshAt[key]; ok && at.After(now) {
		return at.Sub(now)
	}
	slot := now.Add(statusRefresh)
	if next := r.lastRefresh.Add(time.Second / statusRefreshRate); slot.Before(next) {
		slot = next
	}
	r.lastRefresh = slot
	at := slot
	if long := now.Add(ttl); at.Before(long) {
		at = long
	}
	r.refreshAt[key] = at
	return at.Sub(now)
}

// refreshDue reports whether key's status refresh slot has come. A Lease
// without a slot (a grant adopted from another replica) keeps the renewal
// shown until it gets one; showRenewal replaces one that is not of this
// grant.
func (r *LeaseReconciler) refreshDue(key string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.refreshAt[key]
	return ok && !now.Before(at)
}

// forget drops what the reconciler keeps about a Lease that is gone.
func (r *LeaseReconciler) forget(key string) {
	r.mu.Lock()
	delete(r.refreshAt, key)
	delete(r.endAt, key)
	delete(r.deletedAt, key)
	r.mu.Unlock()
}

func (r *LeaseReconciler) forgetRefresh(key string) {
	r.mu.Lock()
	delete(r.refreshAt, key)
	r.mu.Unlock()
}

// LeaseReconciler grants Leases in etcd, renews PodReady grants, and
// publishes tokens on holder pods.
type LeaseReconciler struct {
	client.Client
	Store    *etcdstore.Store
	Elector  *etcdstore.Elector
	Renewer  *renew.Renewer
	Recorder events.EventRecorder
	Clock    clock.Clock
	// APIReader confirms, uncached, that a Lease the cache does not have
	// is gone before its grant is released (gone).
	APIReader client.Reader
	// Workers is how many Leases are reconciled at once (0 means 1). The
	// workqueue never hands one Lease to two workers; shared state below is
	// under mu, and the store and renewer are safe for concurrent use.
	Workers int

	// wake carries Leases to reconcile from outside the informers: etcd
	// watch events, lost keepalives and a new election term.
	wake waker[fencerv1.Lease, *fencerv1.Lease]

	mu sync.Mutex
	// endAt is when a PodReady tenure whose holder stopped qualifying ends:
	// one TTL after its last renewal.
	endAt map[string]time.Time
	// deletedAt is when the etcd watch saw a lease key go, for the failover
	// duration metric.
	deletedAt map[string]time.Time
	// refreshAt is each held Lease's next status refresh slot, and
	// lastRefresh the latest slot handed out (refreshInterval).
	refreshAt   map[string]time.Time
	lastRefresh time.Time
}

// NewLeaseReconciler wires a reconciler; the Renewer's lost callback wakes it.
func NewLeaseReconciler(c client.Client, store *etcdstore.Store, elector *etcdstore.Elector, rec events.EventRecorder, clk clock.Clock) *LeaseReconciler {
	r := &LeaseReconciler{
		Client: c, Store: store, Elector: elector, Recorder: rec, Clock: clk,
		wake:      newWaker[fencerv1.Lease](),
		endAt:     map[string]time.Time{},
		deletedAt: map[string]time.Time{},
		refreshAt: map[string]time.Time{},
	}
	r.Renewer = renewerWaking(store, clk, r.wake, func(key string) (string, string, bool) {
		return etcdkeys.ParseLeaseKey(store.Prefix(), key)
	})
	return r
}

// +kubebuilder:rbac:groups=fencer.io,resources=leases,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=fencer.io,resources=leases/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fencer.io,resources=leases/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// Reconcile grants, renews or releases one Lease and writes its status once.
func (r *LeaseReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lease := &fencerv1.Lease{}
	log := ctrl.LoggerFrom(ctx).WithValues("lease", req.NamespacedName)
	ctx = ctrl.LoggerInto(ctx, log)
	if err := r.Get(ctx, req.NamespacedName, lease); err != nil {
		if apierrors.IsNotFound(err) {
			return r.gone(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	if !lease.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, lease)
	}
	if controllerutil.AddFinalizer(lease, fencerv1.LeaseFinalizer) {
		if err := r.Update(ctx, lease); err != nil {
			return requeueOnConflict(err)
		}
	}
	before := lease.Status.DeepCopy()
	out, err := r.reconcileGrant(ctx, lease)
	if err != nil {
		return ctrl.Result{}, err
	}
	return finish(ctx, r.Client, r.Recorder, lease, before, &lease.Status, out)
}

// reconcileGrant brings etcd and the pods in line with the Lease's spec and
// sets lease.Status to match. It returns an error only for failures the
// workqueue should retry with backoff.
func (r *LeaseReconciler) reconcileGrant(ctx context.Context, lease *fencerv1.Lease) (outcome, error) {
	var out outcome
	now := r.Clock.Now()
	lease.Status.ObservedGeneration = lease.Generation
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)

	pods, err := r.candidates(ctx, lease)
	if err != nil {
		return out, err
	}
	// Read first: reads need no leadership, and a failed read is how an
	// etcd outage shows, even after it has also cost us the election.
	grant, rev, err := r.Store.ReadGrant(ctx, lease.Namespace, lease.Name)
	if err != nil {
		r.etcdUnavailable(lease, &out, err)
		return out, nil
	}
	if _, err := r.Elector.Term(); err != nil {
		// Not leading etcd (yet): the next term wakes every Lease.
		out.result.RequeueAfter = time.Second
		return out, nil
	}

	if grant != nil && grant.Unissued {
		return out, r.dropUnissued(ctx, lease, grant, &out)
	}
	if grant != nil && grant.Token < lease.Status.HighestToken() {
		// A grant below a token already issued came back with an etcd
		// restored from an old snapshot: adopting it would reissue a token.
		return out, r.dropRegressed(ctx, lease, grant, &out)
	}
	if grant != nil {
		ended, err := r.keepOrEnd(ctx, lease, grant, pods, now, &out)
		if err != nil {
			r.etcdUnavailable(lease, &out, err)
			return out, nil
		}
		if !ended {
			r.publishAfterStatus(&out, lease, pods, grant)
			return out, nil
		}
		grant = nil
	} else if open := openTenure(lease); open != nil {
		// The key is gone without our release: the etcd lease expired. If we
		// had stopped renewing it, etcd merely beat our own release to it
		// (its lessor may run before our timer), and the cause is ours.
		why := fencerv1.TenureExpired
		if _, ok := r.takeEnding(key); ok {
			why = whyNotQualified(findPod(pods, open.Holder, string(open.HolderUID)))
		} else if released, err := r.releasedByHolder(ctx, lease); err != nil {
			r.etcdUnavailable(lease, &out, err)
			return out, nil
		} else if released {
			why = fencerv1.TenureReleased
		}
		closeTenure(lease, now, why)
		if why == fencerv1.TenureReleased {
			metrics.LeaseReleases.WithLabelValues(string(why)).Inc()
			out.event(corev1.EventTypeNormal, fencerv1.ReasonReleased, "%s released its tenure (token %d)", open.Holder, open.Token)
		} else {
			metrics.LeaseExpiries.Inc()
			out.event(corev1.EventTypeNormal, fencerv1.ReasonExpired, "tenure of %s (token %d) expired in etcd (%s)", open.Holder, open.Token, why)
		}
	}

	clearHolder(lease)
	r.forgetRefresh(key)
	if lease.Spec.Suspend || len(pods) == 0 {
		// No successor is coming soon; a later grant is no failover.
		r.forgetDeletion(key)
	}
	if lease.Spec.Suspend {
		setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonSuspended, "spec.suspend is true: the lease is granted to no one")
		r.publishAfterStatus(&out, lease, pods, nil)
		return out, nil
	}
	next := holder.Pick(pods, passOver(lease)...)
	if next == nil {
		noCandidates(lease, &out)
		r.publishAfterStatus(&out, lease, pods, nil)
		return out, nil
	}
	if r.revisionRegressed(lease, rev, &out) {
		// No tenure is open: no pod keeps a token, whatever etcd does.
		r.publishAfterStatus(&out, lease, pods, nil)
		return out, nil
	}
	ttl := time.Duration(lease.Spec.TTLSeconds) * time.Second
	grant, err = r.Store.GrantLease(ctx, lease.Namespace, lease.Name, next.Name, string(next.UID), ttl, now)
	switch {
	case errors.Is(err, etcdstore.ErrHeld):
		out.result.RequeueAfter = time.Millisecond // granted meanwhile; read it again
		return out, nil
	case errors.Is(err, etcdstore.ErrNotLeader):
		out.result.RequeueAfter = time.Second
		return out, nil
	case err != nil:
		r.etcdUnavailable(lease, &out, err)
		return out, nil
	}
	r.granted(lease, key, grant, now, &out)
	// The grant's status is fresh: its first refresh gets a slot now, so
	// the reconciles its own writes cause have nothing to write.
	r.forgetRefresh(key)
	if lease.Spec.Renewal == fencerv1.RenewalPodReady {
		out.result.RequeueAfter = r.refreshInterval(key, ttl, now)
	}
	r.publishAfterStatus(&out, lease, pods, grant)
	return out, nil
}

// keepOrEnd handles a live grant: it keeps renewing a qualifying PodReady
// holder, and ends the tenure (conditional delete) when the Lease is
// suspended, or one TTL after the last renewal of a holder that stopped
// qualifying. It reports whether the tenure ended.
func (r *LeaseReconciler) keepOrEnd(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, pods []corev1.Pod, now time.Time, out *outcome) (bool, error) {
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	ttl := time.Duration(g.TTL) * time.Second
	pod := findPod(pods, g.Holder, g.HolderUID)
	if recordMissedGrant(lease, g) {
		out.event(corev1.EventTypeNormal, fencerv1.ReasonGranted, "granted to %s with token %d", g.Holder, g.Token)
	}
	showGrant(lease, g)

	switch decideTenure(lease, pod) {
	case endSuspended:
		return true, r.release(ctx, lease, g, fencerv1.TenureSuspended, now, out)
	case endHolderLost:
		why, lagging, err := r.whyLost(ctx, lease, g)
		if err != nil {
			return false, err
		}
		if lagging {
			out.result.RequeueAfter = 100 * time.Millisecond // the cache will catch up
			return false, nil
		}
		return true, r.release(ctx, lease, g, why, now, out)
	case keepDirect:
		// The holder renews through the SDK; etcd expiry ends the tenure.
		r.Renewer.Stop(key) // renewal may have just been switched from PodReady
		setHeld(lease, metav1.ConditionTrue, fencerv1.ReasonGranted, heldMessage(lease, g))
		// Nothing to refresh (no renewTime): a periodic look, taking no slot.
		out.result.RequeueAfter = max(ttl, statusRefresh)
		return false, nil
	case keepRenewing:
		r.clearEnd(key)
		if !r.Renewer.Renewing(key, g.LeaseID) {
			r.Renewer.Ensure(key, g.LeaseID, now) // adopting a grant, e.g. after a controller failover
		}
		last, _ := r.Renewer.LastRenew(key)
		showRenewal(lease, last, ttl, r.refreshDue(key, now))
		setHeld(lease, metav1.ConditionTrue, fencerv1.ReasonGranted, heldMessage(lease, g))
		out.result.RequeueAfter = r.refreshInterval(key, ttl, now)
		return false, nil
	}

	reason := whyNotQualified(pod)
	end, err := r.tenureEnd(ctx, key, g, now)
	if err != nil {
		return false, err
	}
	if now.Before(end) {
		lease.Status.ExpireTime = microTime(end)
		setHeld(lease, metav1.ConditionTrue, fencerv1.ReasonGranted, fmt.Sprintf("held by %s with token %d until %s: the holder no longer qualifies (%s) and is not renewed", g.Holder, g.Token, end.UTC().Format(time.RFC3339Nano), reason))
		out.requeueAt(now, end)
		return false, nil
	}
	return true, r.release(ctx, lease, g, reason, now, out)
}

// tenureEnd is when a grant no longer renewed ends: one TTL after its last
// renewal. Stopping the renewer yields that time; a grant adopted from
// another controller replica has only etcd's remaining TTL to go by.
func (r *LeaseReconciler) tenureEnd(ctx context.Context, key string, g *etcdstore.Grant, now time.Time) (time.Time, error) {
	r.mu.Lock()
	end, known := r.endAt[key]
	r.mu.Unlock()
	if known {
		return end, nil
	}
	last, renewedHere := r.Renewer.Stop(key)
	var remaining time.Duration
	if !renewedHere {
		var err error
		if remaining, err = r.Store.RemainingTTL(ctx, g.LeaseID); err != nil {
			return time.Time{}, err
		}
	}
	end = tenureEndFrom(last, renewedHere, time.Duration(g.TTL)*time.Second, remaining, now)
	r.mu.Lock()
	r.endAt[key] = end
	r.mu.Unlock()
	return end, nil
}

// tenureAction is what happens to a live grant.
type tenureAction int

const (
	endSuspended  tenureAction = iota // spec.suspend: release now
	endHolderLost                     // the holder's pod is gone, replaced or no longer selected: release now
	keepDirect                        // renewal Direct: the holder renews, etcd expiry ends it
	keepRenewing                      // a qualifying PodReady holder: the controller renews
	endUnrenewed                      // a PodReady holder that stopped qualifying: end one TTL after its last renewal
)

// decideTenure is keepOrEnd's decision, from the Lease and the holder pod
// among the pods the selector matches (nil when none has the holder's name
// and UID). One rule for every renewal mode: a holder whose pod object is
// gone, carries a new UID or is no longer selected loses its tenure at
// once, even if its process still renews (Direct): the pod it was granted
// to is no longer a candidate, and its successor must not wait a TTL.
func decideTenure(lease *fencerv1.Lease, pod *corev1.Pod) tenureAction {
	switch {
	case lease.Spec.Suspend:
		return endSuspended
	case pod == nil:
		return endHolderLost
	case lease.Spec.Renewal == fencerv1.RenewalDirect:
		return keepDirect
	case holder.Qualifies(pod):
		return keepRenewing
	}
	return endUnrenewed
}

// tenureEndFrom is when a grant no longer renewed ends: one TTL after its
// last renewal when this replica renewed it; otherwise (adopted from another
// replica) etcd's remaining TTL from now, plus a second, since etcd reports
// whole seconds rounded down and the tenure must never end before etcd
// would end it.
func tenureEndFrom(last time.Time, renewedHere bool, ttl, remaining time.Duration, now time.Time) time.Time {
	if renewedHere {
		return last.Add(ttl)
	}
	return now.Add(remaining + time.Second)
}

// whyNotQualified names why a holder no longer qualifies: gone (deleted, or
// being deleted) or merely not Ready.
func whyNotQualified(pod *corev1.Pod) fencerv1.TenureEndReason {
	if pod == nil || pod.DeletionTimestamp != nil {
		return fencerv1.TenureHolderGone
	}
	return fencerv1.TenureHolderNotReady
}

// noCandidates says why no pod can be granted the Lease: none Ready
// matches, or the selector cannot be parsed.
func noCandidates(lease *fencerv1.Lease, out *outcome) {
	if _, err := metav1.LabelSelectorAsSelector(&lease.Spec.HolderSelector); err != nil {
		msg := fmt.Sprintf("spec.holderSelector is invalid and matches no pod: %v", err)
		setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonInvalidSelector, msg)
		out.event(corev1.EventTypeWarning, fencerv1.ReasonInvalidSelector, "%s", msg)
		return
	}
	setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonNoCandidates, fmt.Sprintf("no Ready pod matches spec.holderSelector in namespace %s", lease.Namespace))
}

// whyLost names why a holder missing from the candidates lost its tenure:
// its pod is gone or replaced (another UID under its name), or is still
// there but no longer matches spec.holderSelector.
//
// The pod is read from the apiserver, not the cache: a cache behind it
// (a new leader's, just after a relist) must not end a tenure whose
// holder is still there and selected; then lagging is true.
func (r *LeaseReconciler) whyLost(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant) (why fencerv1.TenureEndReason, lagging bool, err error) {
	reader := client.Reader(r.Client)
	if r.APIReader != nil {
		reader = r.APIReader
	}
	pod := &corev1.Pod{}
	err = reader.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: g.Holder}, pod)
	switch {
	case apierrors.IsNotFound(err):
		return fencerv1.TenureHolderGone, false, nil
	case err != nil:
		return "", false, err
	case string(pod.UID) != g.HolderUID:
		return fencerv1.TenureHolderGone, false, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&lease.Spec.HolderSelector)
	if err == nil && sel.Matches(labels.Set(pod.Labels)) {
		return "", true, nil
	}
	return fencerv1.TenureHolderNotSelected, false, nil
}

// takeEnding reports, and forgets, whether key's tenure was being ended.
func (r *LeaseReconciler) takeEnding(key string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.endAt[key]
	delete(r.endAt, key)
	return at, ok
}

// passOver lists, for a renewal: Direct Lease, the holders whose latest
// tenure ended Expired or Released, most recent first. One that expired
// stopped renewing (its process froze or died while its pod stays Ready):
// granting it again would only expire again, one TTL at a time, while the
// others wait. One that released gave the lease back for someone else.
// Pick prefers anyone not listed, then the one listed last: the holder
// that released longest ago, or else the one that expired longest ago. With renewal
// PodReady the controller renews, and an expiry is not the holder's doing.
func passOver(lease *fencerv1.Lease) []types.UID {
	if lease.Spec.Renewal != fencerv1.RenewalDirect {
		return nil
	}
	seen := map[types.UID]bool{}
	var expired, released []types.UID
	for _, t := range lease.Status.History { // newest first
		if seen[t.HolderUID] {
			continue
		}
		seen[t.HolderUID] = true
		switch t.EndReason {
		case fencerv1.TenureExpired:
			expired = append(expired, t.HolderUID)
		case fencerv1.TenureReleased:
			released = append(released, t.HolderUID)
		}
	}
	// Released holders last: when everyone is passed over, one that gave
	// the lease back is alive, and picked before one that let it expire.
	return append(expired, released...)
}

// releasedByHolder tells a Direct grant its holder released
// (fence.Release deletes the key, conditional on its token) from one that
// expired: the released grant's etcd lease is still alive. The controller
// revokes it, as nothing is attached to it any more. The lease ID is the
// one the controller's own grant recorded: a key rewritten to point
// elsewhere is no grant (etcdstore.readGrant), so it is never published.
func (r *LeaseReconciler) releasedByHolder(ctx context.Context, lease *fencerv1.Lease) (bool, error) {
	id := clientv3.LeaseID(lease.Status.LeaseID)
	if lease.Spec.Renewal != fencerv1.RenewalDirect || id == 0 {
		return false, nil
	}
	alive, err := r.Store.LeaseAlive(ctx, id)
	if err != nil || !alive {
		return false, err
	}
	r.Store.Revoke(id)
	return true, nil
}

func (r *LeaseReconciler) clearEnd(key string) {
	r.mu.Lock()
	delete(r.endAt, key)
	r.mu.Unlock()
}

// release ends a tenure with the conditional delete.
func (r *LeaseReconciler) release(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, why fencerv1.TenureEndReason, now time.Time, out *outcome) error {
	if err := r.endGrant(ctx, lease, g); err != nil {
		return err
	}
	r.markDeleted(etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name), r.Clock.Now())
	closeTenure(lease, now, why)
	metrics.LeaseReleases.WithLabelValues(string(why)).Inc()
	out.event(corev1.EventTypeNormal, fencerv1.ReasonReleased, "tenure of %s (token %d) ended: %s", g.Holder, g.Token, why)
	return nil
}

// endGrant stops renewing g and deletes it with the conditional release: a
// newer grant under the key is left alone.
func (r *LeaseReconciler) endGrant(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant) error {
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	r.Renewer.Stop(key)
	r.forgetRefresh(key)
	if err := r.Store.Release(ctx, lease.Namespace, lease.Name, g); err != nil && !errors.Is(err, etcdstore.ErrTokenMismatch) {
		return err
	}
	r.clearEnd(key)
	return nil
}

// granted records a new grant in the status, history and metrics.
func (r *LeaseReconciler) granted(lease *fencerv1.Lease, key string, g *etcdstore.Grant, now time.Time, out *outcome) {
	if lease.Spec.Renewal == fencerv1.RenewalPodReady {
		r.Renewer.Ensure(key, g.LeaseID, now)
	}
	metrics.LeaseGrants.WithLabelValues(beginTenure(lease, g, now)).Inc()
	r.mu.Lock()
	if at, ok := r.deletedAt[key]; ok {
		metrics.FailoverSeconds.Observe(r.Clock.Since(at).Seconds())
		delete(r.deletedAt, key)
	}
	r.mu.Unlock()
	showGrant(lease, g)
	lease.Status.RenewTime = microTime(now)
	lease.Status.ExpireTime = microTime(now.Add(time.Duration(g.TTL) * time.Second))
	setHeld(lease, metav1.ConditionTrue, fencerv1.ReasonGranted, heldMessage(lease, g))
	out.event(corev1.EventTypeNormal, fencerv1.ReasonGranted, "granted to %s with token %d", g.Holder, g.Token)
}

func (r *LeaseReconciler) forgetDeletion(key string) {
	r.mu.Lock()
	delete(r.deletedAt, key)
	r.mu.Unlock()
}

func (r *LeaseReconciler) markDeleted(key string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.deletedAt[key]; !ok {
		r.deletedAt[key] = at
	}
}

// revisionRegressed guards against reissuing tokens: a token is an etcd
// revision, so an etcd restored from an old snapshot (without
// --bump-revision) or replaced by an empty cluster would hand out again
// tokens this Lease already gave to earlier holders, and their stale writes
// would pass. The Lease's status, kept by the apiserver, remembers the highest
// token issued; while etcd's revision (at the read that found no grant) is
// below it, nothing is granted.
func (r *LeaseReconciler) revisionRegressed(lease *fencerv1.Lease, rev int64, out *outcome) bool {
	floor, regressed := belowIssued(lease, rev)
	if !regressed {
		return false
	}
	msg := fmt.Sprintf("etcd's revision %d is below token %d this Lease already issued: etcd was restored from an old snapshot or replaced; "+
		"no grant until its revision passes %d (restore with `etcdutl snapshot restore --bump-revision`, see docs/operations.md)", rev, floor, floor)
	setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonEtcdRevisionRegressed, msg)
	out.event(corev1.EventTypeWarning, fencerv1.ReasonEtcdRevisionRegressed, "%s", msg)
	metrics.RevisionRegressions.Inc()
	out.result.RequeueAfter = 10 * time.Second
	return true
}

// dropRegressed refuses a grant whose token is below one this Lease already
// issued: it is never renewed or published, and is deleted with the
// conditional release (only that grant). New grants then wait in
// revisionRegressed until etcd's revision passes the highest token.
func (r *LeaseReconciler) dropRegressed(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, out *outcome) error {
	floor := lease.Status.HighestToken()
	msg := fmt.Sprintf("etcd holds a grant to %s with token %d, below token %d this Lease already issued: etcd was restored from an old snapshot; "+
		"the grant is refused and deleted, and nothing is granted until etcd's revision passes %d (restore with `etcdutl snapshot restore --bump-revision`, see docs/operations.md)",
		g.Holder, g.Token, floor, floor)
	setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonEtcdRevisionRegressed, msg)
	out.event(corev1.EventTypeWarning, fencerv1.ReasonEtcdRevisionRegressed, "%s", msg)
	metrics.RevisionRegressions.Inc()
	out.result.RequeueAfter = 10 * time.Second
	if err := r.endGrant(ctx, lease, g); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "deleting a regressed grant", "token", g.Token)
	}
	return nil
}

// dropUnissued deletes a lease key the controller did not create (its grant
// marker does not match): someone with write access to it, such as a Direct
// Lease's namespace identity, re-created it. Its token was never issued, so
// it is never adopted or published; the next reconcile grants anew.
func (r *LeaseReconciler) dropUnissued(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, out *outcome) error {
	out.event(corev1.EventTypeWarning, fencerv1.ReasonUnissuedGrant,
		"the lease key holds token %d, which fencer never issued (the key was re-created by something with write access to it, such as a Direct Lease's namespace etcd identity); it is deleted and the Lease granted anew", g.Token)
	ctrl.LoggerFrom(ctx).Info("deleting a lease key fencer did not create", "token", g.Token)
	out.result.RequeueAfter = time.Millisecond
	// The grant the status shows is over too: revoke its etcd lease, so
	// that the key's disappearance does not read as its holder's release.
	if id := clientv3.LeaseID(lease.Status.LeaseID); id != 0 && id != g.LeaseID {
		r.Store.Revoke(id)
	}
	return r.endGrant(ctx, lease, g)
}

// belowIssued reports whether rev (etcd's revision, or a grant's token) is
// below floor, the highest token the Lease's status records.
func belowIssued(lease *fencerv1.Lease, rev int64) (floor int64, below bool) {
	floor = lease.Status.HighestToken()
	return floor, rev < floor
}

func (r *LeaseReconciler) etcdUnavailable(lease *fencerv1.Lease, out *outcome, err error) {
	reason, msg := etcdFailure(err)
	setHeld(lease, metav1.ConditionUnknown, reason, msg)
	out.event(corev1.EventTypeWarning, reason, "%s", msg)
	out.result.RequeueAfter = 2 * time.Second
	ctrl.Log.V(1).Info("etcd unavailable", "lease", client.ObjectKeyFromObject(lease), "err", err.Error())
}

// candidates lists the pods the Lease's selector matches. A selector that
// cannot be parsed matches no pod (noCandidates says why), so its holder
// loses the tenure and its annotations go, as for any unselected holder.
func (r *LeaseReconciler) candidates(ctx context.Context, lease *fencerv1.Lease) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(&lease.Spec.HolderSelector)
	if err != nil {
		return nil, nil
	}
	return podsMatching(ctx, r.Client, lease.Namespace, &lease.Spec.HolderSelector, sel)
}

// finalize releases the Lease's grant and its pod annotations, then lets
// the Lease go.
func (r *LeaseReconciler) finalize(ctx context.Context, lease *fencerv1.Lease) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(lease, fencerv1.LeaseFinalizer) {
		return ctrl.Result{}, nil
	}
	if res, err := r.releaseAll(ctx, client.ObjectKeyFromObject(lease)); err != nil || !res.IsZero() {
		return res, err
	}
	controllerutil.RemoveFinalizer(lease, fencerv1.LeaseFinalizer)
	return ctrl.Result{}, r.Update(ctx, lease)
}

// gone releases what a Lease that no longer exists left behind (releaseAll).
// finalize does this for a Lease deleted with fencer's finalizer; a Lease
// whose finalizer was removed by hand (as docs/install.md says to do after
// an uninstall), or deleted while no manager ran, comes here. The cache may
// not have seen a Lease just created, so the apiserver confirms the Lease
// is gone before anything is released.
func (r *LeaseReconciler) gone(ctx context.Context, name types.NamespacedName) (ctrl.Result, error) {
	if r.APIReader != nil {
		err := r.APIReader.Get(ctx, name, &fencerv1.Lease{})
		switch {
		case err == nil:
			return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil // the cache has yet to see it
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, err
		}
	}
	return r.releaseAll(ctx, name)
}

// releaseAll ends everything a deleted Lease held: its grant (conditional
// delete and revoke, so its holder's Hold and WatchHeld end), its renewal,
// its grant marker, the annotations of every pod that carries them, and
// what the reconciler remembers of it. A zero Result means all is done.
func (r *LeaseReconciler) releaseAll(ctx context.Context, name types.NamespacedName) (ctrl.Result, error) {
	if _, err := r.Elector.Term(); err != nil {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	key := etcdkeys.LeaseKey(r.Store.Prefix(), name.Namespace, name.Name)
	g, err := r.Store.GetGrant(ctx, name.Namespace, name.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if g != nil {
		lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}}
		if err := r.endGrant(ctx, lease, g); err != nil {
			return ctrl.Result{}, err
		}
		metrics.LeaseReleases.WithLabelValues(string(fencerv1.TenureDeleted)).Inc()
		ctrl.LoggerFrom(ctx).Info("released the grant of a deleted Lease", "holder", g.Holder, "token", g.Token)
	}
	r.Renewer.Stop(key)
	if err := r.Store.ForgetLease(ctx, name.Namespace, name.Name); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.unpublish(ctx, name.Namespace, name.Name); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(key)
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller and the runnables that feed it:
// the etcd watch of lease keys, and a resync whenever the etcd term changes.
// notStatusOnly drops Lease updates that changed nothing but the status.
// Only the controller writes Lease status (the webhook refuses anyone
// else), so such an update is its own write coming back: reconciling it
// again costs a read of etcd and the pods, per Lease, per status write.
var notStatusOnly = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	o, n := e.ObjectOld, e.ObjectNew
	return o.GetGeneration() != n.GetGeneration() ||
		!equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) ||
		!equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations()) ||
		!equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers()) ||
		!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp())
}}

func (r *LeaseReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(leaderRunnable(r.watchEtcd)); err != nil {
		return err
	}
	if err := mgr.Add(followTerms(r.Elector, r.Renewer, r.enqueueAll)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&fencerv1.Lease{}, builder.WithPredicates(notStatusOnly)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.leasesForPod)).
		WatchesRawSource(r.wake.source()).
		Named("lease").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Workers, 1)}).
		Complete(r)
}

// watchEtcd wakes a Lease the moment its key is deleted or expires.
func (r *LeaseReconciler) watchEtcd(ctx context.Context) error {
	r.Store.WatchLeases(ctx, func(ev etcdstore.LeaseEvent) {
		if ev.Deleted {
			r.markDeleted(etcdkeys.LeaseKey(r.Store.Prefix(), ev.Namespace, ev.Name), ev.At)
		}
		r.wake.wake(ev.Namespace, ev.Name)
	}, func() { r.enqueueAll(ctx) })
	return nil
}

// enqueueAll reconciles every Lease, and every Lease that etcd holds a
// grant or grant marker of: a Lease deleted while no manager looked (its
// finalizer removed by hand) is released by gone.
func (r *LeaseReconciler) enqueueAll(ctx context.Context) {
	var leases fencerv1.LeaseList
	if err := r.List(ctx, &leases, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing Leases for a resync")
		return
	}
	for _, l := range leases.Items {
		r.wake.wake(l.Namespace, l.Name)
	}
	granted, err := r.Store.GrantedLeases(ctx)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing etcd's grants for a resync")
		return
	}
	for _, l := range granted {
		r.wake.wake(l.Namespace, l.Name)
	}
}

// leasesForPod maps a pod to the Leases that select it or that it holds.
func (r *LeaseReconciler) leasesForPod(ctx context.Context, obj client.Object) []reconcile.Request {
	// Candidates from the indexes: Leases whose matchLabels share a label
	// with the pod, Leases with only matchExpressions, and the Lease the pod
	// holds (it must hear that its holder changed). Then the full selector.
	keys := []string{indexAnyLabel}
	for k, v := range obj.GetLabels() {
		keys = append(keys, k+"="+v)
	}
	seen := map[client.ObjectKey]bool{}
	var reqs []reconcile.Request
	consider := func(index, value string) {
		var leases fencerv1.LeaseList
		if err := r.List(ctx, &leases, client.InNamespace(obj.GetNamespace()), client.MatchingFields{index: value}, client.UnsafeDisableDeepCopy); err != nil {
			return
		}
		for i := range leases.Items {
			l := &leases.Items[i]
			key := client.ObjectKeyFromObject(l)
			if seen[key] {
				continue
			}
			sel, err := metav1.LabelSelectorAsSelector(&l.Spec.HolderSelector)
			if index == indexHolder || (err == nil && sel.Matches(labels.Set(obj.GetLabels()))) {
				seen[key] = true
				reqs = append(reqs, reconcile.Request{NamespacedName: key})
			}
		}
	}
	consider(indexHolder, obj.GetName())
	for _, k := range keys {
		consider(indexSelectorLabel, k)
	}
	// The Leases whose annotations the pod carries, whether or not they
	// exist or select it: each removes what the pod must not carry.
	for _, name := range leasesAnnotated(obj.GetAnnotations()) {
		key := client.ObjectKey{Namespace: obj.GetNamespace(), Name: name}
		if !seen[key] {
			seen[key] = true
			reqs = append(reqs, reconcile.Request{NamespacedName: key})
		}
	}
	return reqs
}
