package history

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// KindDBWrite is a transaction through the database guard (pkg/dbfence)
// under a Lease's token or a keyed lock's (Lease: the Lease's name or the
// lock's key; Target: the fenced resource's row key).
const KindDBWrite = "db-write"

// ReasonDBUnavailable: the worker lost its database connection (killed by
// the nemesis, or ended by idle_in_transaction_session_timeout while the
// worker was paused), so its transaction rolled back.
const ReasonDBUnavailable = "db-unavailable"

// DBCommit is one row of the workers' audit table: a transaction that
// committed through the guard. Counter is the guard row's commit counter,
// read under the row's lock inside the same transaction, so the commits
// of one resource are numbered in the order they took that lock, which is
// the order in which they committed.
type DBCommit struct {
	Resource string `json:"resource"`
	Counter  int64  `json:"counter"`
	Token    int64  `json:"token"`
	Writer   string `json:"writer"`
	Seq      int64  `json:"seq"`
}

// above reports whether a commit in cs is under a token above t: what a
// refusal of t as stale needs.
func above(cs []DBCommit, t int64) bool {
	for _, c := range cs {
		if c.Token > t {
			return true
		}
	}
	return false
}

// database checks the audit table: per resource, in commit order, no
// commit under token t follows one under t' > t (DBStaleCommits), and no
// two commits share a counter, which would mean two held the row at once;
// every transaction a worker saw commit is in the audit (Missing); and
// every refusal as stale follows a commit under a higher token there.
func (r *Report) database(h *Histories) {
	byRes := map[string][]DBCommit{}
	seen := map[string]bool{}
	for _, c := range h.DB {
		byRes[c.Resource] = append(byRes[c.Resource], c)
		seen[c.Writer+"/"+strconv.FormatInt(c.Seq, 10)] = true
	}
	r.DBCommits = len(h.DB)
	for res, cs := range byRes {
		slices.SortFunc(cs, func(a, b DBCommit) int { return cmp.Compare(a.Counter, b.Counter) })
		for i := 1; i < len(cs); i++ {
			prev, c := cs[i-1], cs[i]
			switch {
			case c.Counter == prev.Counter:
				r.violate(&r.DBStaleCommits, "%s: commits #%d of %s (token %d) and of %s (token %d) share the guard row's counter", res, c.Counter, prev.Writer, prev.Token, c.Writer, c.Token)
			case c.Token < prev.Token:
				r.violate(&r.DBStaleCommits, "%s: commit #%d under token %d (%s's write #%d) followed commit #%d under token %d", res, c.Counter, c.Token, c.Writer, c.Seq, prev.Counter, prev.Token)
			}
		}
	}
	r.DBRefusedBy = map[string]int{}
	for _, a := range h.Attempts {
		switch {
		case a.Kind != KindDBWrite:
		case !a.OK:
			r.DBRefusedBy[a.Reason]++
			if a.Reason == ReasonFenced && !above(byRes[a.Target], a.Token) {
				r.violate(&r.Unexplained, "%s's transaction #%d on %s under token %d was refused as stale, but no higher token committed there", a.Worker, a.Seq, a.Target, a.Token)
			}
		case !seen[a.Worker+"/"+strconv.FormatInt(a.Seq, 10)]:
			r.violate(&r.Missing, "%s's committed transaction #%d on %s is not in the audit table", a.Worker, a.Seq, a.Target)
		}
	}
	r.DBCommitsByKind = map[string]int{}
	for _, c := range h.DB {
		if parts := strings.Split(c.Resource, "|"); len(parts) == 4 {
			r.DBCommitsByKind[parts[1]]++
		}
	}
}
