package controllers

import (
	"context"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/internal/etcdstore"
)

// staleCopies tells a pass whether the cached copy of the object it is
// about to act on may be behind what the API server holds, in the one
// case where that can undo another manager's work: the first time this
// process acts on the object in a term.
//
// A manager that has just taken over acts from informers that may still
// lag what the leader before it wrote, each kind's informer on its own:
// a Lease's selector moved to a newer run (the old holder released for
// it), an IDRange's max raised (a slot leased above the old max), a
// WorkloadLease's record of the run its CronJob's Lease follows. Acting on
// the older copy would grant the Lease again to the pod it no longer
// selects, free a live slot, or move the Lease back to the older run.
//
// A copy written at or after the term's start (its resourceVersion at or
// above the API's, read once per term) already shows every write of the
// leaders before. An older copy is confirmed with one uncached read, and
// then trusted for the rest of the term: later copies are newer still.
// A copy that is behind makes the pass wait for the cache (the informer's
// next event for the object wakes it, and staleRetry as well).
type staleCopies struct {
	mu    sync.Mutex
	term  string
	since uint64 // the API's resourceVersion early in the term; 0 while unknown
	read  bool   // since was read in term (0 if it cannot be compared)
	ok    map[types.UID]bool
}

// staleRetry is how soon a pass that found its copy behind runs again, if
// the informer's event for the newer copy has not woken it before.
const staleRetry = 200 * time.Millisecond

// behind reports whether obj, as the cache has it, may be older than the
// API server's copy, in term (any string that changes with leadership).
// list is an empty list of obj's kind, for reading the API's current
// resourceVersion; nil compares no resourceVersions (another kind's may
// come from another etcd): every copy is read once a term, and compared
// by generation. Without an uncached reader (unit tests) nothing is
// behind.
func (s *staleCopies) behind(ctx context.Context, reader client.Reader, list client.ObjectList, obj client.Object, term string) (bool, error) {
	if reader == nil {
		return false, nil
	}
	since, err := s.termStart(ctx, reader, list, obj.GetNamespace(), term)
	if err != nil {
		return false, err
	}
	if rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64); err == nil && list != nil && since > 0 && rv >= since {
		return false, nil
	}
	if s.confirmed(term, obj.GetUID()) {
		return false, nil
	}
	live := obj.DeepCopyObject().(client.Object)
	if err := reader.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil // deleted since: the cache will say so
		}
		return false, err
	}
	same := live.GetResourceVersion() == obj.GetResourceVersion()
	if list == nil {
		// Another kind's copy, whose status its own controller may
		// rewrite faster than the cache follows: its spec decides.
		same = live.GetGeneration() == obj.GetGeneration()
	}
	if live.GetUID() != obj.GetUID() || !same {
		return true, nil
	}
	s.confirm(term, obj.GetUID())
	return false, nil
}

// termStart is the API's resourceVersion read once in term (0 if it cannot
// be compared, when every object is read instead), forgetting what an
// earlier term confirmed.
func (s *staleCopies) termStart(ctx context.Context, reader client.Reader, list client.ObjectList, namespace, term string) (uint64, error) {
	s.mu.Lock()
	if s.term != term {
		s.term, s.since, s.read, s.ok = term, 0, false, map[types.UID]bool{}
	}
	if s.read || list == nil {
		defer s.mu.Unlock()
		return s.since, nil
	}
	s.mu.Unlock()
	// Any list returns the API's current resourceVersion; one item is
	// enough, and one namespace is all the manager may be allowed.
	if err := reader.List(ctx, list, client.InNamespace(namespace), client.Limit(1)); err != nil {
		return 0, err
	}
	since, err := strconv.ParseUint(list.GetResourceVersion(), 10, 64)
	if err != nil {
		since = 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.term == term && !s.read {
		s.since, s.read = since, true
	}
	return since, nil
}

func (s *staleCopies) confirmed(term string, uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.term == term && s.ok[uid]
}

func (s *staleCopies) confirm(term string, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.term == term {
		s.ok[uid] = true
	}
}

// behindInTerm is behind for a reconciler that acts in elector's etcd
// terms. A pass that no longer leads etcd waits too.
func (s *staleCopies) behindInTerm(ctx context.Context, elector *etcdstore.Elector, reader client.Reader, list client.ObjectList, obj client.Object) (bool, error) {
	if reader == nil {
		return false, nil
	}
	term, err := elector.Term()
	if err != nil {
		return true, nil // the term ended since the pass began: it runs again
	}
	return s.behind(ctx, reader, list, obj, term.Key+"@"+strconv.FormatInt(term.Rev, 10))
}
