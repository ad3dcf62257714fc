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
// It is memory, not a record: after a restart, or on another replica
// after a failover, no deleted run is known, and such a Lease goes to the
// newest Job left (docs/concepts.md). It holds entries only for the
// members of WorkloadLeases that exist (keepOnly, forgetAll).
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
