package etcdstore

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// LeaseEvent is a change of a lease key.
type LeaseEvent struct {
	Namespace, Name string
	// Deleted is true when the key was deleted or its etcd lease expired.
	Deleted bool
	// At is when the watcher received the event.
	At time.Time
}

// WatchLeases calls fn for every change below the leases prefix until ctx
// ends, re-establishing the watch after errors (compaction, lost member).
// After each re-establishment it calls resync, since events may have been
// missed in between.
func (s *Store) WatchLeases(ctx context.Context, fn func(LeaseEvent), resync func()) {
	log := s.Log.WithName("lease-watch")
	prefix := etcdkeys.LeasesPrefix(s.prefix)
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range s.cli.Watch(wctx, prefix, clientv3.WithPrefix()) {
			if err := resp.Err(); err != nil {
				log.Info("lease watch interrupted; re-establishing", "err", err.Error())
				break
			}
			now := time.Now()
			for _, ev := range resp.Events {
				ns, name, ok := etcdkeys.SplitLeaseKey(prefix, string(ev.Kv.Key))
				if !ok {
					continue
				}
				fn(LeaseEvent{Namespace: ns, Name: name, Deleted: ev.Type == clientv3.EventTypeDelete, At: now})
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		resync()
	}
}
