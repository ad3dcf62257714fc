package dbfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// Resource names what a token fences: the lock whose tokens it takes and
// the install that issued them. Tokens are etcd revisions of one install's
// etcd: two locks' tokens, or two installs', are unrelated numbers and are
// never compared, so each gets rows of its own.
type Resource struct {
	// Install is the issuing install: its etcd prefix and cluster ID
	// (InstallOf), e.g. "/fencer@a1b2c3d4e5f6". An etcd replaced by an
	// empty one has another cluster ID, so its tokens start over under
	// other rows.
	Install string
	// Kind is "lease" for a fencer Lease, "lock" for a keyed lock.
	Kind string
	// Namespace and Name name the Lease, or the keyed lock's key.
	Namespace, Name string
}

// Lease is the resource fenced by a fencer Lease's tokens.
func Lease(install, namespace, name string) Resource {
	return Resource{Install: install, Kind: "lease", Namespace: namespace, Name: name}
}

// Lock is the resource fenced by a keyed lock's tokens.
func Lock(install, namespace, key string) Resource {
	return Resource{Install: install, Kind: "lock", Namespace: namespace, Name: key}
}

// String is the resource's row key.
func (r Resource) String() string {
	return r.Install + "|" + r.Kind + "|" + r.Namespace + "|" + r.Name
}

func (r Resource) validate() error {
	switch {
	case r.Install == "":
		return errors.New("dbfence: the resource names no install (InstallOf gives the etcd prefix and cluster ID)")
	case r.Kind != "lease" && r.Kind != "lock":
		return fmt.Errorf("dbfence: resource kind %q: want lease or lock", r.Kind)
	case r.Namespace == "" || r.Name == "":
		return errors.New("dbfence: the resource needs the namespace and the Lease's name or the lock's key")
	case strings.Contains(r.Install, "|") || strings.Contains(r.Namespace, "|"):
		return fmt.Errorf("dbfence: %q or %q has a |, which separates the resource's parts", r.Install, r.Namespace)
	}
	return nil
}

// StaleError refuses a transaction whose token (and sequence) is below the
// highest accepted for its resource. The transaction is aborted: nothing
// of it can commit.
type StaleError struct {
	Resource   string
	Offered    int64
	OfferedSeq int64
	// Floor and FloorSeq are the highest accepted when it was refused.
	Floor, FloorSeq int64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("dbfence: token %d (seq %d) is fenced off for %s: the database accepted token %d (seq %d)",
		e.Offered, e.OfferedSeq, e.Resource, e.Floor, e.FloorSeq)
}

// ErrSerialization is a serialization failure (SQLSTATE 40001) under
// REPEATABLE READ or SERIALIZABLE, or a deadlock (40P01): another
// transaction changed the resource's row since this one's snapshot, or the
// two waited for each other. Its cause may be a writer with an equal
// token, so it is not a refusal: roll back and retry the whole transaction
// with the token current then. IsRetryable finds the same failures where
// the guard did not see them: at COMMIT, or in the caller's statements.
var ErrSerialization = errors.New("dbfence: serialization failure or deadlock (SQLSTATE 40001, 40P01); retry the transaction")

// IsRetryable reports whether err, from any statement of a guarded
// transaction or its COMMIT, is a serialization failure or a deadlock
// (SQLSTATE 40001, 40P01), after which the whole transaction may be
// retried.
func IsRetryable(err error) bool {
	if errors.Is(err, ErrSerialization) {
		return true
	}
	var pg sqlStater
	if !errors.As(err, &pg) {
		return false
	}
	return pg.SQLState() == "40001" || pg.SQLState() == "40P01"
}

// ErrNoToken refuses a token ≤ 0 before any statement.
var ErrNoToken = errors.New("dbfence: a fencing token must be positive")

// Guard refuses tx, with a *StaleError, when token is below the highest
// token already accepted for res; otherwise it records token as the
// highest. The compare and the record are one statement, atomic with the
// rest of tx: a concurrent guard of the same resource waits for the row
// lock, and under READ COMMITTED then sees the newer token. Equal tokens
// pass: a holder writes many times per tenure. Call it first in the
// transaction, before the writes it fences: they commit together or not at
// all, and a guard first takes the resource's row lock before any row of
// yours, so two holders cannot deadlock on the rows between them. A
// holder paused inside its transaction after its guard holds that lock:
// bound your transactions (lock_timeout, idle_in_transaction_session_timeout).
// Never roll back to a savepoint taken before a guard: rolling back a
// refused guard undoes its abort, and rolling back one that passed
// releases its row lock, so a newer holder's transaction commits while
// yours still can. A guard inside a savepoint is safe only after the same
// guard outside it.
func (t Table) Guard(ctx context.Context, tx *sql.Tx, res Resource, token int64) error {
	return t.guard(ctx, tx, res, token, 0, false)
}

// GuardSeq is Guard with a sequence number within the tenure: (token, seq)
// must be strictly above the highest accepted, so a delayed earlier write
// of the same tenure (a lower seq) is refused, and so is a replay of the
// same (token, seq). seq starts at 1; Floor reads where a restarted writer
// resumes.
func (t Table) GuardSeq(ctx context.Context, tx *sql.Tx, res Resource, token, seq int64) error {
	if seq < 1 {
		return t.refusedBefore(ctx, tx, fmt.Errorf("dbfence: sequence %d: sequences start at 1", seq))
	}
	return t.guard(ctx, tx, res, token, seq, true)
}

func (t Table) guard(ctx context.Context, tx *sql.Tx, res Resource, token, seq int64, strict bool) error {
	stmt, err := t.guardStatement(res, token, 1, strict)
	if err != nil {
		return t.refusedBefore(ctx, tx, err)
	}
	if tx == nil {
		return errNoTx
	}
	_, err = tx.ExecContext(ctx, stmt, res.String(), token, seq)
	return t.failed(ctx, tx, err, res, token, seq)
}

// errNoTx refuses a nil transaction: there is nothing to guard, and
// nothing to abort.
var errNoTx = errors.New("dbfence: tx is nil: the guard runs inside your transaction (db.BeginTx), with the writes it fences")

// guardStatement is the guard: one upsert of the resource's row, with the
// resource, token and sequence as parameters $n, $n+1 and $n+2. Its SET
// evaluates the compare on the row as it is once locked, the newest
// committed version under READ COMMITTED; a failed compare calls the
// refuse function, whose exception aborts the transaction.
func (t Table) guardStatement(res Resource, token int64, n int, strict bool) (string, error) {
	if token <= 0 {
		return "", fmt.Errorf("%s token %d: %w", res, token, ErrNoToken)
	}
	if err := res.validate(); err != nil {
		return "", err
	}
	q, err := t.qualified()
	if err != nil {
		return "", err
	}
	r, tok, sq := fmt.Sprintf("$%d", n), fmt.Sprintf("$%d::bigint", n+1), fmt.Sprintf("$%d::bigint", n+2)
	// Without a sequence an equal token passes and keeps the tenure's
	// sequence; with one, (token, seq) must grow.
	set, cond := "seq = CASE WHEN f.token = EXCLUDED.token THEN f.seq ELSE 0 END", "f.token <= EXCLUDED.token"
	if strict {
		set, cond = "seq = EXCLUDED.seq", "(f.token, f.seq) < (EXCLUDED.token, EXCLUDED.seq)"
	}
	return `INSERT INTO ` + q + ` AS f (resource, token, seq, commits) VALUES (` + r + `, ` + tok + `, ` + sq + `, 1)
	ON CONFLICT (resource) DO UPDATE SET token = CASE WHEN ` + cond + ` THEN EXCLUDED.token ELSE ` + q + `_refuse(` + r + `, ` + tok + `, ` + sq + `) END,
	` + set + `, commits = f.commits + 1, updated = now()`, nil
}

// Exec runs query, one INSERT, UPDATE or DELETE of yours with its args,
// and the guard of res under token, in one statement: one round trip
// instead of two, which is most of the guard's cost (docs/performance.md).
// It refuses as Guard does, with a *StaleError, and the transaction is
// aborted. Two differences from Guard first:
//
//   - The guard runs after your statement's rows are written, within the
//     statement: take your transactions' locks in one order, or a deadlock
//     (reported by IsRetryable) may abort one of them.
//   - Your statement reads with the snapshot taken before the guard waited
//     for a concurrent holder: a conditional write (a subquery, NOT EXISTS,
//     INSERT … SELECT) may not see that holder's rows. For those, call
//     Guard first; the statements after it read afresh.
//
// query may open with comments, but must not begin with WITH, and its table must have no DO INSTEAD
// rule (a rule that rewrites the statement away drops the guard with it):
// use Guard, then your statement. args bind one to one to query's $1 …
// $n: no driver options or query rewriters (pgx.NamedArgs), which would
// shift or replace the guard's own arguments (placeholdersMatch).
func (t Table) Exec(ctx context.Context, tx *sql.Tx, res Resource, token int64, query string, args ...any) (sql.Result, error) {
	verb := leadingVerb(query)
	switch strings.ToUpper(verb) {
	case "INSERT", "UPDATE", "DELETE":
	default:
		return nil, t.refusedBefore(ctx, tx, fmt.Errorf("dbfence: Exec takes one INSERT, UPDATE or DELETE, not %q: guard with Guard, then run it", verb))
	}
	guard, err := t.guardStatement(res, token, len(args)+1, false)
	if err != nil {
		return nil, t.refusedBefore(ctx, tx, err)
	}
	if err := placeholdersMatch(query, args); err != nil {
		return nil, t.refusedBefore(ctx, tx, err)
	}
	if tx == nil {
		return nil, errNoTx
	}
	// A copy: appending to args could write into the caller's array.
	all := append(args[:len(args):len(args)], res.String(), token, int64(0))
	r, err := tx.ExecContext(ctx, `WITH fencer_guard AS (`+guard+`) `+query, all...)
	return r, t.failed(ctx, tx, err, res, token, 0)
}

// placeholdersMatch refuses arguments that would not bind one to one to
// query's $1 … $n. The guard's parameters are numbered after the caller's,
// so a mismatch could bind the guard's resource or token to a placeholder
// of the caller's, or the caller's values to the guard's:
//
//   - a $n past the arguments would bind the guard's resource or token
//     instead of failing;
//   - an argument with no $n of its own is a driver option, which pgx reads
//     from the front of the arguments (a QueryExecMode, QueryResultFormats):
//     it shifts every argument after it, the guard's included;
//   - a query rewriter (pgx.NamedArgs, StrictNamedArgs, anything with
//     pgx's RewriteQuery method) replaces the arguments with its own, so
//     the guard's placeholders bind the caller's values and the guard
//     fences the wrong resource with a token it was never given.
//
// PostgreSQL refuses a parameter no placeholder refers to anyway, so a
// statement this refuses is one no driver would have run as written.
func placeholdersMatch(query string, args []any) error {
	for i, a := range args {
		// database/sql hands the driver what an sql.NamedArg wraps (pgx
		// ignores the name), so a rewriter inside one rewrites as well.
		for {
			named, ok := a.(sql.NamedArg)
			if !ok {
				break
			}
			a = named.Value
		}
		if a == nil {
			continue
		}
		if _, ok := reflect.TypeOf(a).MethodByName("RewriteQuery"); ok {
			return fmt.Errorf("dbfence: Exec: argument %d (%T) rewrites the query, as pgx.NamedArgs does: Exec numbers the guard's parameters after yours, so write $1 … $n and pass their values in order, or guard with Guard, then run your statement", i+1, a)
		}
	}
	switch n := highestPlaceholder(query); {
	case n > len(args):
		return fmt.Errorf("dbfence: Exec: the statement refers to $%d but has %d argument(s): pass one argument per placeholder", n, len(args))
	case n < len(args):
		return fmt.Errorf("dbfence: Exec: the statement refers to $%d at most but has %d arguments: pass one argument per placeholder, and no driver options (a pgx QueryExecMode or QueryResultFormats), which would shift the guard's arguments", n, len(args))
	}
	return nil
}

// failed is classify, and more for an error the database did not raise: a
// done context, an argument the driver could not encode, a lost
// connection. The database may never have seen the statement, so tx is
// still open and would commit the writes made before it, which no guard
// fenced: it is aborted, as a refusal is. (An error the database raised
// has aborted tx already.)
func (t Table) failed(ctx context.Context, tx *sql.Tx, err error, res Resource, token, seq int64) error {
	var pg sqlStater
	if err == nil || errors.As(err, &pg) {
		return classify(err, res, token, seq)
	}
	return t.aborted(ctx, tx, "a statement failed before the database answered it: "+err.Error(), err)
}

// sqlStater is what PostgreSQL drivers' errors tell: pgx's *pgconn.PgError
// and lib/pq's *pq.Error both have it.
type sqlStater interface{ SQLState() string }

// classify turns the database's refusal into a *StaleError and a
// serialization failure into ErrSerialization.
func classify(err error, res Resource, token, seq int64) error {
	var pg sqlStater
	if err == nil || !errors.As(err, &pg) {
		return err
	}
	switch pg.SQLState() {
	case SQLStateStale:
		e := &StaleError{Resource: res.String(), Offered: token, OfferedSeq: seq}
		if m := floorInMessage.FindStringSubmatch(err.Error()); m != nil {
			e.Floor, _ = strconv.ParseInt(m[1], 10, 64)
			e.FloorSeq, _ = strconv.ParseInt(m[2], 10, 64)
		}
		return e
	case "40001", "40P01":
		return fmt.Errorf("%w: %w", ErrSerialization, err)
	case SQLStateAborted:
		return err
	}
	return err
}

// floorInMessage reads the floor from the refusal's message (the
// Migration's refuse function), whatever the driver.
var floorInMessage = regexp.MustCompile(`is below token (\d+) \(seq (\d+)\)`)

// needQuerier refuses a nil database, transaction or connection to read
// from, typed or not, with an error naming the call, instead of a panic.
func needQuerier(call string, q any) error {
	const want = "a database, transaction or connection to read from (a *sql.DB, *sql.Tx or *sql.Conn)"
	switch v := reflect.ValueOf(q); {
	case !v.IsValid():
		return fmt.Errorf("dbfence: %s needs %s, got nil", call, want)
	case v.Kind() == reflect.Pointer && v.IsNil():
		return fmt.Errorf("dbfence: %s needs %s, got a nil %T", call, want, q)
	}
	return nil
}

// Floor reads the highest (token, seq) accepted for res, (0, 0) if none:
// where a writer restarted within its tenure resumes its sequence.
func (t Table) Floor(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, res Resource) (token, seq int64, err error) {
	if err := needQuerier("Floor", q); err != nil {
		return 0, 0, err
	}
	if err := res.validate(); err != nil {
		return 0, 0, err
	}
	table, err := t.qualified()
	if err != nil {
		return 0, 0, err
	}
	err = q.QueryRowContext(ctx, `SELECT token, seq FROM `+table+` WHERE resource = $1`, res.String()).Scan(&token, &seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, nil
	}
	return token, seq, err
}
