// Package lockview reads the keyed locks held in etcd: who holds each lock,
// under which token, since when, and how many wait. `kubectl fencer locks`
// prints it and the manager counts it for its metrics. It only reads.
package lockview

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// Lock is one held keyed lock.
type Lock struct {
	Namespace string
	Key       string
	// Token is the holder's fencing token: its waiter key's CreateRevision.
	Token int64
	// Pod and PodUID are the holder as its SDK recorded them.
	Pod, PodUID string
	// Since is when the holder became holder: when it queued, if no one was
	// ahead, or when the SDK recorded its turn came. Zero if unrecorded.
	Since time.Time
	// Waiting is how many acquisitions queue behind the holder.
	Waiting int
}

// List reads the locks held below prefix, in namespace ("" for all) and
// with keys starting with keyPrefix, sorted by namespace and key. One
// range read, so the view is one revision of etcd.
func List(ctx context.Context, cli *clientv3.Client, prefix, namespace, keyPrefix string) ([]Lock, error) {
	prefix = etcdkeys.OrDefault(prefix)
	from := etcdkeys.LocksPrefix(prefix)
	if namespace != "" {
		from = etcdkeys.NamespaceLocksPrefix(prefix, namespace)
	}
	resp, err := cli.Get(ctx, from, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("reading the keyed locks below %s: %w", from, err)
	}
	type id struct{ ns, key string }
	held := map[id]*Lock{}
	var order []id
	for _, kv := range resp.Kvs {
		ns, key, _, ok := etcdkeys.ParseLockWaiterKey(prefix, string(kv.Key))
		if !ok || len(key) < len(keyPrefix) || key[:len(keyPrefix)] != keyPrefix {
			continue
		}
		k := id{ns, key}
		l, seen := held[k]
		if !seen {
			l = &Lock{Namespace: ns, Key: key, Token: kv.CreateRevision}
			held[k] = l
			order = append(order, k)
		}
		if seen && kv.CreateRevision >= l.Token {
			l.Waiting++
			continue
		}
		if seen { // an older waiter: it holds, the one seen waits
			l.Waiting++
		}
		var v fence.LockHolder
		_ = json.Unmarshal(kv.Value, &v)
		l.Token, l.Pod, l.PodUID, l.Since = kv.CreateRevision, v.Pod, v.PodUID, v.Queued
		if v.Held != nil {
			l.Since = *v.Held
		}
	}
	out := make([]Lock, 0, len(order))
	for _, k := range order {
		out = append(out, *held[k])
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Key < out[j].Key
	})
	return out, nil
}

// Counts are a namespace's held and waiting locks.
type Counts struct{ Held, Waiting int }

// CountByNamespace sums locks per namespace.
func CountByNamespace(locks []Lock) map[string]Counts {
	out := map[string]Counts{}
	for _, l := range locks {
		c := out[l.Namespace]
		c.Held++
		c.Waiting += l.Waiting
		out[l.Namespace] = c
	}
	return out
}
