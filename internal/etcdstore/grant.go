package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/internal/etcdlease"
	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// ErrHeld means the lease key already exists: someone holds the lease.
var ErrHeld = errors.New("lease is already granted")

// RevisionFloorError means no Lease is granted because etcd went back in
// time: the manager found etcd's revision below Floor, one it had already
// recorded (a restore from an old snapshot without --bump-revision, or a
// new cluster), and wrote the floor key (etcdkeys.LockFloorKey). A grant
// now would reissue a token of that range, perhaps one an earlier holder
// still offers, to a Lease whose status does not remember it (a Lease
// created since, as a WorkloadLease re-creates its members).
type RevisionFloorError struct{ Floor string }

func (e *RevisionFloorError) Error() string {
	return "etcd's revision is below " + e.Floor + ", which the manager already recorded: etcd was restored from an old snapshot or replaced"
}

// ErrTokenMismatch means a conditional release found another grant (or none)
// under the key: the token given is not the live one.
var ErrTokenMismatch = errors.New("the lease key holds a different grant")

// Grant is a live grant of a Lease, as stored at LeaseKey.
type Grant struct {
	// Token is the CreateRevision of the key: the fencing token.
	Token int64
	// LeaseID is the etcd lease the key is attached to.
	LeaseID clientv3.LeaseID
	// Value is what the key holds.
	GrantValue
	// Unissued is set when the controller did not create this key: its
	// grant marker does not match. Something with write access to the key
	// (a Direct Lease's namespace identity, an etcd admin) wrote it. It is
	// never a token to trust.
	Unissued bool
}

// GrantValue is the JSON stored at a lease key (docs/concepts.md).
type GrantValue struct {
	Holder    string `json:"holder"`
	HolderUID string `json:"holderUID"`
	// LeaseUID is the UID of the Lease object the grant was made for, so
	// that a Lease deleted and created again under the same name never
	// takes on its predecessor's grant. Empty in grants made before
	// fencer recorded it.
	LeaseUID  string    `json:"leaseUID,omitempty"`
	LeaseID   int64     `json:"leaseID"`
	GrantTime time.Time `json:"grantTime"`
	TTL       int64     `json:"ttlSeconds"`
}

// Store reads and writes fencer's etcd keys. Writes are fenced by the term
// of the Elector it was given.
type Store struct {
	cli     *clientv3.Client
	prefix  string
	elector *Elector
	// observe records each etcd operation's latency; nil records nothing.
	observe func(op string, d time.Duration, err error)
	// Timeout bounds each request; zero means DefaultRequestTimeout.
	Timeout time.Duration
	// Log receives the watch's progress; NewStore discards it.
	Log logr.Logger
}

// DefaultRequestTimeout bounds a Store request when no timeout is set.
const DefaultRequestTimeout = 3 * time.Second

// NewStore returns a Store. observe may be nil.
func NewStore(cli *clientv3.Client, prefix string, elector *Elector, observe func(op string, d time.Duration, err error)) *Store {
	return &Store{cli: cli, prefix: prefix, elector: elector, observe: observe, Log: logr.Discard()}
}

// bound gives ctx the store's request timeout.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	d := s.Timeout
	if d <= 0 {
		d = DefaultRequestTimeout
	}
	return context.WithTimeout(ctx, d)
}

// Client is the etcd client behind the store.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Prefix is the root of the store's keys.
func (s *Store) Prefix() string { return s.prefix }

// timed is deferred as `defer s.timed("op")(&err)`: it records the latency
// and outcome of the whole call.
func (s *Store) timed(op string) func(*error) {
	start := time.Now()
	return func(err *error) {
		if s.observe != nil {
			s.observe(op, time.Since(start), *err)
		}
	}
}

// GetGrant returns the live grant of namespace/name, or nil if there is none.
// The read is linearizable.
func (s *Store) GetGrant(ctx context.Context, namespace, name string) (*Grant, error) {
	g, _, err := s.ReadGrant(ctx, namespace, name)
	return g, err
}

// ReadGrant is GetGrant that also returns etcd's revision at the read,
// which the controller compares with the tokens it already issued.
func (s *Store) ReadGrant(ctx context.Context, namespace, name string) (g *Grant, rev int64, err error) {
	defer s.timed("get")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.readGrant(ctx, namespace, name)
}

// readGrant reads a lease key and its grant marker in one linearizable
// read-only transaction.
func (s *Store) readGrant(ctx context.Context, namespace, name string) (*Grant, int64, error) {
	ref := leaseRef{namespace, name}
	resp, err := s.cli.Txn(ctx).Then(s.leaseReads(ref)...).Commit()
	if err != nil {
		return nil, 0, err
	}
	if err := etcdreply.Txn(resp, 2); err != nil {
		return nil, 0, err
	}
	keys, markers, err := leaseReadsAt(resp, 0, ref)
	if err != nil {
		return nil, 0, err
	}
	g, err := grantOf(keys, markers)
	return g, resp.Header.Revision, err
}

// leaseReads reads ref's lease key and its grant marker: the two reads
// grantOf takes, answered by leaseReadsAt.
func (s *Store) leaseReads(ref leaseRef) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(etcdkeys.LeaseKey(s.prefix, ref.namespace, ref.name)),
		clientv3.OpGet(etcdkeys.GrantMarkerKey(s.prefix, ref.namespace, ref.name))}
}

// leaseReadsAt is the lease key and grant marker read at responses i and
// i+1 of resp, which etcdreply.Txn has checked: an error if either answer
// is not a range read's.
func leaseReadsAt(resp *clientv3.TxnResponse, i int, ref leaseRef) (keys, markers []*mvccpb.KeyValue, err error) {
	keys, err = etcdreply.Range(resp, i)
	if err == nil {
		markers, err = etcdreply.Range(resp, i+1)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading lease %s/%s: %w", ref.namespace, ref.name, err)
	}
	return keys, markers, nil
}

// grantOf is the grant a lease key's read shows, given the key's and its
// grant marker's KeyValues (none or one each); nil if the key is absent.
func grantOf(keys, markers []*mvccpb.KeyValue) (*Grant, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	kv := keys[0]
	// A grant is written once, by the transaction that also writes the
	// marker, and never rewritten: a key re-created (CreateRevision) or
	// rewritten in place (Version), as a namespace identity may do to a
	// Direct lease's key to change its holder or detach it from its etcd
	// lease, is no grant.
	if len(markers) == 0 || markers[0].ModRevision != kv.CreateRevision || kv.Version != 1 {
		// Whatever it holds, even garbage, it is to be deleted, not decoded.
		return &Grant{Token: kv.CreateRevision, LeaseID: clientv3.LeaseID(kv.Lease), Unissued: true}, nil
	}
	return decodeGrant(kv.Key, kv.Value, kv.CreateRevision, kv.Lease)
}

func decodeGrant(key, value []byte, createRev, lease int64) (*Grant, error) {
	g := &Grant{Token: createRev, LeaseID: clientv3.LeaseID(lease)}
	if err := json.Unmarshal(value, &g.GrantValue); err != nil {
		return nil, fmt.Errorf("etcd key %s holds malformed JSON: %w", key, err)
	}
	return g, nil
}

// GrantLease creates the lease key for holder, attached to a new etcd lease
// of ttl, in one transaction that also checks this controller's term, that
// the key is absent, and that the Lease object (leaseUID) has not been
// deleted (DeletedLeaseKey) and that the lock floor is absent
// (etcdkeys.LockFloorKey). It returns ErrHeld if someone holds the lease,
// ErrLeaseDeleted if the Lease's deletion was admitted, a
// *RevisionFloorError while etcd's revision is below the lock floor, and
// ErrNotLeader if this controller has been deposed.
func (s *Store) GrantLease(ctx context.Context, namespace, name, leaseUID, holder, holderUID string, ttl time.Duration, now time.Time) (g *Grant, err error) {
	defer s.timed("grant")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	term, err := s.elector.Term()
	if err != nil {
		return nil, err
	}
	key := etcdkeys.LeaseKey(s.prefix, namespace, name)
	var val GrantValue
	// The marker, written in the same transaction, has the key's
	// CreateRevision as its ModRevision: how readers tell this grant from
	// a key someone else re-created.
	marker := clientv3.OpPut(etcdkeys.GrantMarkerKey(s.prefix, namespace, name), "")
	deleted := etcdkeys.DeletedLeaseKey(s.prefix, namespace, name, leaseUID)
	floor := etcdkeys.LockFloorKey(s.prefix)
	// Neither deleted nor below the lock floor: the floor key exists while
	// etcd's revision is below one already seen, so every token issued now
	// may have been issued before.
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Version(deleted), "=", 0), clientv3.Compare(clientv3.Version(floor), "=", 0)}
	resp, ok, leaseID, err := s.createLeased(ctx, term, key, ttl, func(l *clientv3.LeaseGrantResponse) (string, error) {
		val = GrantValue{Holder: holder, HolderUID: holderUID, LeaseUID: leaseUID, LeaseID: int64(l.ID), GrantTime: now.UTC(), TTL: l.TTL}
		raw, err := json.Marshal(val)
		return string(raw), err
	}, cmps, marker)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, s.whyNotGranted(ctx, key, deleted, floor)
	}
	return &Grant{Token: resp.Header.Revision, LeaseID: leaseID, GrantValue: val}, nil
}

// whyNotGranted tells a grant refused because the Lease object was deleted
// (ErrLeaseDeleted) or the key is held (ErrHeld) from one refused at the
// lock floor, etcd having gone back in time (a *RevisionFloorError).
func (s *Store) whyNotGranted(ctx context.Context, key, deletedKey, floorKey string) error {
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(deletedKey, clientv3.WithKeysOnly()), clientv3.OpGet(key, clientv3.WithKeysOnly()),
		clientv3.OpGet(floorKey)).Commit()
	if err != nil {
		return err
	}
	reads, err := etcdreply.Reads(resp, 3, 0)
	switch {
	case err != nil:
		return err
	case len(reads[0]) > 0:
		return ErrLeaseDeleted
	case len(reads[1]) == 0 && len(reads[2]) > 0:
		return &RevisionFloorError{Floor: string(reads[2][0].Value)}
	}
	return ErrHeld // or released since: the next pass reads it again
}

// createLeased is the write behind every grant and slot: it takes a new etcd
// lease of ttl, under an ID no other identity can find before the key is on
// it (etcdlease), and, in one transaction fenced by term, creates key with the
// value made for that lease, only if key is absent (ok false: it exists)
// and every comparison in cmps holds.
// The etcd lease is revoked unless the key was created, so a failed attempt
// leaves nothing behind.
func (s *Store) createLeased(ctx context.Context, term Term, key string, ttl time.Duration, value func(*clientv3.LeaseGrantResponse) (string, error), cmps []clientv3.Cmp, also ...clientv3.Op) (*clientv3.TxnResponse, bool, clientv3.LeaseID, error) {
	lease, err := etcdlease.Grant(ctx, s.cli, int64(ttl/time.Second))
	if err != nil {
		return nil, false, 0, err
	}
	val, err := value(lease)
	if err != nil {
		s.Revoke(lease.ID)
		return nil, false, 0, err
	}
	resp, ok, err := term.commit(ctx, s.cli, append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, cmps...),
		append([]clientv3.Op{clientv3.OpPut(key, val, clientv3.WithLease(lease.ID))}, also...)...)
	if !ok {
		s.Revoke(lease.ID)
	}
	return resp, ok, lease.ID, err
}

// Release deletes the lease key only if it still holds the grant with token,
// and only while this controller leads; then it revokes the grant's etcd
// lease, in the background. A plain delete could remove a newer holder's
// key.
func (s *Store) Release(ctx context.Context, namespace, name string, g *Grant) (err error) {
	defer s.timed("release")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	term, err := s.elector.Term()
	if err != nil {
		return err
	}
	key := etcdkeys.LeaseKey(s.prefix, namespace, name)
	_, ok, err := term.commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", g.Token)}, clientv3.OpDelete(key))
	if err != nil {
		return err
	}
	if !ok {
		return ErrTokenMismatch
	}
	// The delete ended the tenure: every fence and watcher goes by the key.
	// The revoke only frees the etcd lease early, so it runs beside the
	// next grant instead of before it, one write off a failover.
	go s.Revoke(g.LeaseID)
	return nil
}

// GrantedLeases names every Lease that etcd holds a grant or a grant marker
// of, so that a resync finds those whose Lease object is gone.
func (s *Store) GrantedLeases(ctx context.Context) ([]types.NamespacedName, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var out []types.NamespacedName
	seen := map[types.NamespacedName]bool{}
	for _, prefix := range []string{etcdkeys.LeasesPrefix(s.prefix), etcdkeys.GrantMarkersPrefix(s.prefix)} {
		resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		for _, kv := range resp.Kvs {
			ns, name, ok := etcdkeys.SplitLeaseKey(prefix, string(kv.Key))
			if n := (types.NamespacedName{Namespace: ns, Name: name}); ok && !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// ForgetLease deletes the grant marker of a Lease being deleted, once its
// grant is released. A marker left behind would be harmless (it matches no
// future key), only clutter.
// It is fenced like a grant: a deposed controller, or one that looked
// before the Lease was created again and granted by the new leader, must
// not delete the marker of a live grant (the grant would read as never
// issued), so it deletes only while this term holds and no lease key
// exists.
func (s *Store) ForgetLease(ctx context.Context, namespace, name string) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	term, err := s.elector.Term()
	if err != nil {
		return err
	}
	_, _, err = term.commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(etcdkeys.LeaseKey(s.prefix, namespace, name)), "=", 0)},
		clientv3.OpDelete(etcdkeys.GrantMarkerKey(s.prefix, namespace, name)))
	return err
}

// Revoke drops an etcd lease that no key needs, best effort: an unrevoked
// lease only expires later, attached to nothing.
func (s *Store) Revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = s.cli.Revoke(ctx, id)
}

// RemainingTTL is how long etcd will keep lease id alive without renewal.
func (s *Store) RemainingTTL(ctx context.Context, id clientv3.LeaseID) (d time.Duration, err error) {
	defer s.timed("ttl")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	resp, err := s.cli.TimeToLive(ctx, id)
	if err != nil {
		return 0, err
	}
	return max(time.Duration(resp.TTL)*time.Second, 0), nil
}

// LeaseAlive tells whether etcd still has lease id, however little of its
// TTL is left (etcd reports whole seconds, rounded down).
func (s *Store) LeaseAlive(ctx context.Context, id clientv3.LeaseID) (alive bool, err error) {
	defer s.timed("ttl")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	resp, err := s.cli.TimeToLive(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return resp.TTL >= 0, nil
}

// liveOf is the webhook's view of a grant read at revision rev. A key the
// controller did not create is no grant: its token is refused.
func liveOf(g *Grant, rev int64) Live {
	live := Live{Revision: rev, Grant: g}
	if g != nil && g.Unissued {
		live.Grant, live.Unissued = nil, g.Token
	}
	return live
}
