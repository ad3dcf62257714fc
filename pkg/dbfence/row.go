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
// identifiers (schema.table allowed for Table).
type Row struct {
	Table, KeyColumn, TokenColumn string
}

// ErrNoRow: Update found no row with that key.
var ErrNoRow = errors.New("dbfence: no row has that key")

// Update runs UPDATE <Table> SET <set>, <TokenColumn> = token WHERE
// <KeyColumn> = key AND <TokenColumn> <= token, in tx. set is the
// caller's assignments, with placeholders from $3 on for args ($1 is the
// token, $2 the key). A row whose token is above token is not written, and
// the refusal is a *StaleError naming the row's token, as the guard's; the
// rest of tx is the caller's to roll back.
func (r Row) Update(ctx context.Context, tx *sql.Tx, key any, token int64, set string, args ...any) error {
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
	stmt := fmt.Sprintf(`UPDATE %s SET %s, %s = $1 WHERE %s = $2 AND %s <= $1`, r.Table, set, r.TokenColumn, r.KeyColumn, r.TokenColumn)
	res, err := tx.ExecContext(ctx, stmt, append([]any{token, key}, args...)...)
	if err != nil {
		return classify(err, Resource{}, token, 0)
	}
	if n, err := res.RowsAffected(); err != nil || n > 0 {
		return err
	}
	var held int64
	err = tx.QueryRowContext(ctx, fmt.Sprintf(`SELECT %s FROM %s WHERE %s = $1`, r.TokenColumn, r.Table, r.KeyColumn), key).Scan(&held)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %s %v", ErrNoRow, r.Table, key)
	}
	if err != nil {
		return err
	}
	return &StaleError{Resource: fmt.Sprintf("%s %v", r.Table, key), Offered: token, Floor: held}
}
