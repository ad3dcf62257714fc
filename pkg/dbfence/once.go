package dbfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// MaxResult bounds the result Once stores per operation.
const MaxResult = 64 << 10

// ErrResultTooLarge refuses to store a result over MaxResult: keep a
// reference (a row's key) in it instead.
var ErrResultTooLarge = errors.New("dbfence: an operation's result is over 64 KiB")

// Once runs do at most once per operation ID of res, inside tx. The first
// transaction records opID with do's result and commits them with its
// writes. A repeat (a client retry) gets the stored result, replayed, and
// do is not called. A retry that arrives while the first is still in
// flight waits for it (the record's unique key): if the first commits, the
// retry gets its result; if it rolls back, the retry runs do itself.
//
// An ID's scope is its resource: the same ID on two resources is two
// operations. A retry under a newer token still gets the stored result:
// the operation happened, under the token of its time. Under REPEATABLE
// READ or SERIALIZABLE, a retry that waited for the first gets
// ErrSerialization instead; retry the transaction. Records are kept until
// ForgetOperations removes them.
//
// Guard the transaction too, first: Once deduplicates, the guard fences.
// When do fails, or its result is over MaxResult, the transaction is
// aborted. do must not act outside the transaction: a retry that runs it
// again (after the first rolled back) would act twice.
func (t Table) Once(ctx context.Context, tx *sql.Tx, res Resource, opID string, token int64, do func() ([]byte, error)) (result []byte, replayed bool, err error) {
	q, err := t.onceChecks(res, opID, token)
	if err == nil && do == nil {
		// Refused before the record is inserted: a record without a
		// result, committed by a caller that recovered a panic, would
		// answer every retry with nothing.
		err = fmt.Errorf("dbfence: Once of operation %q: do is nil: pass the function that makes the operation's writes and returns its result", opID)
	}
	if err != nil {
		return nil, false, t.refusedBefore(ctx, tx, err)
	}
	if tx == nil {
		return nil, false, errNoTx
	}
	var mine int
	err = tx.QueryRowContext(ctx, `INSERT INTO `+q+`_ops (resource, op_id, token) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING 1`,
		res.String(), opID, token).Scan(&mine)
	switch {
	case errors.Is(err, sql.ErrNoRows): // recorded by a transaction that committed
		err = tx.QueryRowContext(ctx, `SELECT result FROM `+q+`_ops WHERE resource = $1 AND op_id = $2`, res.String(), opID).Scan(&result)
		return result, true, t.failed(ctx, tx, err, res, token, 0)
	case err != nil:
		return nil, false, t.failed(ctx, tx, err, res, token, 0)
	}
	if result, err = do(); err != nil {
		// The record is in tx: committed without a result, it would answer
		// every retry with nothing, as if done. Abort tx.
		return nil, false, t.aborted(ctx, tx, "operation "+opID+" failed; its transaction is aborted", err)
	}
	if len(result) > MaxResult {
		return nil, false, t.aborted(ctx, tx, "operation "+opID+"'s result is over 64 KiB; its transaction is aborted",
			fmt.Errorf("%w (%d bytes)", ErrResultTooLarge, len(result)))
	}
	if _, err := tx.ExecContext(ctx, `UPDATE `+q+`_ops SET result = $3 WHERE resource = $1 AND op_id = $2`, res.String(), opID, result); err != nil {
		// Not stored (a deadline, most likely): the record without its
		// result must not commit either.
		return nil, false, t.aborted(ctx, tx, "operation "+opID+"'s result was not stored; its transaction is aborted", err)
	}
	return result, false, nil
}

// onceChecks refuses what Once cannot run: an operation ID out of bounds,
// no token, a resource without its parts or a table it cannot name. It
// returns the table's qualified name.
func (t Table) onceChecks(res Resource, opID string, token int64) (string, error) {
	if opID == "" || len(opID) > 256 {
		return "", fmt.Errorf("dbfence: operation ID %q: want 1 to 256 bytes", opID)
	}
	if token <= 0 {
		return "", fmt.Errorf("%s token %d: %w", res, token, ErrNoToken)
	}
	if err := res.validate(); err != nil {
		return "", err
	}
	return t.qualified()
}

// Lookup reads the stored result of operation opID of res, if a
// transaction that ran it through Once committed: a handler answers a
// retry with it before redoing any work outside the database (checks,
// uploads). It reads what is committed, so it misses an operation still
// in flight; Once, in the transaction, still decides, and waits for it.
func (t Table) Lookup(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, res Resource, opID string) (result []byte, found bool, err error) {
	if err := needQuerier("Lookup", q); err != nil {
		return nil, false, err
	}
	if opID == "" || len(opID) > 256 {
		return nil, false, fmt.Errorf("dbfence: operation ID %q: want 1 to 256 bytes", opID)
	}
	if err := res.validate(); err != nil {
		return nil, false, err
	}
	table, err := t.qualified()
	if err != nil {
		return nil, false, err
	}
	err = q.QueryRowContext(ctx, `SELECT result FROM `+table+`_ops WHERE resource = $1 AND op_id = $2`, res.String(), opID).Scan(&result)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	return result, err == nil, err
}

// ForgetOperations deletes the idempotency records older than age. A
// retry after that runs its operation again: keep records longer than
// any client retries. An age under a second is refused (an untyped 24 is
// 24ns): it would delete every record, those of operations a client may
// still be retrying.
func (t Table) ForgetOperations(ctx context.Context, db *sql.DB, age time.Duration) (int64, error) {
	if age < time.Second {
		return 0, fmt.Errorf("dbfence: ForgetOperations age %s: want at least a second, longer than any client retries (a shorter age forgets operations a client may still retry, and a retry would run it again; an untyped 24 is 24ns)", age)
	}
	if db == nil {
		return 0, errors.New("dbfence: ForgetOperations needs the database (a *sql.DB): it deletes the records in a statement of its own")
	}
	q, err := t.qualified()
	if err != nil {
		return 0, err
	}
	r, err := db.ExecContext(ctx, `DELETE FROM `+q+`_ops WHERE created < now() - make_interval(secs => $1)`, age.Seconds())
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// sqlStateInFailedTransaction answers a statement in a transaction that
// an earlier error already aborted.
const sqlStateInFailedTransaction = "25P02"

// abortTimeout bounds the statement that aborts a transaction: it runs
// after the caller's context is done, so it needs a bound of its own.
const abortTimeout = 10 * time.Second

// abort makes tx fail, so that nothing of it can commit: its exception
// aborts the transaction. It runs even when ctx is done, which is the
// usual reason an operation failed: a request's deadline must not leave
// its transaction committable. It returns nil once the database has
// aborted tx (or tx has already ended), and otherwise says to roll back.
func (t Table) abort(ctx context.Context, tx *sql.Tx, reason string) error {
	q, err := t.qualified()
	if err != nil {
		return fmt.Errorf("%w: it could not be aborted, so roll it back: never commit it", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	var n int64
	// The reason may quote a caller's input: as valid UTF-8, or PostgreSQL
	// refuses the statement (22021) and the abort reads as failed.
	err = tx.QueryRowContext(ctx, `SELECT `+q+`_abort($1)`, strings.ToValidUTF8(reason, "\uFFFD")).Scan(&n)
	var pg sqlStater
	switch {
	case errors.As(err, &pg) && (pg.SQLState() == SQLStateAborted || pg.SQLState() == sqlStateInFailedTransaction), errors.Is(err, sql.ErrTxDone):
		return nil // aborted now, or already: nothing of tx can commit
	case err == nil:
		err = errors.New("the abort function returned instead of raising; apply the Migration again")
	}
	return fmt.Errorf("dbfence: the transaction could not be aborted (%s), so roll it back: never commit it: %w", reason, err)
}

// refusedBefore aborts tx for a call refused before it sent anything (no
// token, a resource without its parts, a misused argument), as a refusal
// by the database aborts it: a caller that ignores the error and commits
// anyway must commit nothing, above all not writes that no guard fenced.
func (t Table) refusedBefore(ctx context.Context, tx *sql.Tx, cause error) error {
	if tx == nil { // no transaction, nothing to commit
		return cause
	}
	return t.aborted(ctx, tx, "dbfence refused the transaction: "+cause.Error(), cause)
}

// aborted aborts tx and returns why: cause, and the abort's own failure
// if it failed.
func (t Table) aborted(ctx context.Context, tx *sql.Tx, reason string, cause error) error {
	if err := t.abort(ctx, tx, reason); err != nil {
		return errors.Join(cause, err)
	}
	return cause
}
