package history

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// lockQueue is one keyed lock's live waiters, by waiter key, with their
// create revisions (tokens). The oldest holds the lock.
type lockQueue map[string]int64

func (q lockQueue) holder() int64 {
	var h int64
	for _, rev := range q {
		if h == 0 || rev < h {
			h = rev
		}
	}
	return h
}

// locks replays etcd's history of keyed locks and of the keys written
// under their tokens. At every revision a lock's holder is its oldest live
// waiter. Each write under a lock's token must commit while that token
// holds the lock: under an older token it came after a newer holder's
// grant (LockStaleWrites); under a newer one, its writer still queued
// while another held the lock: two live holders (LockDoubleHolders). A
// lock's holders' tokens strictly increase (LockTokenRegressions). Every
// write a worker saw committed is in etcd's history (Missing).
func (r *Report) locks(h *Histories) {
	queues := map[string]lockQueue{} // lock key (namespace/key) -> waiters
	last := map[string]int64{}       // lock key -> the last holder's token
	seen := map[string]bool{}
	for _, e := range h.Etcd {
		if ns, key, _, ok := etcdkeys.ParseLockWaiterKey(h.Prefix, e.Key); ok {
			lock := ns + "/" + key
			q := queues[lock]
			if q == nil {
				q = lockQueue{}
				queues[lock] = q
			}
			if e.Type == "DELETE" {
				delete(q, e.Key)
			} else {
				q[e.Key] = e.CreateRevision
			}
			if hd := q.holder(); hd != 0 && hd != last[lock] {
				if hd < last[lock] {
					r.violate(&r.LockTokenRegressions, "lock %s: holder with token %d at revision %d after holder %d", lock, hd, e.Revision, last[lock])
				}
				last[lock] = hd
			}
			continue
		}
		ns, key, ok := lockDataKey(e.Key)
		if !ok || e.Type != "PUT" {
			continue
		}
		var v FencedValue
		if err := json.Unmarshal([]byte(e.Value), &v); err != nil {
			r.violate(&r.LockStaleWrites, "lock data key %s at revision %d holds %q, not a worker's value", e.Key, e.Revision, e.Value)
			continue
		}
		seen[v.Writer+"/"+strconv.FormatInt(v.Seq, 10)] = true
		lock := ns + "/" + key
		switch hd := queues[lock].holder(); {
		case v.Token < hd || hd == 0:
			r.violate(&r.LockStaleWrites, "lock %s: %s's write #%d under token %d committed at revision %d, when token %d held it", lock, v.Writer, v.Seq, v.Token, e.Revision, hd)
		case v.Token > hd:
			r.violate(&r.LockDoubleHolders, "lock %s: %s's write #%d under token %d committed at revision %d while token %d held it", lock, v.Writer, v.Seq, v.Token, e.Revision, hd)
		}
	}
	for _, a := range h.Attempts {
		if a.Kind == KindLockWrite && a.OK && !seen[a.Worker+"/"+strconv.FormatInt(a.Seq, 10)] {
			r.violate(&r.Missing, "%s's committed write #%d to %s is not in etcd's history", a.Worker, a.Seq, a.Target)
		}
	}
}

// lockDataKey splits a key workers write under a keyed lock's token,
// <DataPrefix><namespace>/locks/<key>.
func lockDataKey(key string) (namespace, lock string, ok bool) {
	rest, ok := strings.CutPrefix(key, DataPrefix)
	if !ok {
		return "", "", false
	}
	ns, lock, ok := strings.Cut(rest, "/locks/")
	return ns, lock, ok && ns != "" && lock != "" && !strings.Contains(ns, "/")
}
