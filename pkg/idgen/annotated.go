package idgen

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// ErrBlockConsumed means the annotated block was already consumed, by an
// earlier start of this pod's container (a crash, an OOM kill, a liveness
// restart all leave the annotation in place). Its IDs may have been issued,
// so it must not be used again: claim blocks with NewBlocks instead.
var ErrBlockConsumed = errors.New("idgen: the annotated block was already consumed by an earlier container start")

// Block is an inclusive range of IDs delivered in a pod annotation.
type Block struct{ First, Last int64 }

// ParseBlock reads the annotation the controller writes on a Blocks-mode
// pod, "block=<first>-<last>", strictly.
func ParseBlock(annotation string) (Block, error) {
	bad := fmt.Errorf("idgen: %q is not a block annotation (block=<first>-<last>)", annotation)
	span, ok := strings.CutPrefix(annotation, "block=")
	firstS, lastS, ok2 := strings.Cut(span, "-")
	if !ok || !ok2 {
		return Block{}, bad
	}
	first, err1 := fencerv1.ParseToken(firstS)
	last, err2 := fencerv1.ParseToken(lastS)
	if err1 != nil || err2 != nil || first > last {
		return Block{}, bad
	}
	return Block{First: first, Last: last}, nil
}

// ConsumeBlock claims the block of annotation (the pod's
// idrange.fencer.io/<idrange> value) for this container start, once: it
// creates the block's consumed marker in etcd, If(CreateRevision(marker) ==
// 0), so only the first start gets the block. A later start gets
// ErrBlockConsumed and must not issue from it. holder names the consumer in
// the marker (the pod UID, say) for people reading etcd.
func ConsumeBlock(ctx context.Context, cli *clientv3.Client, prefix, namespace, idrange, annotation, holder string) (Block, error) {
	b, err := ParseBlock(annotation)
	if err != nil {
		return Block{}, err
	}
	key := etcdkeys.IDRangeConsumedKey(etcdkeys.OrDefault(prefix), namespace, idrange, b.First)
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, holder)).
		Commit()
	if err != nil {
		return Block{}, fmt.Errorf("idgen: marking block %d-%d consumed: %w", b.First, b.Last, err)
	}
	if !resp.Succeeded {
		return Block{}, fmt.Errorf("block %d-%d of %s/%s: %w", b.First, b.Last, namespace, idrange, ErrBlockConsumed)
	}
	return b, nil
}
