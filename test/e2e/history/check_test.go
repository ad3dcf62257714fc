package history

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const prefix = "/fencer"

// The waiter keys of keyed lock k0 in the clean history.
var (
	waiter0 = prefix + "/locks/ns/k0/a-1"
	waiter1 = prefix + "/locks/ns/k0/b-1"
)

// dbRes is the database guard's row of lease a.
const dbRes = "/fencer@1|lease|ns|a"

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func val(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// clean is a history where every guarantee holds: two grants of lease a,
// fenced writes under each, a stale write refused, slots and blocks.
func clean(t *testing.T) *Histories {
	lk := prefix + "/leases/ns/a"
	return &Histories{
		Prefix: prefix,
		Attempts: []Attempt{
			{Worker: "w0", Kind: KindConfigMap, Seq: 1, Token: 10, OK: true},
			{Worker: "w1", Kind: KindConfigMap, Seq: 1, Token: 20, OK: true},
			{Worker: "w0", Kind: KindConfigMap, Seq: 2, Token: 10, Reason: ReasonFenced},
			{Worker: "w0", Kind: KindEtcd, Seq: 3, Token: 10, OK: true},
			{Worker: "w1", Kind: KindEtcd, Seq: 2, Token: 20, OK: true},
			{Worker: "w0", Kind: KindIDs, Lo: 0, Hi: 99},
			{Worker: "w1", Kind: KindIDs, Lo: 100, Hi: 199},
			{Worker: "w0", Kind: KindHostile, Mode: "merge-no-token", Lease: "a", Target: "cm", Reason: ReasonFenced},
			{Worker: "w0", Kind: KindSnowflake, IDs: []int64{1 << 40, 1<<40 + 1}},
			{Worker: "w1", Kind: KindSnowflake, IDs: []int64{1<<40 + 2}},
			{Worker: "w0", Kind: KindReport, Lease: "a", Token: 10, At: t0.Add(time.Second)},
			// Reported 5 s after its tenure ended: within the bound.
			{Worker: "w0", Kind: KindReport, Lease: "a", Token: 10, At: t0.Add(7 * time.Second)},
			{Worker: "w1", Kind: KindReport, Lease: "a", Token: 20, At: t0.Add(time.Hour)},
			// Keyed lock k0: w0 holds it under 30, w1 queues under 31.
			{Worker: "w0", Kind: KindLock, Target: "k0", Token: 30, OK: true},
			{Worker: "w0", Kind: KindLockWrite, Lease: "k0", Seq: 4, Token: 30, OK: true},
			{Worker: "w1", Kind: KindLock, Target: "k0", Token: 31, OK: true},
			{Worker: "w1", Kind: KindLockWrite, Lease: "k0", Seq: 3, Token: 31, OK: true},
			{Worker: "w0", Kind: KindHostile, Mode: "stale-unlock", Lease: "k0", Token: 30, Reason: ReasonFenced},
			// The database guard: w0 commits under 10 twice, w1 under 20;
			// w0's later try under 10 is refused.
			{Worker: "w0", Kind: KindDBWrite, Lease: "a", Target: dbRes, Seq: 5, Token: 10, OK: true},
			{Worker: "w0", Kind: KindDBWrite, Lease: "a", Target: dbRes, Seq: 6, Token: 10, OK: true},
			{Worker: "w1", Kind: KindDBWrite, Lease: "a", Target: dbRes, Seq: 4, Token: 20, OK: true},
			{Worker: "w0", Kind: KindDBWrite, Lease: "a", Target: dbRes, Seq: 7, Token: 10, Reason: ReasonFenced},
		},
		DB: []DBCommit{
			{Resource: dbRes, Counter: 1, Token: 10, Writer: "w0", Seq: 5},
			{Resource: dbRes, Counter: 3, Token: 20, Writer: "w1", Seq: 4},
			{Resource: dbRes, Counter: 2, Token: 10, Writer: "w0", Seq: 6},
		},
		Objects: []ObjectEvent{
			{Name: "cm", ResourceVersion: 5, Type: "ADDED", Token: 10, Writer: "w0", Seq: 1, DataToken: 10},
			{Name: "cm", ResourceVersion: 9, Type: "MODIFIED", Token: 20, Writer: "w1", Seq: 1, DataToken: 20},
		},
		Leases: []LeaseEvent{{Name: "a", ResourceVersion: 1, Token: 10, Holder: "w0", At: t0}, {Name: "a", ResourceVersion: 2, Token: 20, Holder: "w1", At: t0.Add(2 * time.Second)}},
		Etcd: []EtcdEvent{
			{Revision: 10, Type: "PUT", Key: lk, CreateRevision: 10, Version: 1},
			{Revision: 11, Type: "PUT", Key: DataPrefix + "ns/a", Value: val(t, FencedValue{Token: 10, Writer: "w0", Seq: 3})},
			{Revision: 12, Type: "PUT", Key: prefix + "/idranges/ns/ids/next", Value: "100"},
			{Revision: 13, Type: "PUT", Key: prefix + "/idranges/ns/slots/slots/0", Version: 1, Value: `{"pod":"w0","podUID":"u0"}`},
			{Revision: 15, Type: "DELETE", Key: lk},
			{Revision: 16, Type: "PUT", Key: prefix + "/idranges/ns/ids/next", Value: "200"},
			{Revision: 17, Type: "DELETE", Key: prefix + "/idranges/ns/slots/slots/0"},
			{Revision: 18, Type: "PUT", Key: prefix + "/idranges/ns/slots/slots/0", Version: 1, Value: `{"pod":"w1","podUID":"u1"}`},
			{Revision: 20, Type: "PUT", Key: lk, CreateRevision: 20, Version: 1},
			{Revision: 21, Type: "PUT", Key: DataPrefix + "ns/a", Value: val(t, FencedValue{Token: 20, Writer: "w1", Seq: 2})},
			{Revision: 30, Type: "PUT", Key: waiter0, CreateRevision: 30, Version: 1},
			{Revision: 31, Type: "PUT", Key: waiter1, CreateRevision: 31, Version: 1},
			{Revision: 32, Type: "PUT", Key: DataPrefix + "ns/locks/k0", Value: val(t, FencedValue{Token: 30, Writer: "w0", Seq: 4})},
			{Revision: 33, Type: "DELETE", Key: waiter0},
			{Revision: 34, Type: "PUT", Key: waiter1, CreateRevision: 31, Version: 2}, // the SDK records when its turn came
			{Revision: 35, Type: "PUT", Key: DataPrefix + "ns/locks/k0", Value: val(t, FencedValue{Token: 31, Writer: "w1", Seq: 3})},
		},
		Faults: []Fault{{Kind: "pause-worker", Target: "w0", For: 3 * time.Second}},
	}
}

func TestCleanHistoryPasses(t *testing.T) {
	r := Check(clean(t))
	if !r.OK() {
		t.Fatalf("violations in a clean history: %v", r.Violations)
	}
	want := "faults: 1 injected, writes accepted 11 refused 2, stale accepted 0, double grants 0, token regressions 0, duplicate ids 0, stale reports 0, locks: stale writes 0, two holders 0, token regressions 0, database: commits 3 out of order 0, hostile writes 2 accepted 0"
	if got := r.Summary(); got != want {
		t.Fatalf("summary\n got %s\nwant %s", got, want)
	}
	if r.IDs != 203 {
		t.Fatalf("IDs %d, want 203", r.IDs)
	}
}

// Each case breaks one guarantee; the checker must count it where it belongs.
func TestEachViolationIsCaught(t *testing.T) {
	lk := prefix + "/leases/ns/a"
	cases := []struct {
		name    string
		break_  func(h *Histories)
		counter func(r *Report) int
	}{
		{"stale object write accepted", func(h *Histories) {
			h.Objects = append(h.Objects, ObjectEvent{Name: "cm", ResourceVersion: 12, Type: "MODIFIED", Token: 10, Writer: "w0", Seq: 2})
		}, func(r *Report) int { return r.StaleAccepted }},
		{"etcd write under a token not live", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 22, Type: "PUT", Key: DataPrefix + "ns/a", Value: val(t, FencedValue{Token: 10, Writer: "w0", Seq: 9})})
		}, func(r *Report) int { return r.StaleAccepted }},
		{"lease key overwritten while held", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 23, Type: "PUT", Key: lk, CreateRevision: 20, Version: 2})
		}, func(r *Report) int { return r.DoubleGrants }},
		{"slot given twice", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 24, Type: "PUT", Key: prefix + "/idranges/ns/slots/slots/0", Version: 1, Value: `{"pod":"w2","podUID":"u2"}`})
		}, func(r *Report) int { return r.DoubleGrants }},
		{"pod given two slots", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 24, Type: "PUT", Key: prefix + "/idranges/ns/slots/slots/1", Version: 1, Value: `{"pod":"w1","podUID":"u1"}`})
		}, func(r *Report) int { return r.DoubleGrants }},
		{"status token went down", func(h *Histories) {
			h.Leases = append(h.Leases, LeaseEvent{Name: "a", ResourceVersion: 3, Token: 15})
		}, func(r *Report) int { return r.TokenRegressions }},
		{"IDs issued twice", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w2", Kind: KindIDs, Lo: 150, Hi: 150})
		}, func(r *Report) int { return r.DuplicateIDs }},
		{"snowflake ID issued twice (a generator on a copied slot)", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w2", Kind: KindSnowflake, IDs: []int64{1<<40 + 1}})
		}, func(r *Report) int { return r.DuplicateIDs }},
		{"a pod reports a token it no longer holds", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w0", Kind: KindReport, Lease: "a", Token: 10, At: t0.Add(2*time.Second + ReportBound + time.Millisecond)})
		}, func(r *Report) int { return r.StaleReports }},
		{"a pod keeps reporting a copied token the status never gave it", func(h *Histories) {
			h.Attempts = append(h.Attempts,
				Attempt{Worker: "w2", Kind: KindReport, Lease: "a", Token: 20, At: t0.Add(3 * time.Second)},
				Attempt{Worker: "w2", Kind: KindReport, Lease: "a", Token: 20, At: t0.Add(4*time.Second + ReportBound)})
		}, func(r *Report) int { return r.StaleReports }},
		{"next-ID key went back", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 25, Type: "PUT", Key: prefix + "/idranges/ns/ids/next", Value: "150"})
		}, func(r *Report) int { return r.DuplicateIDs }},
		{"refusal without a reason", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w0", Kind: KindEtcd, Seq: 7, Reason: "", Message: "EOF"})
		}, func(r *Report) int { return r.Unexplained }},
		{"hostile write accepted", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w1", Kind: KindHostile, Mode: "delete", Lease: "a", Target: "cm", OK: true})
		}, func(r *Report) int { return r.HostileAccepted }},
		{"a write under a keyed lock's token after the next holder's grant", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 36, Type: "PUT", Key: DataPrefix + "ns/locks/k0", Value: val(t, FencedValue{Token: 30, Writer: "w0", Seq: 9})})
		}, func(r *Report) int { return r.LockStaleWrites }},
		{"a queued waiter's write while another holds the lock: two holders", func(h *Histories) {
			h.Etcd = append(h.Etcd,
				EtcdEvent{Revision: 36, Type: "PUT", Key: prefix + "/locks/ns/k0/c-1", CreateRevision: 36, Version: 1},
				EtcdEvent{Revision: 37, Type: "PUT", Key: DataPrefix + "ns/locks/k0", Value: val(t, FencedValue{Token: 36, Writer: "w2", Seq: 1})})
		}, func(r *Report) int { return r.LockDoubleHolders }},
		{"a keyed lock's holder token went down", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 36, Type: "PUT", Key: prefix + "/locks/ns/k0/d-1", CreateRevision: 25, Version: 1})
		}, func(r *Report) int { return r.LockTokenRegressions }},
		{"a stale unlock deleted something", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w0", Kind: KindHostile, Mode: "stale-unlock", Lease: "k0", Token: 30, OK: true})
		}, func(r *Report) int { return r.HostileAccepted }},
		{"a keyed lock's write missing from the history", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w1", Kind: KindLockWrite, Seq: 99, Token: 31, OK: true})
		}, func(r *Report) int { return r.Missing }},
		{"a database commit under an older token after a newer one", func(h *Histories) {
			h.DB = append(h.DB, DBCommit{Resource: dbRes, Counter: 4, Token: 10, Writer: "w0", Seq: 8})
		}, func(r *Report) int { return r.DBStaleCommits }},
		{"two database commits that held the guard row at once", func(h *Histories) {
			h.DB = append(h.DB, DBCommit{Resource: dbRes, Counter: 3, Token: 20, Writer: "w2", Seq: 1})
		}, func(r *Report) int { return r.DBStaleCommits }},
		{"a database refusal as stale with no higher token committed", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w1", Kind: KindDBWrite, Target: dbRes, Seq: 10, Token: 20, Reason: ReasonFenced})
		}, func(r *Report) int { return r.Unexplained }},
		{"a committed database transaction missing from the audit", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w1", Kind: KindDBWrite, Target: dbRes, Seq: 9, Token: 20, OK: true})
		}, func(r *Report) int { return r.Missing }},
		{"accepted write missing from the history", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w1", Kind: KindConfigMap, Seq: 5, Token: 20, OK: true})
		}, func(r *Report) int { return r.Missing }},
		{"a committed etcd write missing from etcd's history", func(h *Histories) {
			h.Attempts = append(h.Attempts, Attempt{Worker: "w1", Kind: KindEtcd, Seq: 9, Token: 20, OK: true})
		}, func(r *Report) int { return r.Missing }},
		{"a grant whose token is not above the last one (etcd went back)", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 38, Type: "DELETE", Key: lk},
				EtcdEvent{Revision: 40, Type: "PUT", Key: lk, CreateRevision: 15, Version: 1})
		}, func(r *Report) int { return r.TokenRegressions }},
		{"a grant put on a free key that was not created afresh", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 38, Type: "DELETE", Key: lk},
				EtcdEvent{Revision: 40, Type: "PUT", Key: lk, CreateRevision: 39, Version: 2})
		}, func(r *Report) int { return r.DoubleGrants }},
		// Tokens do not go down in these two: only the live-token check
		// can see them.
		{"an etcd write while no grant is live", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 16, Type: "PUT", Key: DataPrefix + "ns/a", Value: val(t, FencedValue{Token: 10, Writer: "w0", Seq: 8})})
		}, func(r *Report) int { return r.StaleAccepted }},
		{"an etcd write under a forged token above the live one", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 22, Type: "PUT", Key: DataPrefix + "ns/a", Value: val(t, FencedValue{Token: 25, Writer: "w2", Seq: 1})})
		}, func(r *Report) int { return r.StaleAccepted }},
		{"a write under a keyed lock's token when no one holds it", func(h *Histories) {
			h.Etcd = append(h.Etcd, EtcdEvent{Revision: 36, Type: "DELETE", Key: waiter1},
				EtcdEvent{Revision: 37, Type: "PUT", Key: DataPrefix + "ns/locks/k0", Value: val(t, FencedValue{Token: 31, Writer: "w1", Seq: 8})})
		}, func(r *Report) int { return r.LockStaleWrites }},
		// What the apiserver applied, whatever the hostile client saw (it
		// may have timed out, paused).
		{"a hostile writer's version applied", func(h *Histories) {
			h.Objects = append(h.Objects, ObjectEvent{Name: "cm", ResourceVersion: 12, Type: "MODIFIED", Token: 20, Writer: "hostile-w0", Seq: 1})
		}, func(r *Report) int { return r.HostileAccepted }},
		{"a hostile annotate applied", func(h *Histories) {
			h.Objects = append(h.Objects, ObjectEvent{Name: "cm", ResourceVersion: 12, Type: "MODIFIED", Token: 20, Writer: "w1", Seq: 1, DataToken: 20, Hostile: "w0"})
		}, func(r *Report) int { return r.HostileAccepted }},
		{"a hostile label removal applied", func(h *Histories) {
			h.Objects = append(h.Objects, ObjectEvent{Name: "cm", ResourceVersion: 12, Type: "MODIFIED", Token: 20, Writer: "w1", Seq: 1, DataToken: 20, Unlabelled: true})
		}, func(r *Report) int { return r.HostileAccepted }},
		{"a hostile delete applied", func(h *Histories) {
			h.Objects = append(h.Objects, ObjectEvent{Name: "cm", ResourceVersion: 12, Type: "DELETED", Token: 20, Writer: "w1", Seq: 1, DataToken: 20})
		}, func(r *Report) int { return r.HostileAccepted }},
		{"the webhook recorded another token than the write sent", func(h *Histories) {
			h.Objects = append(h.Objects, ObjectEvent{Name: "cm", ResourceVersion: 12, Type: "MODIFIED", Token: 20, Writer: "w0", Seq: 3, DataToken: 10})
		}, func(r *Report) int { return r.StaleAccepted }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := clean(t)
			c.break_(h)
			r := Check(h)
			if c.counter(r) == 0 || r.OK() {
				t.Fatalf("not caught: %s; report %+v", c.name, r)
			}
			t.Logf("caught: %s", strings.Join(r.Violations, "; "))
		})
	}
}

func TestLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	h := clean(t)
	write := func(name string, vs ...any) {
		w, err := Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		for _, v := range vs {
			if err := w.Add(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	var as, os, ls, es, fs, ds []any
	for _, a := range h.Attempts {
		as = append(as, a)
	}
	for _, o := range h.Objects {
		os = append(os, o)
	}
	for _, l := range h.Leases {
		ls = append(ls, l)
	}
	for _, e := range h.Etcd {
		es = append(es, e)
	}
	for _, f := range h.Faults {
		fs = append(fs, f)
	}
	for _, d := range h.DB {
		ds = append(ds, d)
	}
	write("db.jsonl", ds...)
	write("workers/w.jsonl", as...)
	write("objects.jsonl", os...)
	write("leases.jsonl", ls...)
	write("etcd.jsonl", es...)
	write("faults.jsonl", fs...)
	loaded, err := Load(dir, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Check(loaded).Summary(), Check(h).Summary(); got != want {
		t.Fatalf("after a round trip through files:\n got %s\nwant %s", got, want)
	}
}
