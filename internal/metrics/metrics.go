// Package metrics defines fencer's Prometheus metrics, registered on
// controller-runtime's registry so the manager's /metrics serves them.
package metrics

import (
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

var (
	// EtcdAlarm is 1 while etcd raises an alarm.
	EtcdAlarm = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencer_etcd_alarm",
		Help: "1 while an etcd member raises the alarm, else 0, as the leading manager last saw it. Label alarm: NOSPACE (the backend quota is full: no grant, renewal by a new holder, or ID claim succeeds) or CORRUPT.",
	}, []string{"alarm"})

	// EtcdDBSize is each member's backend size.
	EtcdDBSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencer_etcd_db_size_bytes",
		Help: "Size of each etcd member's backend file, as the leading manager last saw it. Label member: the member's client URL (one series per member). Compare with the quota (--quota-backend-bytes).",
	}, []string{"member"})

	// EtcdDBSizeInUse is each member's backend bytes in use.
	EtcdDBSizeInUse = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencer_etcd_db_size_in_use_bytes",
		Help: "Bytes of each etcd member's backend in use; the rest is free pages that defragmentation returns. Label member: the member's client URL.",
	}, []string{"member"})

	// EtcdMaintenance counts maintenance operations.
	EtcdMaintenance = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencer_etcd_maintenance_total",
		Help: "etcd maintenance done by the leading manager. Label operation: compact, defragment, disarm (NOSPACE alarm cleared). Label result: ok, error.",
	}, []string{"operation", "result"})

	// Leader is 1 on the replica that runs the controllers.
	Leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fencer_manager_leader",
		Help: "1 on the replica elected (Kubernetes leader election) to run the controllers, else 0. One replica of an install reports 1; while none does, no Lease is granted and no PodReady Lease renewed.",
	})

	// EtcdHealthy is 1 while this replica reaches an etcd quorum.
	EtcdHealthy = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fencer_etcd_healthy",
		Help: "1 while this replica's last linearizable etcd read succeeded, else 0: the leader's watchdog reads every second, and every replica's readiness probe reads too. A leader at 0 steps down (docs/operations.md).",
	})

	// LeaseGrants counts grants of Leases.
	LeaseGrants = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencer_lease_grants_total",
		Help: "Grants of fencer Leases. Label transition: \"first\" for a Lease's first grant, \"new\" when the holder differs from the previous one, \"same\" when the previous holder is granted again.",
	}, []string{"transition"})

	// EventsDropped counts Normal Events the controllers did not post.
	EventsDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencer_events_dropped_total",
		Help: "Normal Events the controllers did not post because they exceeded the Event budget (a burst of 100, then 1 per second, over all objects); the same facts are in each object's status. Label reason: the Event's reason (Granted, Released, Expired, SlotFreed).",
	}, []string{"reason"})

	// LeaseReleases counts tenures ended before their etcd lease expired.
	LeaseReleases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencer_lease_releases_total",
		Help: "Tenures ended before their etcd lease expired: by the controller's conditional delete, or by a renewal: Direct holder's fence.Release. Label reason: HolderNotReady, HolderGone (deleted, replaced by a new UID, or being deleted), HolderNotSelected (no longer matches holderSelector), Suspended, Deleted, Released (by the holder).",
	}, []string{"reason"})

	// LeaseExpiries counts tenures that ended by their etcd lease expiring.
	LeaseExpiries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencer_lease_expiries_total",
		Help: "Tenures that ended because etcd expired or revoked their lease, not by the controller's release (e.g. a Direct-mode holder stopped renewing).",
	})

	// RevisionRegressions counts grants refused because etcd's revision was
	// below a token already issued.
	RevisionRegressions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencer_etcd_revision_regressions_total",
		Help: "Grants and block claims refused because etcd went back in time (restored from an old snapshot, or replaced): its revision below a token a Lease already issued or below the lock floor, or an IDRange's next-ID key below its status.next; and each time the manager closes grants with the lock floor. Any increase needs an operator.",
	})

	// FailoverSeconds measures from a lease key's deletion to the next grant.
	FailoverSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencer_lease_failover_seconds",
		Help:    "Time from a lease key's deletion (seen by the etcd watch) to the grant to the next holder.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})

	// EtcdOperationSeconds measures the latency of fencer's etcd operations.
	EtcdOperationSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencer_etcd_operation_duration_seconds",
		Help:    "Latency of fencer's etcd operations. Label op: get, grant, release, release_deleted (the Lease deletion webhook's release), ttl, claim, slot, slots. Label result: ok, error.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"op", "result"})
)

var (
	// AdmissionDecisions counts the webhook's decisions.
	AdmissionDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencer_admission_decisions_total",
		Help: admissionDecisionsHelp,
	}, []string{"operation", "result", "reason"})

	// AdmissionSeconds measures how long the webhook takes to decide.
	AdmissionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencer_admission_duration_seconds",
		Help:    "Time the fencing webhook takes to decide one AdmissionReview. Label operation: CREATE, UPDATE, DELETE, CONNECT.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	}, []string{"operation"})

	// TokenLookupSeconds measures the etcd reads behind live-token lookups.
	TokenLookupSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencer_token_lookup_duration_seconds",
		Help:    "Latency of the linearizable etcd read behind a live-token lookup (one read may serve many concurrent lookups). Label result: ok, error.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	}, []string{"result"})
)

var (
	// IDRangeBlocks counts ID blocks handed out.
	IDRangeBlocks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencer_idrange_blocks_total",
		Help: "ID blocks handed out to pods by Blocks-mode IDRanges.",
	})
	// IDRangeRemaining is how many IDs (Blocks) or free slots (Slots) remain.
	IDRangeRemaining = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencer_idrange_remaining",
		Help: "IDs (Blocks mode) or free slots (Slots mode) left in an IDRange. Labels namespace and name: the IDRange.",
	}, []string{"namespace", "name"})
	// IDRangeSize is how many IDs or slots an IDRange has in all.
	IDRangeSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencer_idrange_size",
		Help: "IDs (Blocks mode) or slots (Slots mode) of an IDRange in all, spec.max - spec.min + 1; fencer_idrange_remaining / fencer_idrange_size < 0.1 is the IDRange's Low condition. Labels namespace and name: the IDRange; mode: Blocks or Slots.",
	}, []string{"namespace", "name", "mode"})
	// IDRangeWaiting is how many selected pods wait for a block or slot.
	IDRangeWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencer_idrange_waiting_pods",
		Help: "Pods an IDRange selects that wait for a block or slot because none is left (they are named in its Exhausted condition). Labels namespace and name: the IDRange.",
	}, []string{"namespace", "name"})
	// IDRangeSlotsInUse is how many slots are leased.
	IDRangeSlotsInUse = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencer_idrange_slots_in_use",
		Help: "Live slot leases of a Slots-mode IDRange. Labels namespace and name: the IDRange.",
	}, []string{"namespace", "name"})
	// IDRangeRepairs counts drift the periodic repair fixed.
	IDRangeRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencer_idrange_repairs_total",
		Help: "Drift between pod annotations and etcd that the IDRange controller fixed. Label kind: annotation_without_slot (a pod's slot annotation had no live slot; a new slot was leased), block_not_claimed (a Blocks pod's annotation was not a block claimed for it: forged, copied or damaged; its own block was restored or a new one claimed), block_removed (a Blocks pod's annotation was removed; its own block was restored), slot_out_of_range (a live slot lies outside the IDRange's [min, max], left by an earlier IDRange of the name; it is released, and its pod gets a slot in the range), slot_without_pod (a live slot's pod is gone or finished; it is no longer renewed).",
	}, []string{"kind"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(Leader, EtcdAlarm, EtcdDBSize, EtcdDBSizeInUse, EtcdMaintenance, EtcdHealthy,
		LeaseGrants, LeaseReleases, LeaseExpiries, RevisionRegressions, FailoverSeconds, EtcdOperationSeconds, EventsDropped,
		AdmissionDecisions, AdmissionSeconds, TokenLookupSeconds,
		IDRangeBlocks, IDRangeRemaining, IDRangeSize, IDRangeWaiting, IDRangeSlotsInUse, IDRangeRepairs)
	// Counters with a small, fixed set of labels start at 0, so rate() and
	// increase() see their first event, and alerts and dashboards find
	// them before anything has happened.
	for _, op := range []string{"compact", "defragment", "disarm"} {
		for _, res := range []string{"ok", "error"} {
			EtcdMaintenance.WithLabelValues(op, res)
		}
	}
	for _, t := range []string{"first", "new", "same"} {
		LeaseGrants.WithLabelValues(t)
	}
	for _, r := range []string{fencerv1.ReasonGranted, fencerv1.ReasonReleased, fencerv1.ReasonExpired, "SlotFreed"} {
		EventsDropped.WithLabelValues(r)
	}
	for _, r := range []fencerv1.TenureEndReason{fencerv1.TenureHolderNotReady, fencerv1.TenureHolderGone, fencerv1.TenureHolderNotSelected, fencerv1.TenureSuspended, fencerv1.TenureDeleted, fencerv1.TenureReleased} {
		LeaseReleases.WithLabelValues(string(r))
	}
	for _, k := range []string{"annotation_without_slot", "block_not_claimed", "block_removed", "slot_out_of_range", "slot_without_pod"} {
		IDRangeRepairs.WithLabelValues(k)
	}
	// The failures an alert watches for.
	for _, op := range []string{"CREATE", "UPDATE", "DELETE", "CONNECT"} {
		for _, reason := range []string{"LookupFailed", "BadRequest", "HandlerPanicked"} {
			AdmissionDecisions.WithLabelValues(op, "refused", reason)
		}
	}
}

// ForgetIDRange drops the series of a deleted IDRange.
func ForgetIDRange(namespace, name string) {
	of := prometheus.Labels{"namespace": namespace, "name": name}
	for _, g := range []*prometheus.GaugeVec{IDRangeRemaining, IDRangeSize, IDRangeWaiting, IDRangeSlotsInUse} {
		g.DeletePartialMatch(of)
	}
}

// ObserveLookup records one live-token read; it fits etcdstore.NewLiveReader.
func ObserveLookup(d time.Duration, err error) {
	TokenLookupSeconds.WithLabelValues(result(err)).Observe(d.Seconds())
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// ObserveEtcd records one etcd operation; it fits etcdstore.NewStore.
func ObserveEtcd(op string, d time.Duration, err error) {
	EtcdOperationSeconds.WithLabelValues(op, result(err)).Observe(d.Seconds())
}

// buildInfo is fencer_build_info: one series, always 1, whose labels say
// what is running.
var buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "fencer_build_info",
	Help: "Always 1. Label version: fencer's version (the chart's appVersion for its image); label goversion: the Go release it was built with.",
}, []string{"version", "goversion"})

// SetBuildInfo registers fencer_build_info for version.
func SetBuildInfo(version string) {
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	ctrlmetrics.Registry.MustRegister(buildInfo)
}

// admissionDecisionsHelp documents every label value of
// fencer_admission_decisions_total.
const admissionDecisionsHelp = "Decisions of the fencing webhook. Label operation: CREATE, UPDATE, DELETE, CONNECT. Label result: allowed, refused. Label reason: Allowed, NotFenced, ExemptIdentity, FinalizersReleased, MissingToken, MalformedToken, ForgedToken, BelowObjectToken, BelowLiveToken, NotNewestToken, NoHolder, NotHolderIdentity, UnknownLease, LeaseLabelChanged, TokenlessWrite, EtcdRevisionRegressed, SupersededToken, LeaseReplaced, LookupFailed, BadRequest, HandlerPanicked (a bug: the handler panicked and the write was refused)."
