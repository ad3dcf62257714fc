package idgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

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
	first, ok1 := canonicalNumber(firstS)
	last, ok2 := canonicalNumber(lastS)
	if !ok1 || !ok2 || first > last {
		return Block{}, bad
	}
	return Block{First: first, Last: last}, nil
}

// canonicalNumber reads a number of an annotation fencer writes: decimal
// digits as fencerv1.FormatToken prints them, so no sign and no leading
// zero ("07" is no number the controller wrote, though it reads as 7).
func canonicalNumber(s string) (int64, bool) {
	n, err := fencerv1.ParseToken(s)
	return n, err == nil && fencerv1.FormatToken(n) == s
}

// ErrBlockNotClaimed means the annotation names a block that fencer's
// controller never handed to this pod: forged (block=2-999999), copied from
// another pod, or damaged. Its IDs may belong to another pod, so it must
// not be used.
var ErrBlockNotClaimed = errors.New("idgen: the annotated block was not handed to this pod")

// BlockClaim is the controller's record of a block it handed to a pod
// (etcdkeys.IDRangeClaimKey), written in the transaction that claims it.
type BlockClaim struct {
	Pod    string `json:"pod"`
	PodUID string `json:"podUID"`
	Last   int64  `json:"last"`
}

// Names says whether the record is of block b, handed to the pod podUID.
func (c BlockClaim) Names(b Block, podUID types.UID) bool {
	return c.Last == b.Last && c.PodUID == string(podUID)
}

// ConsumeBlock takes the block of annotation (the pod's
// idrange.fencer.io/<idrange> value) for this container start, once. The
// block must be one the controller handed to this pod: its claim record
// must name exactly this block and podUID (the pod's own UID, from the
// Downward API's metadata.uid), or ErrBlockNotClaimed. It then creates the
// block's consumed marker in etcd, If(CreateRevision(marker) == 0), so only
// the first start gets the block. A later start gets ErrBlockConsumed and
// must not issue from it.
func ConsumeBlock(ctx context.Context, cli *clientv3.Client, prefix, namespace, idrange, annotation string, podUID types.UID) (Block, error) {
	b, err := ParseBlock(annotation)
	if err != nil {
		return Block{}, err
	}
	if podUID == "" {
		return Block{}, errors.New("idgen: ConsumeBlock needs the pod's UID (the Downward API's metadata.uid)")
	}
	if cli == nil {
		return Block{}, errors.New("idgen: ConsumeBlock needs an etcd client (fence.LoadEtcdAccess makes one)")
	}
	prefix = etcdkeys.OrDefault(prefix)
	if err := etcdkeys.CheckPrefix(prefix); err != nil {
		return Block{}, fmt.Errorf("idgen: ConsumeBlock: %w", err)
	}
	claimKey := etcdkeys.IDRangeClaimKey(prefix, namespace, idrange, b.First)
	claimRev, err := checkClaim(ctx, cli, claimKey, b, podUID)
	if err != nil {
		return Block{}, fmt.Errorf("block %d-%d of %s/%s: %w", b.First, b.Last, namespace, idrange, err)
	}
	key := etcdkeys.IDRangeConsumedKey(prefix, namespace, idrange, b.First)
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), clientv3.Compare(clientv3.ModRevision(claimKey), "=", claimRev)).
		Then(clientv3.OpPut(key, string(podUID))).
		Commit()
	if err != nil {
		return Block{}, fmt.Errorf("idgen: marking block %d-%d consumed: %w", b.First, b.Last, err)
	}
	if !resp.Succeeded {
		return Block{}, fmt.Errorf("block %d-%d of %s/%s: %w", b.First, b.Last, namespace, idrange, ErrBlockConsumed)
	}
	return b, nil
}

// checkClaim reads the claim record of b and returns its ModRevision when
// it names b and podUID.
func checkClaim(ctx context.Context, cli *clientv3.Client, claimKey string, b Block, podUID types.UID) (int64, error) {
	resp, err := cli.Get(ctx, claimKey)
	if err != nil {
		return 0, fmt.Errorf("idgen: reading the claim record: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, fmt.Errorf("fencer never claimed a block starting at %d (no %s): %w", b.First, claimKey, ErrBlockNotClaimed)
	}
	var c BlockClaim
	if err := json.Unmarshal(resp.Kvs[0].Value, &c); err != nil {
		return 0, fmt.Errorf("claim record %s holds %q: %w", claimKey, resp.Kvs[0].Value, ErrBlockNotClaimed)
	}
	if !c.Names(b, podUID) {
		return 0, fmt.Errorf("fencer handed block %d-%d to pod %s (uid %s), not %d-%d to this pod (uid %s): %w",
			b.First, c.Last, c.Pod, c.PodUID, b.First, b.Last, podUID, ErrBlockNotClaimed)
	}
	return resp.Kvs[0].ModRevision, nil
}
