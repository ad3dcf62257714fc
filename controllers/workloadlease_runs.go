package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// selectedRun is the CronJob run (its Job's UID, and its runOrder) this
// process last set a member Lease's selector to.
type selectedRun struct{ uid, order string }

// rememberedRun is the run last written to a Lease, and the UID of that
// Lease: a Lease deleted and re-created under its name starts with
// nothing. tried is a run whose write returned an error: it may still
// have been applied (a timeout, a connection lost after the commit).
type rememberedRun struct {
	lease      types.UID
	run, tried selectedRun
}

// selectedRuns remembers, per WorkloadLease and member Lease name, the run
// this process last selected for that Lease. When that run's Job is
// deleted and the newest Job left is older, the Lease stays with it
// (cronJobRun): the manager selects only runs it listed as the CronJob's
// Jobs, ordered by times no Job writer can move past the apiserver's
// (runOrder), so nothing a Lease editor writes (annotations, the
// selector, a pod claiming some Job's UID) can name the run that stays.
// Each pass records the run in the WorkloadLease's status (record), which
// only the manager may write (the chart's status guard), and a process
// that starts with no run of its own for a Lease takes the recorded one
// (recall): a restart, or another replica after a failover, knows the
// deleted run too. It holds entries only for the members of
// WorkloadLeases that exist (keepOnly, forgetAll).
type selectedRuns struct {
	mu   sync.Mutex
	runs map[types.NamespacedName]map[string]*rememberedRun
}

// remember records that the selector of wl's member Lease name (UID
// lease) was set to run.
func (s *selectedRuns) remember(wl types.NamespacedName, name string, lease types.UID, run selectedRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.entry(wl, name, lease, run); r != nil {
		r.run, r.tried = run, selectedRun{}
	}
}

// try records that the write setting the selector of wl's member Lease
// name (UID lease) to run failed, perhaps only in its answer.
func (s *selectedRuns) try(wl types.NamespacedName, name string, lease types.UID, run selectedRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.entry(wl, name, lease, run); r != nil {
		r.tried = run
	}
}

// entry is the record of wl's member Lease name, new when there was none
// or it was another Lease's (UID lease), nil for no Lease or no run. The
// caller holds s.mu.
func (s *selectedRuns) entry(wl types.NamespacedName, name string, lease types.UID, run selectedRun) *rememberedRun {
	if lease == "" || run.uid == "" {
		return nil
	}
	if s.runs == nil {
		s.runs = map[types.NamespacedName]map[string]*rememberedRun{}
	}
	if s.runs[wl] == nil {
		s.runs[wl] = map[string]*rememberedRun{}
	}
	if r := s.runs[wl][name]; r != nil && r.lease == lease {
		return r
	}
	r := &rememberedRun{lease: lease}
	s.runs[wl][name] = r
	return r
}

// last is the run this process last selected for wl's member Lease l, if
// l is still the Lease of that UID: the run it last wrote, or the one
// whose write failed in its answer only, as l's selector shows. That run
// too is one the manager listed itself, so an edit of the selector can
// point it at no other.
func (s *selectedRuns) last(wl types.NamespacedName, l *fencerv1.Lease) (selectedRun, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[wl][l.Name]
	switch {
	case r == nil || r.lease != l.UID:
		return selectedRun{}, false
	case r.tried.uid != "" && equality.Semantic.DeepEqual(l.Spec.HolderSelector, runSelector(r.tried.uid)):
		return r.tried, true
	case r.run.uid == "":
		return selectedRun{}, false
	}
	return r.run, true
}

// recall takes the run recorded in wl's status (record) for its CronJob's
// member Lease when this process has none for that Lease: an earlier
// process wrote it. A run of this process's own is never older than what
// it recorded, so it stays.
func (s *selectedRuns) recall(wl *fencerv1.WorkloadLease) {
	rec := wl.Status.CronJobRun
	if wl.Spec.Workload.Kind != fencerv1.WorkloadCronJob || rec == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := types.NamespacedName{Namespace: wl.Namespace, Name: wl.Name}
	if s.runs[key][wl.Spec.Workload.Name] != nil {
		return
	}
	if r := s.entry(key, wl.Spec.Workload.Name, rec.LeaseUID, selectedRun{string(rec.JobUID), rec.Order}); r != nil {
		r.run = selectedRun{string(rec.JobUID), rec.Order}
	}
}

// record is the run to keep in wl's status: the run last written to its
// CronJob's member Lease, if any. A write whose answer was an error is
// not recorded: its pass ends in that error, before the status write.
func (s *selectedRuns) record(wl *fencerv1.WorkloadLease) *fencerv1.CronJobRun {
	if wl.Spec.Workload.Kind != fencerv1.WorkloadCronJob {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[types.NamespacedName{Namespace: wl.Namespace, Name: wl.Name}][wl.Spec.Workload.Name]
	if r == nil || r.run.uid == "" {
		return nil
	}
	return &fencerv1.CronJobRun{LeaseUID: r.lease, JobUID: types.UID(r.run.uid), Order: r.run.order}
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
}
