package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/internal/etcdlease"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// ErrLeaseDeleted means a grant was refused because the Lease object it was
// for has been deleted: fencer's webhook admitted its DELETE (and wrote its
// DeletedLeaseKey), though the controller's cache may still show it.
var ErrLeaseDeleted = errors.New("the Lease's deletion was admitted")

// ErrDeletionChanged means a deletion record is not the one read: the
// Lease's DELETE was admitted again since.
var ErrDeletionChanged = errors.New("the Lease's deletion record changed since it was read")

// releaseTries bounds ReleaseDeleted's attempts when grants come and go
// between its read and its write.
const releaseTries = 5

// DeletionRecordTTL is how long etcd keeps a Lease's deletion record (its
// DeletedLeaseKey is attached to an etcd lease of this TTL). The record
// only has to outlive every cache that may still show the deleted Lease:
// the controller's, from which it would otherwise grant the Lease again.
const DeletionRecordTTL = time.Hour

// ReleaseDeleted is what the webhook does as it admits the DELETE of the
// Lease object namespace/name with UID uid, before the apiserver removes
// it. In one transaction it releases the Lease's grant, whatever Lease
// object it was made for (the conditional release: only if the key still
// holds the grant just read), and writes the Lease's DeletedLeaseKey, so
// that no grant is made for that object again (GrantLease compares it).
// The grant's etcd lease is then revoked. It returns the grant released,
// nil if there was none. A grant made for another Lease object of the same
// name is not released.
//
// So once the apiserver has removed the Lease, etcd holds no grant of it,
// and no write can be accepted under one: the Lease's absence and its
// grant's release are ordered without a finalizer.
//
// It is not fenced by the controller's term: every webhook replica serves
// it, leader or not, and a release fenced by the token can only end the
// grant the Lease's deletion ends anyway.
func (s *Store) ReleaseDeleted(ctx context.Context, namespace, name, uid string, at time.Time) (g *Grant, err error) {
	defer s.timed("release_deleted")(&err)
	if uid == "" {
		return nil, fmt.Errorf("the Lease %s/%s being deleted has no UID", namespace, name)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	key := etcdkeys.LeaseKey(s.prefix, namespace, name)
	life, err := etcdlease.Grant(ctx, s.cli, int64(DeletionRecordTTL/time.Second))
	if err != nil {
		return nil, err
	}
	mark := clientv3.OpPut(etcdkeys.DeletedLeaseKey(s.prefix, namespace, name, uid), at.UTC().Format(time.RFC3339Nano), clientv3.WithLease(life.ID))
	for try := 0; try < releaseTries; try++ {
		g, _, err := s.readGrant(ctx, namespace, name)
		if err != nil {
			return nil, err
		}
		cmps, ops := releaseOps(key, mark, g, uid)
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			s.Revoke(life.ID)
			return nil, err
		}
		if !resp.Succeeded {
			continue // a grant came or went since the read: read again
		}
		if !releases(g, uid) {
			g = nil
		}
		if g != nil && !g.Unissued {
			go s.Revoke(g.LeaseID)
		}
		return g, nil
	}
	s.Revoke(life.ID)
	return nil, fmt.Errorf("the grant of Lease %s/%s changed under each of %d attempts to release it", namespace, name, releaseTries)
}

// releases tells whether the deletion of the Lease object uid ends grant g:
// its own grant, a grant made before grants recorded their Lease, or a key
// fencer never issued. A grant of another Lease object of the name (one
// created since) is left alone.
func releases(g *Grant, uid string) bool {
	return g != nil && (g.Unissued || g.LeaseUID == "" || g.LeaseUID == uid)
}

// releaseOps is ReleaseDeleted's transaction for grant g as read: delete
// the key if the deletion ends g, and write the record, anew each time the
// DELETE is admitted (a retried DELETE may commit long after the first
// one was refused elsewhere: the controller's check that the Lease is
// still there must count from the last admission, and the new revision
// makes a lift read before it fail). It fails if the key changed since.
func releaseOps(key string, mark clientv3.Op, g *Grant, uid string) ([]clientv3.Cmp, []clientv3.Op) {
	var token int64 // 0: the key is absent
	if g != nil {
		token = g.Token
	}
	ops := []clientv3.Op{mark}
	if releases(g, uid) {
		ops = append(ops, clientv3.OpDelete(key))
	}
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", token)}, ops
}

// Deletion is a DeletedLeaseKey: the Lease object with UID was deleted at
// At (the admitting webhook replica's clock), Age ago (etcd's clock, from
// the record's etcd lease); Revision is the key's ModRevision.
type Deletion struct {
	types.NamespacedName
	UID      string
	At       time.Time
	Age      time.Duration
	Revision int64
}

// DeletionOf returns the deletion recorded for the Lease object
// namespace/name with UID uid, or nil if none is.
func (s *Store) DeletionOf(ctx context.Context, namespace, name, uid string) (*Deletion, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, etcdkeys.DeletedLeaseKey(s.prefix, namespace, name, uid))
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	kv := resp.Kvs[0]
	d, err := deletionOf(s.prefix, kv.Key, kv.Value, kv.ModRevision)
	if err != nil {
		return nil, err
	}
	// The age comes from etcd, not from comparing two replicas' clocks.
	ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil {
		return nil, err
	}
	d.Age = time.Duration(ttl.GrantedTTL-max(ttl.TTL, 0)) * time.Second
	return d, nil
}

func deletionOf(prefix string, key, value []byte, rev int64) (*Deletion, error) {
	ns, name, uid, ok := etcdkeys.ParseDeletedLeaseKey(prefix, string(key))
	if !ok {
		return nil, fmt.Errorf("etcd key %s is not a Lease deletion record", key)
	}
	at, err := time.Parse(time.RFC3339Nano, string(value))
	if err != nil {
		return nil, fmt.Errorf("etcd key %s holds %q, not a time: %w", key, value, err)
	}
	return &Deletion{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, UID: uid, At: at, Revision: rev}, nil
}

// ForgetDeletion deletes a deletion record before it expires, only if it is
// still the one read (its ModRevision) and only while this controller
// leads; ErrDeletionChanged if the record is not the one read. The caller has confirmed with the apiserver, well after the
// record was written, that the Lease object still exists and is not being
// deleted: the DELETE the webhook admitted never happened (another
// admission check refused it), and the Lease may be granted again.
func (s *Store) ForgetDeletion(ctx context.Context, d *Deletion) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	term, err := s.elector.Term()
	if err != nil {
		return err
	}
	key := etcdkeys.DeletedLeaseKey(s.prefix, d.Namespace, d.Name, d.UID)
	_, ok, err := term.commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", d.Revision)}, clientv3.OpDelete(key))
	if err == nil && !ok {
		return ErrDeletionChanged
	}
	return err
}
