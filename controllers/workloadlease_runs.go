package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// selectedRun is the CronJob run (its Job's UID, and its runOrder) this
// process last set a member Lease's selector to.
type selectedRun struct{ uid, order string }

// selectedRuns remembers, per CronJob member Lease (by UID), the run this
// process last selected for it. When that run's Job is deleted and the
// newest Job left is older, the Lease stays with it (cronJobRun): the
// manager selects only runs it listed as the CronJob's Jobs, so nothing a
// Lease editor writes (annotations, the selector, a pod claiming some
// Job's UID) can name the run that stays. It is memory, not a record:
// after a restart, or on another replica after a failover, no deleted run
// is known, and such a Lease goes to the newest Job left (docs/concepts.md).
type selectedRuns struct {
	mu   sync.Mutex
	runs map[types.UID]selectedRun
}

// remember records that lease's selector was set to run.
func (s *selectedRuns) remember(lease types.UID, run selectedRun) {
	if lease == "" || run.uid == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs == nil {
		s.runs = map[types.UID]selectedRun{}
	}
	s.runs[lease] = run
}

// last is the run this process last selected for lease.
func (s *selectedRuns) last(lease types.UID) (selectedRun, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	run, ok := s.runs[lease]
	return run, ok
}

// forget drops a deleted Lease's run.
func (s *selectedRuns) forget(lease types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.runs, lease)
}
