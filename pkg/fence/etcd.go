package fence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// FencedError means an etcd transaction was fenced off: the lease key no
// longer holds the grant with the offered token, or the keyed lock is no
// longer held under it.
type FencedError struct {
	// Key is the lease key compared, or the keyed lock's waiter prefix.
	Key string
	// Offered is the token the transaction carried.
	Offered int64
	// Current is the live token, 0 if nobody holds the lease.
	Current int64
}

func (e *FencedError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("fence: token %d is fenced off: %s has no holder", e.Offered, e.Key)
	}
	return fmt.Sprintf("fence: token %d is fenced off: %s is held under token %d", e.Offered, e.Key, e.Current)
}

// ErrNoToken is returned, before any transaction, for a token ≤ 0: an absent
// key's CreateRevision is 0, so a fence on token 0 would pass exactly when
// nobody holds the lease.
var ErrNoToken = errors.New("fence: a fencing token must be positive")

// EtcdFence is what fences an etcd transaction: a Lease's Token, or a
// keyed lock's LockToken. Each knows the comparisons that hold exactly
// while it is live.
type EtcdFence interface {
	etcdFence(prefix, namespace string) (fenceCheck, error)
}

// fenceCheck is one token's fence: the comparisons that hold exactly while
// it is live, and, for a *FencedError when they fail, the key it names and
// a read (run in the transaction's Else) that finds the live token.
type fenceCheck struct {
	key     string
	offered int64
	cmps    []clientv3.Cmp
	reads   []clientv3.Op
	// current reads the live token from the answers to reads, in order.
	current func(reads [][]*mvccpb.KeyValue) int64
}

// etcdFence is a Lease token's fence: CreateRevision(leaseKey) == t.Value,
// Version 1, since fencer writes a grant once, and the grant marker's
// ModRevision == t.Value, since fencer writes the marker with the key. A
// key rewritten in place, or deleted and created again, by something with
// write access to it (a Direct holder may write its own, to renew it) is
// no grant, and its revision is no token.
func (t Token) etcdFence(prefix, namespace string) (fenceCheck, error) {
	if t.Value <= 0 {
		return fenceCheck{}, fmt.Errorf("lease %s/%s token %d: %w", namespace, t.Lease, t.Value, ErrNoToken)
	}
	if namespace == "" || t.Lease == "" {
		return fenceCheck{}, fmt.Errorf("%w: a Lease token's fence needs the namespace and the Token's Lease, got %q and %q", ErrMisconfigured, namespace, t.Lease)
	}
	prefix = etcdkeys.OrDefault(prefix)
	if err := etcdkeys.CheckPrefix(prefix); err != nil {
		return fenceCheck{}, fmt.Errorf("%w: %w", ErrMisconfigured, err)
	}
	key := etcdkeys.LeaseKey(prefix, namespace, t.Lease)
	marker := etcdkeys.GrantMarkerKey(prefix, namespace, t.Lease)
	return fenceCheck{
		key: key, offered: t.Value,
		cmps: []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(key), "=", t.Value),
			clientv3.Compare(clientv3.Version(key), "=", 1),
			clientv3.Compare(clientv3.ModRevision(marker), "=", t.Value),
		},
		reads: []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(marker)},
		current: func(reads [][]*mvccpb.KeyValue) int64 {
			if g := issuedGrant(reads[0], reads[1]); g != nil {
				return g.CreateRevision
			}
			return 0
		},
	}, nil
}

// readGrant reads a Lease's key and its grant marker in one read, and
// returns the key when it holds a grant the controller issued (nil when
// it holds none), and etcd's revision at the read.
func readGrant(ctx context.Context, cli *clientv3.Client, prefix, namespace, lease string) (*mvccpb.KeyValue, int64, error) {
	prefix = etcdkeys.OrDefault(prefix)
	if err := etcdkeys.CheckPrefix(prefix); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrMisconfigured, err)
	}
	if namespace == "" || lease == "" {
		return nil, 0, fmt.Errorf("%w: reading a grant needs the namespace and the Lease's name, got %q and %q", ErrMisconfigured, namespace, lease)
	}
	key := etcdkeys.LeaseKey(prefix, namespace, lease)
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(key), clientv3.OpGet(etcdkeys.GrantMarkerKey(prefix, namespace, lease))).Commit()
	if err != nil {
		return nil, 0, err
	}
	reads, err := etcdreply.Reads(resp, 2, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("fence: reading lease %s/%s: %w", namespace, lease, err)
	}
	return issuedGrant(reads[0], reads[1]), resp.Header.Revision, nil
}

// issuedGrant is the lease key of keys if it holds a grant the controller
// issued, given the read of its grant marker: written once (Version 1), in
// the transaction that also wrote the marker. Anything else is nil.
func issuedGrant(keys, markers []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(keys) == 0 || len(markers) == 0 {
		return nil
	}
	if kv := keys[0]; kv.Version == 1 && markers[0].ModRevision == kv.CreateRevision {
		return kv
	}
	return nil
}

// Compare is the fence as etcd comparisons, all true exactly while t is
// live: for a Lease's Token, CreateRevision(leaseKey) == t.Value, Version
// 1 and ModRevision(grant marker) == t.Value (a grant the controller
// issued); for a
// keyed lock's LockToken, its waiter key exists with that revision and no
// older waiter remains. Combine them with your own comparisons in a
// clientv3 Txn's If; NewTxn does that for the common case.
func Compare(prefix, namespace string, t EtcdFence) ([]clientv3.Cmp, error) {
	f, err := fenceOf(t, prefix, namespace)
	return f.cmps, err
}

// fenceOf is t's fence; a nil t is misconfigured, not a panic.
func fenceOf(t EtcdFence, prefix, namespace string) (fenceCheck, error) {
	if t == nil {
		return fenceCheck{}, fmt.Errorf("%w: no token to fence with (a Token or a LockToken)", ErrMisconfigured)
	}
	return t.etcdFence(prefix, namespace)
}

// Txn is an etcd transaction that commits only while its token is live:
// If(the fence's comparisons) Then(ops). The check and the writes are one
// atomic step inside etcd.
type Txn struct {
	cli   *clientv3.Client
	fence fenceCheck
	err   error
	ops   []clientv3.Op
}

// NewTxn starts a fenced transaction for t, a Lease's Token or a keyed
// lock's LockToken, in namespace, under fencer's etcd prefix
// (etcdkeys.DefaultPrefix unless fencer was started with --etcd-prefix).
func NewTxn(cli *clientv3.Client, prefix, namespace string, t EtcdFence) *Txn {
	f, err := fenceOf(t, prefix, namespace)
	if cli == nil && err == nil {
		err = errNoClient
	}
	return &Txn{cli: cli, fence: f, err: err}
}

// errNoClient: an etcd call was given no client (LoadEtcdAccess makes one).
var errNoClient = fmt.Errorf("%w: no etcd client (fence.LoadEtcdAccess makes one)", ErrMisconfigured)

// Then adds operations to run when the token is live.
func (x *Txn) Then(ops ...clientv3.Op) *Txn {
	x.ops = append(x.ops, ops...)
	return x
}

// Commit runs the transaction. It returns a *FencedError when the token is
// not live, and then nothing was written, or ErrNoToken, before any I/O,
// for a token ≤ 0.
func (x *Txn) Commit(ctx context.Context) (*clientv3.TxnResponse, error) {
	if x.err != nil {
		return nil, x.err
	}
	resp, err := x.cli.Txn(ctx).If(x.fence.cmps...).Then(x.ops...).Else(x.fence.reads...).Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		// The Else branch ran: nothing was written.
		reads, err := etcdreply.Reads(resp, len(x.fence.reads), 0)
		if err != nil {
			return nil, fmt.Errorf("fence: %w", err)
		}
		return resp, &FencedError{Key: x.fence.key, Offered: x.fence.offered, Current: x.fence.current(reads)}
	}
	return resp, nil
}

// ErrMalformedAnswer is the cause of an error from an answer of etcd's that
// does not match its request: no header or no revision in it, a response
// missing, or one of another kind than its operation. etcd never sends
// one; a faulty proxy between the client and etcd could. Nothing is read
// from such an answer: handle it as etcd being unavailable. Every package
// of this SDK (fence, idgen, dbfence) wraps it.
var ErrMalformedAnswer = etcdreply.ErrMalformed

// ErrLeaseLost is the cause of a Hold context's cancellation.
var ErrLeaseLost = errors.New("fence: the lease was lost")

// Hold keeps a renewal: Direct lease alive for its holder and returns a
// context that is cancelled, with cause ErrLeaseLost, the moment the lease
// is lost: its key is deleted or re-granted, etcd reports the lease expired,
// or no keepalive has succeeded for a whole TTL (the process was paused or
// cut off, so etcd has expired it or is about to). Work done under the
// token must stop when the context ends. Cancel ctx to stop renewing.
func Hold(ctx context.Context, cli *clientv3.Client, prefix, namespace string, t Token) (context.Context, error) {
	if t.LeaseID == 0 {
		return nil, fmt.Errorf("fence: token of lease %s has no etcd lease ID; Hold is for renewal: Direct leases", t.Lease)
	}
	if cli == nil {
		return nil, errNoClient
	}
	key := etcdkeys.LeaseKey(etcdkeys.OrDefault(prefix), namespace, t.Lease)
	kv, readAt, err := readGrant(ctx, cli, prefix, namespace, t.Lease)
	if err != nil {
		return nil, err
	}
	if kv == nil || kv.CreateRevision != t.Value {
		e := &FencedError{Key: key, Offered: t.Value}
		if kv != nil {
			e.Current = kv.CreateRevision
		}
		return nil, e
	}
	if kv.Lease != t.LeaseID {
		// The lease ID came from an annotation anyone who may edit the pod
		// can change: renewing it would keep some other grant alive, and
		// let this one expire under work that believes it is held.
		return nil, fmt.Errorf("fence: the grant of %s under token %d is on etcd lease %x, not on lease %x, which the token names: the token's lease ID was edited or copied; read the token again", key, t.Value, kv.Lease, t.LeaseID)
	}
	asked := time.Now()
	ttlResp, err := cli.TimeToLive(ctx, clientv3.LeaseID(t.LeaseID))
	if err != nil {
		return nil, err
	}
	if ttlResp.TTL <= 0 {
		return nil, fmt.Errorf("fence: etcd lease %d of %s has expired: %w", t.LeaseID, key, ErrLeaseLost)
	}
	held, lose := context.WithCancelCause(ctx)
	ttl := time.Duration(ttlResp.GrantedTTL) * time.Second
	go keepAliveFrom(held, lose, cli, clientv3.LeaseID(t.LeaseID), ttl, renewedAt(asked, ttlResp.TTL, ttl), false)
	go func() {
		if err := WatchHeld(held, cli, key, t.Value, readAt); errors.Is(err, ErrLeaseLost) {
			lose(err)
		}
	}()
	return held, nil
}

// renewedAt is the latest time a lease of TTL ttl could have been renewed
// for etcd, asked at asked, to report remaining seconds (rounded down)
// left of it: etcd's expiry lies no earlier than asked + remaining, so a
// renewal at that time less ttl never outlives it. Holding from the time
// Hold was called instead, with the whole TTL, outlived etcd's expiry by
// as much of the TTL as had gone before the call, whenever no renewal got
// through after it (one etcd refused, a pod cut off). remaining counts
// for at most ttl, so the result is never after asked: etcd before
// v3.5.14 could answer a lease's remaining TTL as 292 years from a
// lessor the leader had just demoted, and a proxy can send anything.
func renewedAt(asked time.Time, remaining int64, ttl time.Duration) time.Time {
	left := min(time.Duration(max(remaining, 0))*time.Second, ttl)
	return asked.Add(left - ttl)
}

// keepAliveFrom renews a lease every TTL/3 and declares it lost once a
// full TTL has passed since lastOK without a successful renewal. lastOK is
// when a request that renewed (or granted) it was sent, or earlier: etcd
// renewed no earlier, so lastOK+TTL never lies after etcd's own expiry.
//
// deniedIsFinal ends the lease at the first renewal etcd refuses as not
// permitted, for a lease whose keys the caller's identity has long been
// allowed to write (a Locker's session): etcd renews only for a user who
// may write every key on it, so another's key is on it, or the role was
// taken away. Hold passes false: a grant can reach its holder before the
// manager has given the namespace's role its key, and the refusal then
// lasts only until it has.
func keepAliveFrom(ctx context.Context, lose func(error), cli *clientv3.Client, id clientv3.LeaseID, ttl time.Duration, lastOK time.Time, deniedIsFinal bool) {
	tick := max(ttl/3, 100*time.Millisecond)
	for {
		deadline := lastOK.Add(ttl)
		rctx, cancel := context.WithDeadline(ctx, deadline)
		sent := time.Now()
		resp, err := cli.KeepAliveOnce(rctx, id)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && resp.TTL > 0:
			lastOK = sent
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			lose(fmt.Errorf("etcd lease %x expired: %w", int64(id), ErrLeaseLost))
			return
		case deniedIsFinal && errors.Is(err, rpctypes.ErrPermissionDenied):
			// Waiting for the TTL would only hide why.
			lose(fmt.Errorf("etcd refused to renew lease %x: %w: %w", int64(id), ErrLeaseLost, err))
			return
		}
		if !time.Now().Before(deadline) {
			lose(fmt.Errorf("no keepalive of etcd lease %x (TTL %s) succeeded before etcd's expiry: %w: %w", int64(id), ttl, ErrLeaseLost, ErrEtcdUnavailable))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(tick, time.Until(deadline))):
		}
	}
}

// WatchHeld returns once key no longer holds the grant whose CreateRevision
// is token: deleted, or created anew. It watches from fromRev; whenever the
// watch ends (compacted history, a lost member, a leader change) it reads the
// key again. A key that still holds CreateRevision token held it all along,
// since a deleted key never comes back with the same create revision, so the
// watch resumes from that read and a compaction is never a blind spot. It
// also returns, with ctx's error, when ctx ends.
func WatchHeld(ctx context.Context, cli *clientv3.Client, key string, token, fromRev int64) error {
	if cli == nil {
		return errNoClient
	}
	for ctx.Err() == nil {
		for wr := range cli.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(fromRev+1)) {
			if wr.CompactRevision != 0 || wr.Err() != nil {
				break // history unreadable: re-read below
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != token {
					return fmt.Errorf("key %s was deleted or granted anew: %w", key, ErrLeaseLost)
				}
			}
			fromRev = max(fromRev, wr.Header.Revision)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.Get(gctx, key)
		cancel()
		if err != nil {
			continue // etcd is away; try again
		}
		readAt, err := etcdreply.Revision(resp.Header)
		if err != nil {
			continue // as if etcd were away: an answer that cannot be read
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != token {
			return fmt.Errorf("key %s was deleted or granted anew: %w", key, ErrLeaseLost)
		}
		fromRev = max(fromRev, readAt)
	}
	return ctx.Err()
}

// Release gives a renewal: Direct lease back before its TTL runs out, so
// the next holder is granted it at once instead of one TTL later. It
// deletes the lease key only while t is its live token, in one etcd
// transaction (If CreateRevision(key) == t.Value Then Delete(key)): a
// holder that already lost the lease, or a stale copy of its token, can
// never end another holder's grant; that is the unlock a TTL lock lacks.
// It returns a *FencedError, having deleted nothing, when t is not live.
//
// Stop the Hold that renews the lease first (cancel its context), and stop
// the work done under t: once Release returns, the token is refused.
// fencer records the tenure's end as Released.
func Release(ctx context.Context, cli *clientv3.Client, prefix, namespace string, t Token) error {
	if t.LeaseID == 0 {
		return fmt.Errorf("fence: token of lease %s has no etcd lease ID; Release is for renewal: Direct leases", t.Lease)
	}
	key := etcdkeys.LeaseKey(etcdkeys.OrDefault(prefix), namespace, t.Lease)
	_, err := NewTxn(cli, prefix, namespace, t).Then(clientv3.OpDelete(key)).Commit(ctx)
	return err
}
