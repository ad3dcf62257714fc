package controllers

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// selectedRun is a CronJob run: its Job's UID, its runOrder, and the
// CronJob's UID ("" in a record written before fencer recorded it).
type selectedRun struct{ uid, order, cronJob string }

// memberRun is what is known of the run of one member Lease (UID lease):
// recorded, the run the WorkloadLease's status names, and pending, a run
// this pass writes there. The Lease moves to a run only once the status
// records it (afterStatus), so the record is never behind the Lease.
type memberRun struct {
	lease             types.UID
	recorded, pending selectedRun
}

// selectedRuns keeps, per WorkloadLease and member Lease name, the CronJob
// run recorded for that member's Lease. When that run's Job is
// deleted and the newest Job left is older, the Lease stays with it
// (cronJobRun): the manager selects only runs it listed as the CronJob's
// Jobs, ordered by times no Job writer can move past the apiserver's
// (runOrder), so nothing a Lease editor writes (annotations, the
// selector, a pod claiming some Job's UID) can name the run that stays.
// The run is recorded in the WorkloadLease's status.cronJobRun, which
// only the manager may write (the status guard), before the Lease moves
// to it; this is that record as this process knows it, taken from the
// status when it has none of its own or the status names a newer run
// (recall), so a restart, or another replica after a failover, knows a
// deleted run too. It holds entries only for the members of
// WorkloadLeases that exist (keepOnly, forgetAll).
type selectedRuns struct {
	mu   sync.Mutex
	runs map[types.NamespacedName]map[string]*memberRun
	// of is the UID of the WorkloadLease whose runs these are: one
	// deleted and created again under its name, with no pass between
	// that saw it gone, starts with none of the old one's.
	of map[types.NamespacedName]types.UID
}

// entry is the record of wl's member Lease name, new when there was none
// or it was another Lease's (UID lease). The caller holds s.mu.
func (s *selectedRuns) entry(wl types.NamespacedName, name string, lease types.UID) *memberRun {
	if s.runs == nil {
		s.runs = map[types.NamespacedName]map[string]*memberRun{}
	}
	if s.runs[wl] == nil {
		s.runs[wl] = map[string]*memberRun{}
	}
	if r := s.runs[wl][name]; r != nil && r.lease == lease {
		return r
	}
	r := &memberRun{lease: lease}
	s.runs[wl][name] = r
	return r
}

// recorded is the run wl's status records for its member Lease name, if
// it was recorded for that Lease (UID lease), not for one of the name
// before it.
func (s *selectedRuns) recorded(wl types.NamespacedName, name string, lease types.UID) (selectedRun, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[wl][name]
	if r == nil || r.lease != lease || r.recorded.uid == "" {
		return selectedRun{}, false
	}
	return r.recorded, true
}

// recordedBefore is the run wl's status records for its member Lease
// name, whichever Lease of the name it was recorded for: the floor for a
// Lease created again under the name (one deleted by hand), which never
// goes back to a run older than its predecessor's of the same CronJob.
func (s *selectedRuns) recordedBefore(wl types.NamespacedName, name string) (selectedRun, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[wl][name]
	if r == nil || r.recorded.uid == "" {
		return selectedRun{}, false
	}
	return r.recorded, true
}

// propose makes run the one this pass records for wl's member Lease name
// (UID lease).
func (s *selectedRuns) propose(wl types.NamespacedName, name string, lease types.UID, run selectedRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entry(wl, name, lease).pending = run
}

// written notes that wl's status now records the runs this pass
// proposed for it.
func (s *selectedRuns) written(wl types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runs[wl] {
		if r.pending.uid != "" {
			r.recorded, r.pending = r.pending, selectedRun{}
		}
	}
}

// startPass begins a pass over wl: nothing is proposed yet, and the run
// recorded in wl's status for its CronJob's member Lease is taken when
// this process knows none for that member, or an older one for the same
// Lease: the status is written before a Lease moves, so a newer record is
// a move another process made (this one stood by, or paused). What this
// process knows of another Lease of the name stays: a status naming the
// Lease before it is one the cache shows before this process's own write
// of the new Lease's run. A record whose time is ahead of now (one no run
// can have: runOrder is never later than its Job's creation) was not
// written by a manager, and is ignored.
func (s *selectedRuns) startPass(ctx context.Context, wl *fencerv1.WorkloadLease, now time.Time) {
	s.mu.Lock()
	key := client.ObjectKeyFromObject(wl)
	if s.of[key] != wl.UID {
		delete(s.runs, key)
		if s.of == nil {
			s.of = map[types.NamespacedName]types.UID{}
		}
		s.of[key] = wl.UID
	}
	for _, r := range s.runs[key] {
		r.pending = selectedRun{}
	}
	s.mu.Unlock()
	rec := wl.Status.CronJobRun
	if wl.Spec.Workload.Kind != fencerv1.WorkloadCronJob || rec == nil || rec.LeaseUID == "" || rec.JobUID == "" {
		return
	}
	if err := plausibleOrder(rec.Order, now); err != nil {
		ctrl.LoggerFrom(ctx).Info("ignoring status.cronJobRun: no manager wrote it", "cronJobRun", rec, "reason", err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.runs[key][wl.Spec.Workload.Name]; r != nil && r.lease != rec.LeaseUID && r.recorded.uid != "" {
		return
	}
	r := s.entry(key, wl.Spec.Workload.Name, rec.LeaseUID)
	if r.recorded.uid == "" || rec.Order > r.recorded.order {
		r.recorded = selectedRun{string(rec.JobUID), rec.Order, string(rec.CronJobUID)}
	}
}

// orderSkew is how far ahead of this manager's clock a run's time may be:
// the apiserver's clock, which set the Job's creation time, may be ahead.
const orderSkew = 10 * time.Minute

// plausibleOrder checks that order is a runOrder of a time no later than
// now (and orderSkew).
func plausibleOrder(order string, now time.Time) error {
	secs, name, ok := strings.Cut(order, "/")
	if !ok || len(secs) != 20 || name == "" {
		return fmt.Errorf("order %q is not <20-digit seconds>/<job name>", order)
	}
	at, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		return fmt.Errorf("order %q: %w", order, err)
	}
	if at > now.Add(orderSkew).Unix() {
		return fmt.Errorf("order %q is for %s, after now", order, time.Unix(at, 0).UTC().Format(time.RFC3339))
	}
	return nil
}

// record is the run to write in wl's status: the run proposed this pass
// for its CronJob's member Lease, or else the one recorded before.
func (s *selectedRuns) record(wl *fencerv1.WorkloadLease) *fencerv1.CronJobRun {
	if wl.Spec.Workload.Kind != fencerv1.WorkloadCronJob {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[client.ObjectKeyFromObject(wl)][wl.Spec.Workload.Name]
	if r == nil {
		return nil
	}
	run := r.recorded
	if r.pending.uid != "" {
		run = r.pending
	}
	if run.uid == "" {
		return nil
	}
	return &fencerv1.CronJobRun{LeaseUID: r.lease, JobUID: types.UID(run.uid), Order: run.order, CronJobUID: types.UID(run.cronJob)}
}

// keepOnly drops the runs of wl's member Leases whose names are not in
// wanted: members that are gone.
func (s *selectedRuns) keepOnly(wl types.NamespacedName, wanted map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.runs[wl] {
		if !wanted[name] {
			delete(s.runs[wl], name)
		}
	}
	if len(s.runs[wl]) == 0 {
		delete(s.runs, wl)
	}
}

// forgetAll drops every run of wl: it was deleted.
func (s *selectedRuns) forgetAll(wl types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.runs, wl)
	delete(s.of, wl)
}
