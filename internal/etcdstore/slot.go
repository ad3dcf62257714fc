package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/idgen"
)

// Slot is a live worker-ID slot lease.
type Slot struct {
	N int64
	// Token is the CreateRevision of the slot key; it fences the generator
	// that uses the slot and grows every time the slot is leased again.
	Token   int64
	LeaseID clientv3.LeaseID
	SlotValue
}

// SlotValue is the JSON stored at a slot key (docs/concepts.md); the
// snowflake generator reads it to refuse a slot leased to another pod.
type SlotValue = idgen.SlotValue

// Slots lists the live slots of an IDRange, in no particular order.
func (s *Store) Slots(ctx context.Context, namespace, name string) (slots []Slot, err error) {
	defer s.timed("slots")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	prefix := etcdkeys.IDRangeSlotsPrefix(s.prefix, namespace, name)
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	for _, kv := range resp.Kvs {
		_, _, n, ok := etcdkeys.ParseSlotKey(s.prefix, string(kv.Key))
		if !ok {
			continue // slots/<n>/clock, the SDK generator's reserved time, or foreign
		}
		sl := Slot{N: n, Token: kv.CreateRevision, LeaseID: clientv3.LeaseID(kv.Lease)}
		if err := json.Unmarshal(kv.Value, &sl.SlotValue); err != nil {
			return nil, fmt.Errorf("etcd key %s holds malformed JSON: %w", kv.Key, err)
		}
		slots = append(slots, sl)
	}
	return slots, nil
}

// LeaseSlot leases the lowest free slot in [min,max] to a pod, attached to a
// new etcd lease of ttl, in a transaction fenced by this controller's term
// that requires the slot key to be absent. taken lists the slots known to be
// live. It returns ErrExhausted when every slot is taken.
func (s *Store) LeaseSlot(ctx context.Context, namespace, name string, min, max int64, taken []Slot, pod, podUID string, ttl time.Duration) (sl *Slot, err error) {
	defer s.timed("slot")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	used := make(map[int64]bool, len(taken))
	for _, t := range taken {
		used[t.N] = true
	}
	val, err := json.Marshal(SlotValue{Pod: pod, PodUID: podUID})
	if err != nil {
		return nil, err
	}
	for n := min; n <= max && n >= min; n++ { // n >= min stops at int64 overflow
		if used[n] {
			continue
		}
		term, err := s.elector.Term()
		if err != nil {
			return nil, err
		}
		resp, ok, leaseID, err := s.createLeased(ctx, term, etcdkeys.SlotKey(s.prefix, namespace, name, n), ttl,
			func(*clientv3.LeaseGrantResponse) (string, error) { return string(val), nil }, nil)
		if err != nil {
			return nil, err
		}
		if ok {
			return &Slot{N: n, Token: resp.Header.Revision, LeaseID: leaseID, SlotValue: SlotValue{Pod: pod, PodUID: podUID}}, nil
		}
		// Slot n was taken meanwhile (its key still lives): try the next.
	}
	return nil, ErrExhausted
}

// ReleaseSlots deletes the slot keys of an IDRange being deleted, each only
// while it is still the slot listed (its CreateRevision, the slot's token)
// and this controller's term holds, then revokes its etcd lease. A slot's
// generator is fenced off at once. A deposed leader that paused inside a
// finalize cannot release the slots of a range recreated under the same
// name since: ErrNotLeader.
func (s *Store) ReleaseSlots(ctx context.Context, namespace, name string, slots []Slot) error {
	term, err := s.elector.Term()
	if err != nil {
		return err
	}
	for _, sl := range slots {
		key := etcdkeys.SlotKey(s.prefix, namespace, name, sl.N)
		bctx, cancel := s.bound(ctx)
		_, ok, err := term.commit(bctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", sl.Token)}, clientv3.OpDelete(key))
		if err == nil && ok {
			// The key is what fences the generator; its lease, now
			// holding nothing, would expire with its TTL anyway.
			_, _ = s.cli.Revoke(bctx, sl.LeaseID)
		}
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// DeleteNext removes an IDRange's next key; only on explicit opt-in, since a
// recreated range would then reissue IDs. It is fenced by the term: a
// deposed leader that paused inside a finalize must not delete the key of a
// range recreated under the same name since, which its pods' allocators
// may already be claiming from.
func (s *Store) DeleteNext(ctx context.Context, namespace, name string) error {
	term, err := s.elector.Term()
	if err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	_, _, err = term.commit(ctx, s.cli, nil, clientv3.OpDelete(etcdkeys.IDRangeNextKey(s.prefix, namespace, name)))
	return err
}
