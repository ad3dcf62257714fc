package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/e2e/history"
)

// lockLoop takes keyed locks as a request handler would: a random set of
// 1 to 3 of n keys, one fenced etcd write per key under its token, then
// Unlock. A worker paused while it held a set wakes up with locks it has
// lost: it writes under their tokens anyway (refused), and retries Unlock
// (the stale unlock, which must delete nothing of the next holder's). Now
// and then it also writes under a token it unlocked (refused), to etcd and
// through the database guard.
func (w *worker) lockLoop(ctx context.Context, n int) {
	l, err := fence.NewLocker(w.etcd, w.prefix, w.namespace, fence.LockerOptions{Pod: w.pod, PodUID: w.podUID, TTL: 3 * time.Second, Timeout: 2 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: locker:", err)
		return
	}
	defer l.Close(context.Background())
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var unlocked, inDoubt []fence.LockToken
	for i := 0; ctx.Err() == nil; i++ {
		set := pickKeys(rng, n)
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lk, err := l.Lock(lctx, set...)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.record(history.Attempt{Kind: history.KindLock, Target: strings.Join(set, ","), Reason: refusalReason(err), Message: err.Error()})
			time.Sleep(w.interval)
			continue
		}
		w.record(history.Attempt{Kind: history.KindLock, Target: strings.Join(set, ","), Token: lk.Tokens()[0].Value, OK: true})
		for _, tok := range lk.Tokens() {
			w.writeLocked(ctx, tok, "")
			w.writeRow(ctx, "lock", tok.Key, tok.Value)
		}
		time.Sleep(w.interval / 2)
		err = lk.Unlock(ctx)
		// Gone for certain only when etcd answered: a lock lost before an
		// Unlock that etcd did not answer says ErrLockLost and
		// ErrEtcdUnavailable, and its keys may still be there until the
		// background delete or its session's expiry.
		gone := err == nil || (errors.Is(err, fence.ErrLockLost) && !errors.Is(err, fence.ErrEtcdUnavailable))
		if gone && err != nil {
			// Lost while held: a retried unlock, as a client library would send it.
			w.staleUnlock(ctx, lk)
		}
		if gone {
			// Its waiter keys are gone, so a write under its tokens must be
			// refused.
			unlocked = recent(unlocked, lk.Tokens())
		} else {
			// An Unlock etcd did not answer may have applied, or left the
			// keys until its background retry or the session deletes them:
			// the lock may still be held. Writes under it are tried as
			// ordinary lock writes, which the checker judges against etcd's
			// history (none may land after a newer holder's token).
			inDoubt = recent(inDoubt, lk.Tokens())
		}
		if i%10 == 4 && len(inDoubt) > 0 {
			tok := inDoubt[rng.IntN(len(inDoubt))]
			w.writeLocked(ctx, tok, "")
		}
		if i%10 == 9 && len(unlocked) > 0 {
			old := unlocked[rng.IntN(len(unlocked))]
			w.writeLocked(ctx, old, "stale-lock-token")
			// The database guard refuses it once a newer token committed
			// for the key; before that, the resource has seen no newer
			// holder and it commits, in order.
			w.writeRow(ctx, "lock", old.Key, old.Value)
		}
		time.Sleep(w.interval)
	}
}

// recent appends toks to list, keeping the last 8 tokens before them.
func recent(list, toks []fence.LockToken) []fence.LockToken {
	return append(list[max(len(list)-8, 0):], toks...)
}

// pickKeys is a random set of 1 to 3 of the keys k0..k(n-1).
func pickKeys(rng *rand.Rand, n int) []string {
	idx := rng.Perm(n)[:1+rng.IntN(min(3, n))]
	out := make([]string, len(idx))
	for i, k := range idx {
		out[i] = "k" + strconv.Itoa(k)
	}
	return out
}

// LockDataKey is where workers write under a keyed lock's token.
func lockDataKey(namespace, key string) string {
	return history.DataPrefix + namespace + "/locks/" + key
}

// writeLocked writes the key's data key under tok in a fenced txn. A
// hostile mode records it as a write that must be refused.
func (w *worker) writeLocked(ctx context.Context, tok fence.LockToken, hostile string) {
	seq := w.nextSeq()
	key := lockDataKey(w.namespace, tok.Key)
	err := w.fencedPut(ctx, tok, key, tok.Value, seq)
	if ctx.Err() != nil {
		return
	}
	a := history.Attempt{Kind: history.KindLockWrite, Lease: tok.Key, Target: key, Token: tok.Value, Seq: seq, OK: err == nil}
	if hostile != "" {
		a.Kind, a.Mode = history.KindHostile, hostile
	}
	if err != nil {
		a.Reason, a.Message = refusalReason(err), err.Error()
	}
	w.record(a)
}

// staleUnlock retries the delete of a lost lock's waiter keys, as a
// retried RPC would: it must find nothing to delete.
func (w *worker) staleUnlock(ctx context.Context, lk *fence.Lock) {
	for _, tok := range lk.Tokens() {
		key := etcdkeys.LockWaiterKey(w.prefix, w.namespace, tok.Key, tok.Waiter)
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := w.etcd.Delete(dctx, key)
		cancel()
		a := history.Attempt{Kind: history.KindHostile, Mode: "stale-unlock", Lease: tok.Key, Target: key, Token: tok.Value, OK: err == nil && resp.Deleted > 0}
		if err != nil {
			a.Reason, a.Message = refusalReason(err), err.Error()
		}
		w.record(a)
	}
}
