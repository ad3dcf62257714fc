// Package history is the record of a fault run and its checker. Workers
// append what they attempted (writes and the IDs they issued); the harness
// appends what actually happened (the apiserver's watch of fenced objects,
// the Lease statuses it saw, and etcd's full history). Check replays it all
// against the guarantees of docs/guarantees.md.
//
// A run's files live in one directory:
//
//	workers/<name>.jsonl  Attempt lines from each worker
//	objects.jsonl         ObjectEvent lines: every version of every fenced ConfigMap
//	leases.jsonl          LeaseEvent lines: every Lease status token observed
//	etcd.jsonl            EtcdEvent lines: etcd's history from revision 1
//	faults.jsonl          Fault lines: what the nemesis did, and when
//	db.jsonl              DBCommit lines: the database workers' audit table
package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Kinds of Attempt.
const (
	KindConfigMap = "configmap" // a fenced ConfigMap write through the apiserver
	KindEtcd      = "etcd"      // a fenced etcd transaction (pkg/fence.Txn)
	KindIDs       = "ids"       // a run of IDs issued by pkg/idgen.Blocks
	KindSnowflake = "snowflake" // IDs issued by a pkg/idgen.Snowflake (IDs)
	// KindReport is a pod reporting that it holds Lease Lease under token
	// Token, as read from its own annotations at At.
	KindReport = "report"
	// KindRelabel is a pod relabelled out of a Lease's selector (Target)
	// while it held the Lease; it is put back later. Not a write.
	KindRelabel = "relabel"
	// KindLock is a keyed lock's acquisition (Target: its keys, comma
	// separated; Token: its token); refused when Lock failed.
	KindLock = "lock"
	// KindLockWrite is a fenced etcd write under a keyed lock's token
	// (Lease: the lock's key; Target: the data key).
	KindLockWrite = "lock-write"
	// KindHostile is a write the SDK never sends: no token, a forged or old
	// token, a label removal, or a write that cannot carry a token. Every
	// one must be refused.
	KindHostile = "hostile"
)

// Reasons a write was refused. Each names a cause the checker accepts; any
// other reason is a violation (a refusal nobody can explain).
const (
	ReasonFenced             = "fenced"              // the webhook or the etcd txn refused the token
	ReasonWebhookUnavailable = "webhook-unavailable" // the apiserver could not call the webhook (failurePolicy Fail)
	ReasonTokenUnavailable   = "token-unavailable"   // the webhook could not read the live token from etcd (503)
	ReasonEtcdUnavailable    = "etcd-unavailable"    // the worker could not reach etcd
	ReasonTimeout            = "timeout"             // the worker gave up waiting (it may have been paused)
	ReasonRace               = "race"                // the apiserver's own conflict: another writer created or changed the object first
)

// KnownReasons is every reason the checker accepts.
var KnownReasons = map[string]bool{
	ReasonFenced: true, ReasonWebhookUnavailable: true, ReasonTokenUnavailable: true,
	ReasonEtcdUnavailable: true, ReasonTimeout: true, ReasonRace: true,
	ReasonDBUnavailable: true,
}

// Attempt is one thing a worker did.
type Attempt struct {
	At     time.Time `json:"at"`
	Worker string    `json:"worker"`
	Kind   string    `json:"kind"`
	Lease  string    `json:"lease,omitempty"`
	// Target is the ConfigMap name or the etcd key.
	Target string `json:"target,omitempty"`
	Token  int64  `json:"token,omitempty"`
	// Seq numbers a worker's writes, so the checker can find each accepted
	// write in the histories.
	Seq     int64  `json:"seq,omitempty"`
	OK      bool   `json:"ok"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"msg,omitempty"`
	// Mode names a hostile write (KindHostile): one of HostileModes.
	Mode string `json:"mode,omitempty"`
	// Lo and Hi bound a run of consecutive IDs (KindIDs), inclusive.
	Lo int64 `json:"lo,omitempty"`
	Hi int64 `json:"hi,omitempty"`
	// IDs are snowflake IDs (KindSnowflake).
	IDs []int64 `json:"ids,omitempty"`
}

// ObjectEvent is one version of a fenced object, from the apiserver's watch.
// What a hostile write leaves on a fenced object when the apiserver
// applies it: the worker's hostile writes set them, and the checker finds
// the writes that were applied by them, whatever their clients saw.
const (
	// HostileWriterPrefix starts the data.writer of a hostile write.
	HostileWriterPrefix = "hostile-"
	// HostileAnnotation is the annotation the hostile annotate sets.
	HostileAnnotation = "hostile"
)

type ObjectEvent struct {
	Name            string `json:"name"`
	ResourceVersion int64  `json:"rv"`
	Type            string `json:"type"`
	Token           int64  `json:"token"`
	Writer          string `json:"writer"`
	Seq             int64  `json:"seq"`
	// Hostile is the object's "hostile" annotation, which only a hostile
	// annotate sets; Unlabelled says the object had lost its
	// fencer.io/lease label, which only a hostile label removal takes
	// away. The checker reads them, and hostile writers and deletions, as
	// hostile writes the apiserver applied, whatever their clients saw.
	Hostile    string `json:"hostile,omitempty"`
	Unlabelled bool   `json:"unlabelled,omitempty"`
	// DataToken is the token the writing worker put in the object's data
	// beside the one it sent: the webhook's record (Token) must match it.
	DataToken int64 `json:"dataToken,omitempty"`
}

// LeaseEvent is a Lease status the harness saw, in watch order, and when.
type LeaseEvent struct {
	Name            string    `json:"name"`
	ResourceVersion int64     `json:"rv"`
	Token           int64     `json:"token"`
	Holder          string    `json:"holder"`
	At              time.Time `json:"at"`
}

// EtcdEvent is one change in etcd's history.
type EtcdEvent struct {
	Revision       int64  `json:"rev"`
	Type           string `json:"type"` // PUT or DELETE
	Key            string `json:"key"`
	CreateRevision int64  `json:"create,omitempty"`
	Version        int64  `json:"version,omitempty"`
	Value          string `json:"value,omitempty"`
}

// Fault is one fault the nemesis injected.
type Fault struct {
	At     time.Time     `json:"at"`
	Kind   string        `json:"kind"`
	Target string        `json:"target"`
	For    time.Duration `json:"for"`
}

// FencedValue is what workers write to their fenced etcd keys.
type FencedValue struct {
	Token  int64  `json:"token"`
	Writer string `json:"writer"`
	Seq    int64  `json:"seq"`
}

// Writer appends JSON lines to a file; safe for concurrent use. Each line is
// one write call, so a process killed mid-run leaves whole lines.
type Writer struct {
	mu sync.Mutex
	f  *os.File
}

// Create opens path for appending, creating its directory.
func Create(path string) (*Writer, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f}, nil
}

// Add appends v as one line.
func (w *Writer) Add(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err = w.f.Write(append(b, '\n'))
	return err
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// readLines decodes every line of path into values made by newT; a missing
// file is empty.
func readLines[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, n, err)
		}
		out = append(out, v)
	}
	return out, sc.Err()
}
