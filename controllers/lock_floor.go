package controllers

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// revisionKey is the ConfigMap key holding the highest etcd revision seen.
const revisionKey = "revision"

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update,namespace=fencer-system

// LockFloor keeps keyed locks and Leases from reissuing tokens after etcd
// went back in time. A Lease's status remembers its own highest token (a
// Lease created since remembers none), but keyed locks are granted by the
// SDK straight in etcd, with no apiserver on the path, so the leader
// records etcd's revision in a ConfigMap (outside etcd, so a restore
// cannot take it back) every Every. When it finds etcd's revision below
// the one recorded (restored from an old snapshot without --bump-revision,
// or replaced), it writes the lock floor key: while it exists the SDK
// queues no lock and the Lease controller grants nothing. Once etcd's
// revision has passed the floor, the key goes. Tokens issued after the
// last record and before the failure are not covered: docs/operations.md
// says to restore with --bump-revision.
type LockFloor struct {
	// Client writes the ConfigMap, Reader reads it uncached: a cached read
	// would watch every ConfigMap of the cluster.
	Client client.Client
	Reader client.Reader
	Etcd   *clientv3.Client
	Prefix string
	// Record is the ConfigMap that holds the revision. Without one the
	// check is off, and Start only deletes a floor an earlier check left:
	// at once, or, with KeepFloor, once etcd's revision has passed it.
	Record types.NamespacedName
	// KeepFloor, with no Record, keeps a leftover floor while etcd's
	// revision is below it: for a manager that cannot record (no namespace
	// to put the ConfigMap in) but was not told to drop the protection.
	KeepFloor bool
	Every     time.Duration
	Log       logr.Logger
}

// Start checks every Every until ctx ends. With the check off, it deletes
// a leftover floor, retrying every Every until etcd answers, and ends; with
// KeepFloor it looks every Every, and deletes the floor once etcd's
// revision has passed it.
func (f *LockFloor) Start(ctx context.Context) error {
	off := f.Record.Name == ""
	for {
		switch {
		case off && f.KeepFloor:
			if err := f.passFloor(ctx); err != nil && ctx.Err() == nil {
				f.Log.Error(err, "checking etcd's revision against a lock floor left by an earlier revision check")
			}
		case off:
			err := f.openLeftover(ctx)
			if err == nil || ctx.Err() != nil {
				return nil
			}
			f.Log.Error(err, "deleting a lock floor left by an earlier revision check")
		default:
			if err := f.check(ctx); err != nil && ctx.Err() == nil {
				// While this fails, a restore of etcd goes unnoticed here.
				f.Log.Error(err, "checking etcd's revision against the last one recorded", "record", f.Record)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.Every):
		}
	}
}

// NeedLeaderElection: one replica records and acts.
func (f *LockFloor) NeedLeaderElection() bool { return true }

func (f *LockFloor) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The record first, then etcd: every revision recorded was read from
	// etcd before this read, so a leader that lost its election but has
	// not noticed yet, recording a revision read after ours, cannot make
	// ours look like a regression.
	cm := &corev1.ConfigMap{}
	err := f.Reader.Get(ctx, f.Record, cm)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	recorded, _ := strconv.ParseInt(strings.TrimSpace(cm.Data[revisionKey]), 10, 64)
	floorKey := etcdkeys.LockFloorKey(f.Prefix)
	resp, err := f.Etcd.Get(ctx, floorKey) // linearizable: its header is etcd's revision now
	if err != nil {
		return err
	}
	rev, err := etcdreply.Revision(resp.Header)
	if err != nil {
		return err
	}
	must := recorded
	if floor, ok := floorValue(resp.Kvs); ok && floor > must {
		// A floor above the record: the record was lost or went back (the
		// ConfigMap deleted, renamed with the release, edited, or
		// restored from a cluster backup) after an earlier check closed
		// the floor. The floor is what etcd must pass; an operator who
		// knows the alarm was false deletes it by hand
		// (docs/operations.md).
		must = floor
	}
	if rev < must {
		floor := strconv.FormatInt(must, 10)
		if len(resp.Kvs) > 0 && string(resp.Kvs[0].Value) == floor {
			return nil // closed already
		}
		if v, ok := floorValue(resp.Kvs); !ok || v < must { // no floor, one that is not a number, or an older one
			f.Log.Error(nil, "etcd's revision is below one already seen: etcd was restored from an old snapshot or replaced; keyed locks and Lease grants are closed until its revision passes the one recorded (docs/operations.md)",
				"revision", rev, "recorded", must, "record", f.Record)
			metrics.RevisionRegressions.Inc()
		}
		_, err := f.Etcd.Put(ctx, floorKey, floor)
		return err
	}
	if err := f.open(ctx, resp.Kvs, rev); err != nil {
		return err
	}
	if rev == recorded {
		return nil
	}
	return f.record(ctx, cm, rev)
}

// open deletes the floor read as kvs (if any) at etcd revision rev, the
// floor that revision has passed; the delete compares the floor's
// ModRevision, so a floor written since stays.
func (f *LockFloor) open(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64) error {
	if len(kvs) == 0 {
		return nil
	}
	floorKey := etcdkeys.LockFloorKey(f.Prefix)
	resp, err := f.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(floorKey), "=", kvs[0].ModRevision)).Then(clientv3.OpDelete(floorKey)).Commit()
	if err != nil || !resp.Succeeded {
		return err // a floor written since stays, for the next check
	}
	f.Log.Info("etcd's revision passed the lock floor: keyed locks and Lease grants are open again", "revision", rev)
	return nil
}

// floorValue reads the floor key's revision, when kvs holds one. Spaces
// around it are allowed: etcdctl put from a file or stdin keeps a newline.
func floorValue(kvs []*mvccpb.KeyValue) (int64, bool) {
	if len(kvs) == 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(kvs[0].Value)), 10, 64)
	return v, err == nil
}

// passFloor is the check of a LockFloor that cannot record (KeepFloor):
// a floor an earlier check left goes once etcd's revision passes it, as
// the check would delete it, and not before.
func (f *LockFloor) passFloor(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := f.Etcd.Get(ctx, etcdkeys.LockFloorKey(f.Prefix))
	if err != nil || len(resp.Kvs) == 0 {
		return err
	}
	rev, err := etcdreply.Revision(resp.Header)
	if err != nil {
		return err
	}
	if floor, ok := floorValue(resp.Kvs); ok && rev < floor {
		return nil
	}
	// Passed, or not a number (no check wrote it): the check would delete
	// it too, and nothing else would.
	return f.open(ctx, resp.Kvs, rev)
}

// record writes rev into the ConfigMap, creating it if need be.
func (f *LockFloor) record(ctx context.Context, cm *corev1.ConfigMap, rev int64) error {
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[revisionKey] = strconv.FormatInt(rev, 10)
	if cm.ResourceVersion == "" {
		cm.Name, cm.Namespace = f.Record.Name, f.Record.Namespace
		return f.Client.Create(ctx, cm)
	}
	return f.Client.Update(ctx, cm)
}

// openLeftover deletes a floor an earlier check left, for a LockFloor
// whose check is off (no Record): only the check deletes the floor, and
// while it exists no keyed lock is queued and no Lease granted, so the
// check turned off must not leave them closed for ever.
func (f *LockFloor) openLeftover(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := f.Etcd.Delete(ctx, etcdkeys.LockFloorKey(f.Prefix), clientv3.WithPrevKV())
	if err != nil {
		return err
	}
	if len(resp.PrevKvs) > 0 {
		f.Log.Info("the revision check is off (--etcd-revision-configmap): deleted the lock floor an earlier check left, which closed keyed locks and Lease grants",
			"floor", string(resp.PrevKvs[0].Value))
	}
	return nil
}
