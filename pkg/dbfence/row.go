package dbfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Row is the per-row form of the fence, for a table that keeps a token
// column of its own: a row is written only under a token at or above the
// one it holds. Table, KeyColumn and TokenColumn are plain lower-case
// identifiers; name Table with its schema (schema.table), since a pooler
// may hand the connection over with another search_path. KeyColumn must
// be unique, and TokenColumn a bigint NOT NULL (a new row's 0).
type Row struct {
	Table, KeyColumn, TokenColumn string
	// Fence is the fence table whose abort function ends a refused
	// transaction (the zero Table: fencer.fences).
	Fence Table
}

// ErrNoRow: Update found no row with that key.
var ErrNoRow = errors.New("dbfence: no row has that key")

// check refuses what Update cannot run: no token, or a name that is not
// a plain identifier.
func (r Row) check(token int64) error {
	if token <= 0 {
		return fmt.Errorf("%s token %d: %w", r.Table, token, ErrNoToken)
	}
	for i, n := range []string{r.KeyColumn, r.TokenColumn} {
		if !identifier.MatchString(n) {
			return fmt.Errorf("dbfence: column %d %q is not a plain lower-case identifier", i, n)
		}
	}
	if !qualifiedName.MatchString(r.Table) {
		return fmt.Errorf("dbfence: table %q is not a plain lower-case (schema.)table name", r.Table)
	}
	// The fence table's abort is what makes a refusal stick: a name it
	// cannot use would leave a refused transaction committable.
	if _, err := r.Fence.qualified(); err != nil {
		return fmt.Errorf("dbfence: Row.Fence: %w", err)
	}
	return nil
}

// Update runs UPDATE <Table> SET <set>, <TokenColumn> = token WHERE
// <KeyColumn> = key AND <TokenColumn> <= token, in tx. set is the
// caller's assignments, with placeholders from $3 on for args ($1 is the
// token, $2 the key). A row whose token is above token is not written, and
// the refusal is a *StaleError naming the row's token, as the guard's, and
// tx is aborted: nothing of it can commit.
func (r Row) Update(ctx context.Context, tx *sql.Tx, key any, token int64, set string, args ...any) error {
	if err := r.check(token); err != nil {
		return r.Fence.refusedBefore(ctx, tx, err)
	}
	if tx == nil {
		return errNoTx
	}
	// set ends its line: a -- comment at its end (a note of the caller's)
	// must not swallow the token's assignment and the WHERE that fences it.
	stmt := fmt.Sprintf("UPDATE %s SET %s\n, %s = $1::bigint WHERE %s = $2 AND %s <= $1::bigint", r.Table, set, r.TokenColumn, r.KeyColumn, r.TokenColumn)
	res, err := tx.ExecContext(ctx, stmt, append([]any{token, key}, args...)...)
	if err != nil {
		return r.Fence.failed(ctx, tx, err, Resource{}, token, 0)
	}
	if n, err := res.RowsAffected(); err != nil || n > 0 {
		return err
	}
	var held sql.NullInt64
	err = tx.QueryRowContext(ctx, fmt.Sprintf(`SELECT %s FROM %s WHERE %s = $1`, r.TokenColumn, r.Table, r.KeyColumn), key).Scan(&held)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: %s %v", ErrNoRow, r.Table, key)
	case err != nil:
		return r.Fence.failed(ctx, tx, err, Resource{}, token, 0)
	case !held.Valid:
		return r.Fence.aborted(ctx, tx, "a fenced row's token is NULL",
			fmt.Errorf("dbfence: %s %v: the token column %s is NULL; make it bigint NOT NULL DEFAULT 0", r.Table, key, r.TokenColumn))
	}
	return r.Fence.aborted(ctx, tx, fmt.Sprintf("token %d refused for %s", token, r.Table),
		&StaleError{Resource: fmt.Sprintf("%s %v", r.Table, key), Offered: token, Floor: held.Int64})
}
