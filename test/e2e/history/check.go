package history

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// DataPrefix is where workers keep their fenced etcd keys:
// <DataPrefix><namespace>/<lease>, the data keys their namespace's etcd
// identity may write (etcdkeys.DataPrefix under /fencer).
const DataPrefix = "/fencer/data/"

// Report is what Check found. Any non-zero violation count fails the run.
type Report struct {
	Faults   int
	Accepted int
	Refused  int
	// RefusedBy counts refusals by reason.
	RefusedBy map[string]int
	// HostileBy counts hostile writes by mode, and Reports the tokens
	// workers read from their pods, so a run shows what it exercised.
	HostileBy map[string]int
	Reports   int
	Relabels  int // holders relabelled out of a selector (KindRelabel)
	IDs       int64

	StaleAccepted    int // a write accepted under a token below one already accepted, or not live
	DoubleGrants     int // a lease or slot key overwritten while held, or a pod holding two slots
	TokenRegressions int // a Lease's token went down, or a grant's token was not above the last one
	DuplicateIDs     int // IDs issued twice (blocks or snowflakes), or a next-ID key that went backwards
	// StaleReports counts pods that reported holding a token more than
	// ReportBound after the Lease's status showed its tenure over.
	StaleReports int
	// Keyed locks (locks.go): a write under a token that was not the
	// holder's when it committed, older (stale) or younger (two holders);
	// and a lock's holders' tokens going down.
	LockStaleWrites      int
	LockDoubleHolders    int
	LockTokenRegressions int
	// The database guard (database.go): a commit under a token below one
	// committed before it for the same resource. DBCommits counts the
	// audit table's rows.
	DBStaleCommits  int
	DBCommits       int
	DBRefusedBy     map[string]int // the guarded transactions' refusals, by reason
	DBCommitsByKind map[string]int // commits under Lease tokens (lease) and lock tokens (lock)
	Unexplained     int            // refusals with no reason the checker can name
	Missing         int            // accepted writes absent from the histories: the history is incomplete
	Hostile         int            // hostile writes tried (KindHostile)
	HostileAccepted int            // hostile writes the apiserver accepted

	// Violations describes the first violations found.
	Violations []string
}

// Summary is the one line a fault run ends with.
func (r *Report) Summary() string {
	return fmt.Sprintf("faults: %d injected, writes accepted %d refused %d, stale accepted %d, double grants %d, token regressions %d, duplicate ids %d, stale reports %d, locks: stale writes %d, two holders %d, token regressions %d, database: commits %d out of order %d, hostile writes %d accepted %d",
		r.Faults, r.Accepted, r.Refused, r.StaleAccepted, r.DoubleGrants, r.TokenRegressions, r.DuplicateIDs, r.StaleReports,
		r.LockStaleWrites, r.LockDoubleHolders, r.LockTokenRegressions, r.DBCommits, r.DBStaleCommits, r.Hostile, r.HostileAccepted)
}

// OK reports whether no guarantee was violated.
func (r *Report) OK() bool {
	return r.StaleAccepted+r.DoubleGrants+r.TokenRegressions+r.DuplicateIDs+r.StaleReports+
		r.LockStaleWrites+r.LockDoubleHolders+r.LockTokenRegressions+r.DBStaleCommits+r.Unexplained+r.Missing+r.HostileAccepted == 0
}

// violate counts one violation and describes the first 20 of each counter,
// so one flood of a kind cannot hide the others.
func (r *Report) violate(counter *int, format string, args ...any) {
	*counter++
	if *counter <= 20 {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// Histories is a whole run, as read from its directory.
type Histories struct {
	Attempts []Attempt
	Objects  []ObjectEvent
	Leases   []LeaseEvent
	Etcd     []EtcdEvent
	Faults   []Fault
	// DB is the database workers' audit table, when the run had them.
	DB []DBCommit
	// Prefix is fencer's etcd prefix.
	Prefix string
}

// Load reads the histories in dir.
func Load(dir, prefix string) (*Histories, error) {
	h := &Histories{Prefix: prefix}
	workers, err := filepath.Glob(filepath.Join(dir, "workers", "*.jsonl"))
	if err != nil {
		return nil, err
	}
	for _, w := range workers {
		as, err := readLines[Attempt](w)
		if err != nil {
			return nil, err
		}
		h.Attempts = append(h.Attempts, as...)
	}
	if h.Objects, err = readLines[ObjectEvent](filepath.Join(dir, "objects.jsonl")); err != nil {
		return nil, err
	}
	if h.Leases, err = readLines[LeaseEvent](filepath.Join(dir, "leases.jsonl")); err != nil {
		return nil, err
	}
	if h.Etcd, err = readLines[EtcdEvent](filepath.Join(dir, "etcd.jsonl")); err != nil {
		return nil, err
	}
	if h.Faults, err = readLines[Fault](filepath.Join(dir, "faults.jsonl")); err != nil {
		return nil, err
	}
	if h.DB, err = readLines[DBCommit](filepath.Join(dir, "db.jsonl")); err != nil {
		return nil, err
	}
	return h, nil
}

// Check replays the histories against every guarantee.
func Check(h *Histories) *Report {
	r := &Report{Faults: len(h.Faults), RefusedBy: map[string]int{}, HostileBy: map[string]int{}}
	r.attempts(h)
	r.objects(h)
	grants := r.grants(h)
	r.fencedKeys(h, grants)
	r.leaseTokens(h)
	r.slots(h)
	r.blocks(h)
	r.ids(h)
	r.snowflakes(h)
	r.reports(h)
	r.locks(h)
	r.database(h)
	return r
}

// attempts counts writes and checks every refusal has a nameable reason.
func (r *Report) attempts(h *Histories) {
	for _, a := range h.Attempts {
		if a.Kind == KindRelabel {
			r.Relabels++
		}
		if a.Kind == KindIDs || a.Kind == KindSnowflake || a.Kind == KindReport || a.Kind == KindRelabel {
			continue
		}
		if a.Kind == KindHostile {
			r.Hostile++
			r.HostileBy[a.Mode]++
			if a.OK {
				r.violate(&r.HostileAccepted, "%s's hostile write (%s) to %s under lease %s (token %d) was accepted", a.Worker, a.Mode, a.Target, a.Lease, a.Token)
			}
			continue
		}
		if a.OK {
			r.Accepted++
			continue
		}
		r.Refused++
		r.RefusedBy[a.Reason]++
		if !KnownReasons[a.Reason] {
			r.violate(&r.Unexplained, "%s's %s write #%d (token %d) was refused for no nameable reason: %q", a.Worker, a.Kind, a.Seq, a.Token, a.Message)
		}
	}
}

// objects: per fenced object, in resourceVersion order, tokens never go
// down, the webhook's record is the token the write sent, and no hostile
// write was applied (hostileApplied); and every write a worker saw
// accepted is in the watch history.
func (r *Report) objects(h *Histories) {
	byName := map[string][]ObjectEvent{}
	seen := map[string]bool{}
	for _, e := range h.Objects {
		byName[e.Name] = append(byName[e.Name], e)
		seen[e.Writer+"/"+strconv.FormatInt(e.Seq, 10)] = true
	}
	for name, evs := range byName {
		slices.SortFunc(evs, func(a, b ObjectEvent) int { return cmpInt(a.ResourceVersion, b.ResourceVersion) })
		var top ObjectEvent
		hostileMark := ""
		for _, e := range evs {
			hostile := r.hostileApplied(name, e, hostileMark)
			hostileMark = e.Hostile
			if e.Type == "DELETED" {
				continue
			}
			// A hostile version is judged as any accepted write too (a
			// forged token accepted is a token later writes fall below),
			// but its data still holds the last worker's token, not one
			// it sent.
			if !hostile && e.Writer != "" && e.DataToken != 0 && e.Token != e.DataToken {
				r.violate(&r.StaleAccepted, "object %s: %s's write #%d sent token %d, and the webhook recorded %d at rv %d",
					name, e.Writer, e.Seq, e.DataToken, e.Token, e.ResourceVersion)
			}
			if e.Token < top.Token {
				r.violate(&r.StaleAccepted, "object %s: %s's write #%d under token %d accepted at rv %d after %s's write #%d under token %d at rv %d",
					name, e.Writer, e.Seq, e.Token, e.ResourceVersion, top.Writer, top.Seq, top.Token, top.ResourceVersion)
			}
			if e.Token >= top.Token {
				top = e
			}
		}
	}
	for _, a := range h.Attempts {
		if a.Kind == KindConfigMap && a.OK && !seen[a.Worker+"/"+strconv.FormatInt(a.Seq, 10)] {
			r.violate(&r.Missing, "%s's accepted write #%d to %s is not in the apiserver's watch history", a.Worker, a.Seq, a.Target)
		}
	}
}

// hostileApplied reports, as hostile writes accepted, the traces in an
// object's history that only a hostile write leaves, whatever its client
// saw (a write that timed out while its worker was paused may still have
// been applied): a version by a hostile writer, the HostileAnnotation
// set or changed (mark is the last version's), the label gone, the object
// deleted. No worker deletes or unlabels an object. It says whether e is
// such a trace.
func (r *Report) hostileApplied(name string, e ObjectEvent, mark string) bool {
	switch {
	case e.Type == "DELETED":
		r.violate(&r.HostileAccepted, "object %s was deleted at rv %d: no worker deletes it, so a hostile DELETE was applied", name, e.ResourceVersion)
	case e.Unlabelled:
		r.violate(&r.HostileAccepted, "object %s lost its fencer.io/lease label at rv %d: a hostile label removal was applied", name, e.ResourceVersion)
	case strings.HasPrefix(e.Writer, HostileWriterPrefix):
		r.violate(&r.HostileAccepted, "object %s: a write by %s was applied at rv %d", name, e.Writer, e.ResourceVersion)
	case e.Hostile != mark:
		r.violate(&r.HostileAccepted, "object %s: the hostile annotation became %q at rv %d: a tokenless annotate was applied", name, e.Hostile, e.ResourceVersion)
	default:
		return false
	}
	return true
}

// tenure is one grant of a lease key: live over [Token, End).
type tenure struct {
	Token, End int64
}

// grants rebuilds each lease key's tenures from etcd and checks a grant is
// only ever created on an empty key, with a token above the last one.
func (r *Report) grants(h *Histories) map[string][]tenure {
	out := map[string][]tenure{}
	for _, e := range h.Etcd {
		if _, _, ok := etcdkeys.ParseLeaseKey(h.Prefix, e.Key); !ok {
			continue
		}
		ts := out[e.Key]
		open := len(ts) > 0 && ts[len(ts)-1].End == 0
		switch e.Type {
		case "PUT":
			if open || e.Version != 1 {
				r.violate(&r.DoubleGrants, "lease key %s written at revision %d (version %d) while the grant with token %d was live", e.Key, e.Revision, e.Version, lastToken(ts))
				continue
			}
			if e.CreateRevision <= lastToken(ts) {
				r.violate(&r.TokenRegressions, "lease key %s granted with token %d after token %d", e.Key, e.CreateRevision, lastToken(ts))
			}
			out[e.Key] = append(ts, tenure{Token: e.CreateRevision})
		case "DELETE":
			if open {
				ts[len(ts)-1].End = e.Revision
			}
		}
	}
	return out
}

func lastToken(ts []tenure) int64 {
	if len(ts) == 0 {
		return 0
	}
	return ts[len(ts)-1].Token
}

// liveAt is the token of the grant live at revision rev, 0 if none.
func liveAt(ts []tenure, rev int64) int64 {
	for _, t := range ts {
		if t.Token <= rev && (t.End == 0 || rev < t.End) {
			return t.Token
		}
	}
	return 0
}

// fencedKeys: every write to a worker's fenced etcd key carries the token
// of the grant live at that revision, so tokens never go down; and every
// write a worker saw committed is in etcd's history.
func (r *Report) fencedKeys(h *Histories, grants map[string][]tenure) {
	seen := map[string]bool{}
	top := map[string]FencedValue{}
	for _, e := range h.Etcd {
		rest, ok := strings.CutPrefix(e.Key, DataPrefix)
		if !ok || e.Type != "PUT" {
			continue
		}
		ns, lease, _ := strings.Cut(rest, "/")
		if strings.Contains(lease, "/") {
			continue // a keyed lock's data key (locks.go)
		}
		var v FencedValue
		if err := json.Unmarshal([]byte(e.Value), &v); err != nil {
			r.violate(&r.StaleAccepted, "fenced key %s at revision %d holds %q, not a worker's value", e.Key, e.Revision, e.Value)
			continue
		}
		seen[v.Writer+"/"+strconv.FormatInt(v.Seq, 10)] = true
		live := liveAt(grants[etcdkeys.LeaseKey(h.Prefix, ns, lease)], e.Revision)
		if v.Token != live {
			r.violate(&r.StaleAccepted, "fenced key %s: %s's write #%d under token %d committed at revision %d, when the live token was %d",
				e.Key, v.Writer, v.Seq, v.Token, e.Revision, live)
		}
		if v.Token < top[e.Key].Token {
			r.violate(&r.StaleAccepted, "fenced key %s: token %d committed at revision %d after token %d", e.Key, v.Token, e.Revision, top[e.Key].Token)
		} else {
			top[e.Key] = v
		}
	}
	for _, a := range h.Attempts {
		if a.Kind == KindEtcd && a.OK && !seen[a.Worker+"/"+strconv.FormatInt(a.Seq, 10)] {
			r.violate(&r.Missing, "%s's committed write #%d to %s is not in etcd's history", a.Worker, a.Seq, a.Target)
		}
	}
}

// leaseTokens: the token a Lease's status shows never goes down, in the
// order the apiserver stored the statuses. This holds across a wiped or
// regressed etcd too, where etcd's own history starts again.
func (r *Report) leaseTokens(h *Histories) {
	byName := map[string][]LeaseEvent{}
	for _, e := range h.Leases {
		byName[e.Name] = append(byName[e.Name], e)
	}
	for name, evs := range byName {
		slices.SortFunc(evs, func(a, b LeaseEvent) int { return cmpInt(a.ResourceVersion, b.ResourceVersion) })
		var top int64
		for _, e := range evs {
			if e.Token != 0 && e.Token < top {
				r.violate(&r.TokenRegressions, "Lease %s: status token %d at rv %d after token %d", name, e.Token, e.ResourceVersion, top)
			}
			top = max(top, e.Token)
		}
	}
}

// slots: a slot key is only created while free, and no pod holds two live
// slots of one IDRange.
func (r *Report) slots(h *Histories) {
	type rangeKey struct{ ns, name string }
	live := map[string]string{} // slot key -> pod UID
	for _, e := range h.Etcd {
		ns, name, _, ok := etcdkeys.ParseSlotKey(h.Prefix, e.Key)
		if !ok {
			continue
		}
		switch e.Type {
		case "PUT":
			var v etcdstore.SlotValue
			_ = json.Unmarshal([]byte(e.Value), &v)
			if owner, held := live[e.Key]; held || e.Version != 1 {
				r.violate(&r.DoubleGrants, "slot key %s written at revision %d for pod %s while held by %s", e.Key, e.Revision, v.Pod, owner)
			}
			for k, uid := range live {
				kns, kname, _, _ := etcdkeys.ParseSlotKey(h.Prefix, k)
				if (rangeKey{kns, kname}) == (rangeKey{ns, name}) && uid == v.PodUID && k != e.Key {
					r.violate(&r.DoubleGrants, "pod %s given slot %s at revision %d while it holds %s", v.Pod, e.Key, e.Revision, k)
				}
			}
			live[e.Key] = v.PodUID
		case "DELETE":
			delete(live, e.Key)
		}
	}
}

// blocks: a next-ID key only moves forward, so the blocks claimed from it
// are disjoint.
func (r *Report) blocks(h *Histories) {
	last := map[string]int64{}
	for _, e := range h.Etcd {
		if e.Type != "PUT" || !strings.HasPrefix(e.Key, h.Prefix+"/idranges/") || !strings.HasSuffix(e.Key, "/next") {
			continue
		}
		n, err := strconv.ParseInt(e.Value, 10, 64)
		if err != nil {
			r.violate(&r.DuplicateIDs, "next-ID key %s holds %q at revision %d", e.Key, e.Value, e.Revision)
			continue
		}
		if prev, ok := last[e.Key]; ok && n <= prev {
			r.violate(&r.DuplicateIDs, "next-ID key %s went from %d to %d at revision %d: blocks overlap", e.Key, prev, n, e.Revision)
		}
		last[e.Key] = n
	}
}

// ids: the runs of IDs workers issued are pairwise disjoint.
func (r *Report) ids(h *Histories) {
	var runs []Attempt
	for _, a := range h.Attempts {
		if a.Kind == KindIDs {
			runs = append(runs, a)
			r.IDs += a.Hi - a.Lo + 1
		}
	}
	slices.SortFunc(runs, func(a, b Attempt) int { return cmpInt(a.Lo, b.Lo) })
	for i := 1; i < len(runs); i++ {
		prev, cur := runs[i-1], runs[i]
		if cur.Lo <= prev.Hi {
			r.violate(&r.DuplicateIDs, "IDs [%d, %d] issued by %s overlap [%d, %d] issued by %s", cur.Lo, cur.Hi, cur.Worker, prev.Lo, prev.Hi, prev.Worker)
			if cur.Hi < prev.Hi {
				runs[i] = prev // keep comparing against the run reaching furthest
			}
		}
	}
}

// snowflakes: no snowflake ID is issued twice, by one generator or two
// (a generator started on a copied slot annotation would repeat its
// owner's IDs).
func (r *Report) snowflakes(h *Histories) {
	by := map[int64]string{}
	for _, a := range h.Attempts {
		if a.Kind != KindSnowflake {
			continue
		}
		r.IDs += int64(len(a.IDs))
		for _, id := range a.IDs {
			if first, dup := by[id]; dup {
				r.violate(&r.DuplicateIDs, "snowflake ID %d issued by %s and by %s", id, first, a.Worker)
				continue
			}
			by[id] = a.Worker
		}
	}
}

// ReportBound is how long after the Lease's status shows a tenure over
// that its pod may still report the token: the pod's annotation is
// removed right after the status write, and the longest fault of the run
// (8 s) may stand between them.
const ReportBound = 20 * time.Second

// reports: a pod reports holding a Lease under a token only while, or up
// to ReportBound after, the Lease's status names that pod and token.
func (r *Report) reports(h *Histories) {
	byName := map[string][]LeaseEvent{}
	for _, e := range h.Leases {
		byName[e.Name] = append(byName[e.Name], e)
	}
	for _, evs := range byName {
		slices.SortFunc(evs, func(a, b LeaseEvent) int { return cmpInt(a.ResourceVersion, b.ResourceVersion) })
	}
	// A token the status never gave the pod (a copied annotation) may be
	// reported only until ReportBound after the pod first reported it.
	firstUnheld := map[string]time.Time{}
	for _, a := range h.Attempts {
		if a.Kind != KindReport || a.Token == 0 {
			continue
		}
		r.Reports++
		end, held, ever := tenureEnd(byName[a.Lease], a.Worker, a.Token)
		if !ever {
			k := fmt.Sprintf("%s/%s/%d", a.Worker, a.Lease, a.Token)
			if first, ok := firstUnheld[k]; !ok || a.At.Before(first) {
				firstUnheld[k] = a.At
			}
			continue
		}
		if !held && a.At.After(end.Add(ReportBound)) {
			r.violate(&r.StaleReports, "%s reported holding lease %s under token %d at %s, %s after the status showed that tenure over",
				a.Worker, a.Lease, a.Token, a.At.Format(time.RFC3339Nano), a.At.Sub(end).Round(time.Millisecond))
		}
	}
	for _, a := range h.Attempts {
		if a.Kind != KindReport || a.Token == 0 {
			continue
		}
		first, ok := firstUnheld[fmt.Sprintf("%s/%s/%d", a.Worker, a.Lease, a.Token)]
		if ok && a.At.After(first.Add(ReportBound)) {
			r.violate(&r.StaleReports, "%s reported holding lease %s under token %d at %s, which the status never gave it, %s after first reporting it",
				a.Worker, a.Lease, a.Token, a.At.Format(time.RFC3339Nano), a.At.Sub(first).Round(time.Millisecond))
		}
	}
}

// tenureEnd is when the harness first saw a status that no longer names
// holder and token, after one that did. held is true while the newest
// status still names them; ever is false when no status ever did.
func tenureEnd(evs []LeaseEvent, holder string, token int64) (end time.Time, held, ever bool) {
	for _, e := range evs {
		if e.Token == token && e.Holder == holder {
			ever = true
		} else if ever {
			return e.At, false, true
		}
	}
	return time.Time{}, ever, ever
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
