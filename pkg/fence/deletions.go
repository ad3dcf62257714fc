package fence

import (
	"context"
	"slices"
	"sync"
)

// deletions are the waiter keys a Locker is still deleting, by lock key.
// An acquisition that ends without holding (abandon, retire), or whose
// Unlock etcd did not answer, leaves its waiter keys in their locks'
// queues until they are deleted, which may finish after its caller has
// returned. The Locker's own next Lock of any of those keys waits for that
// deletion first, as long as its ctx allows: a retry made at once, or a
// TryLock, must not find the lock busy behind the caller's own last
// attempt. Other processes see the keys until they go, as they see any
// waiter that leaves.
type deletions struct {
	mu    sync.Mutex
	byKey map[string][]chan struct{}
}

// begin records that waiter keys of keys are being deleted; end, with the
// channel it returns, that they are gone.
func (d *deletions) begin(keys []string) chan struct{} {
	gone := make(chan struct{})
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byKey == nil {
		d.byKey = map[string][]chan struct{}{}
	}
	for _, k := range keys {
		d.byKey[k] = append(d.byKey[k], gone)
	}
	return gone
}

// end records that the deletion begun for keys, whose channel is gone, is
// over, and wakes its waiters.
func (d *deletions) end(keys []string, gone chan struct{}) {
	d.mu.Lock()
	for _, k := range keys {
		left := slices.DeleteFunc(d.byKey[k], func(c chan struct{}) bool { return c == gone })
		if len(left) == 0 {
			delete(d.byKey, k)
		} else {
			d.byKey[k] = left
		}
	}
	d.mu.Unlock()
	close(gone)
}

// of is the deletions of keys under way now, nil if none.
func (d *deletions) of(keys []string) []chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.byKey) == 0 {
		return nil
	}
	var pending []chan struct{}
	for _, k := range keys {
		pending = append(pending, d.byKey[k]...)
	}
	return pending
}

// awaitAll returns once every deletion in pending (of) is over, or with ctx's
// error when ctx ends first.
func awaitAll(ctx context.Context, pending []chan struct{}) error {
	for _, gone := range pending {
		select {
		case <-gone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
