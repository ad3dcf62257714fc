package etcdstore

import (
	"context"
	"encoding/json"
	"errors"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/idgen"
)

// ErrExhausted means an IDRange has nothing left to hand out.
var ErrExhausted = idgen.ErrExhausted

// Block is a claimed range of IDs, both ends inclusive.
type Block = idgen.Block

// ClaimBlock hands out the next block of up to size IDs in [min,max] to
// pod (name and UID) with the shared claim transaction (idgen.Claim),
// fenced by this controller's term. The same transaction records whom the
// block is for (etcdkeys.IDRangeClaimKey), which idgen.ConsumeBlock
// checks. When fewer than size IDs remain, the shorter final block is
// handed out; after it, ErrExhausted.
func (s *Store) ClaimBlock(ctx context.Context, namespace, name string, min, max, size int64, pod, podUID string) (b Block, next int64, err error) {
	defer s.timed("claim")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	c := idgen.Claim{Cli: s.cli, Key: etcdkeys.IDRangeNextKey(s.prefix, namespace, name), Min: min, Max: max, Size: size,
		Record: func(b Block) ([]clientv3.Op, error) {
			v, err := json.Marshal(idgen.BlockClaim{Pod: pod, PodUID: podUID, Last: b.Last})
			return []clientv3.Op{clientv3.OpPut(etcdkeys.IDRangeClaimKey(s.prefix, namespace, name, b.First), string(v))}, err
		}}
	for {
		term, err := s.elector.Term()
		if err != nil {
			return Block{}, 0, err
		}
		c.Guard, c.OrElse = []clientv3.Cmp{term.cmp()}, term.orElse()
		b, claimed, resp, err := c.Try(ctx)
		switch {
		case errors.Is(err, ErrExhausted):
			return Block{}, b.First, err
		case err != nil:
			return Block{}, 0, err
		case claimed:
			return b, b.Last + 1, nil
		}
		if err := term.heldIn(resp); err != nil {
			return Block{}, 0, err
		}
		// Another claimer moved next first: read it again.
	}
}

// BlockClaimed says whether annotation (a pod's idrange.fencer.io/<name>
// value) is a block this controller claimed for the pod podUID: its claim
// record names exactly that block and pod. A forged, copied or damaged
// annotation is not, and idgen.ConsumeBlock would refuse it.
func (s *Store) BlockClaimed(ctx context.Context, namespace, name, annotation string, podUID types.UID) (ok bool, err error) {
	b, err := idgen.ParseBlock(annotation)
	if err != nil {
		return false, nil
	}
	defer s.timed("get")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, etcdkeys.IDRangeClaimKey(s.prefix, namespace, name, b.First))
	if err != nil || len(resp.Kvs) == 0 {
		return false, err
	}
	var c idgen.BlockClaim
	return json.Unmarshal(resp.Kvs[0].Value, &c) == nil && c.Names(b, podUID), nil
}

// ReadNext returns the next unallocated ID (min if nothing was claimed yet).
func (s *Store) ReadNext(ctx context.Context, namespace, name string, min int64) (int64, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	next, _, err := idgen.Claim{Cli: s.cli, Key: etcdkeys.IDRangeNextKey(s.prefix, namespace, name), Min: min}.ReadNext(ctx)
	return next, err
}
