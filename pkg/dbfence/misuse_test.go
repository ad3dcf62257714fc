package dbfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencer-io/fencer/pkg/dbfence"
)

// These tests are the careless caller: what the SDK's happy path never
// sends, each of which once ended in a silent success or a committable
// transaction that should not have been.

// Exec numbers the guard's parameters after the caller's: a statement
// that refers to one more than it was given must be refused, not bound
// to the guard's resource.
func TestExecRefusesAPlaceholderWithoutItsArgument(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	tx := begin(t, db)
	_, err := table.Exec(ctx, tx, res, 10, `INSERT INTO reports VALUES (1, $2, $1)`, int64(10))
	if err == nil || !strings.Contains(err.Error(), "refers to $2 but has 1 argument") {
		t.Fatalf("Exec with $2 and one argument: %v, want a refusal naming $2", err)
	}
	// The refusal aborted tx (TestRefusalsBeforeAnyStatementAbortTheTransaction).
	tx = begin(t, db)
	// A placeholder in a literal or a comment is not one.
	if _, err := table.Exec(ctx, tx, res, 10, `INSERT INTO reports VALUES (1, '$2' /* $3 */, $1)`, int64(10)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := body(t, db); got != "$2" {
		t.Fatalf("body %q, want the literal $2", got)
	}
}

// The scanner Exec checks with reads parameters as PostgreSQL does: a
// real server prepares each SELECT and says how many it takes.
func TestHighestPlaceholderAgreesWithPostgreSQL(t *testing.T) {
	db, _ := setup(t)
	ctx := context.Background()
	expected := regexp.MustCompile(`expected (\d+) arguments, got 0`)
	asked := 0
	for _, c := range dbfence.PlaceholderCases() {
		if !strings.HasPrefix(c.Query, "SELECT ") || c.Want == dbfence.MaxPlaceholder {
			continue
		}
		asked++
		stmt, err := db.PrepareContext(ctx, c.Query)
		if err != nil {
			t.Errorf("PostgreSQL refused %q: %v", c.Query, err)
			continue
		}
		n := 0
		if _, err := stmt.ExecContext(ctx); err != nil {
			m := expected.FindStringSubmatch(err.Error())
			if m == nil {
				t.Errorf("%q: %v", c.Query, err)
				_ = stmt.Close()
				continue
			}
			n, _ = strconv.Atoi(m[1])
		}
		_ = stmt.Close()
		if got := dbfence.HighestPlaceholder(c.Query); got != n {
			t.Errorf("%q: PostgreSQL takes %d parameters, the scanner reads %d", c.Query, n, got)
		}
	}
	if asked < 15 {
		t.Fatalf("asked PostgreSQL about %d statements only", asked)
	}
}

// An operation that fails because its request's deadline passed is the
// usual failure: its abort must still reach the database, even with the
// transaction begun under a longer context, so that committing anyway
// commits no record without a result.
func TestOnceAbortsAfterItsContextExpired(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	tx := begin(t, db)
	reqCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, _, err := table.Once(reqCtx, tx, res, "slow", 10, func() ([]byte, error) {
		<-reqCtx.Done()
		return nil, reqCtx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Once: %v, want the operation's deadline", err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("the transaction of an operation that ran out of time committed")
	}
	tx2 := begin(t, db)
	got, replayed, err := table.Once(ctx, tx2, res, "slow", 10, func() ([]byte, error) { return []byte("ran"), nil })
	if err != nil || replayed || string(got) != "ran" {
		t.Fatalf("the retry: %q replayed %v, %v; want it to run the operation", got, replayed, err)
	}
}

// Row.Update's refusal sticks through its fence table's abort function; a
// fence table it cannot name is refused before any statement.
func TestRowUpdateRefusesAFenceTableItCannotName(t *testing.T) {
	db, _ := setup(t)
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE tasks (id int PRIMARY KEY, result text, token bigint NOT NULL DEFAULT 0); INSERT INTO tasks (id, token) VALUES (42, 7)`); err != nil {
		t.Fatal(err)
	}
	tx := begin(t, db)
	row := dbfence.Row{Table: "public.tasks", KeyColumn: "id", TokenColumn: "token", Fence: dbfence.Table{Schema: "App"}}
	// Token 8, above the row's 7: an Update that went ahead would move it.
	if err := row.Update(ctx, tx, 42, 8, "result = $3", "x"); err == nil || !strings.Contains(err.Error(), "Row.Fence") {
		t.Fatalf("Update with a bad fence table: %v, want a refusal naming Row.Fence", err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT token FROM tasks WHERE id = 42`).Scan(&n); err != nil || n != 7 {
		t.Fatalf("the row after the refusal: token %d, %v", n, err)
	}
}

// Floor checks its resource as Guard does.
func TestFloorRefusesAResourceWithoutItsParts(t *testing.T) {
	db, table := setup(t)
	if _, _, err := table.Floor(context.Background(), db, dbfence.Resource{}); err == nil || !strings.Contains(err.Error(), "install") {
		t.Fatalf("Floor of the zero resource: %v, want a refusal", err)
	}
}

// begin starts a transaction, rolled back when t ends unless committed.
func begin(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// A call refused before it sends any statement (no token, a resource
// without its parts, a misused argument) aborts the transaction as a
// refusal by the database does: a caller that ignores the error, writes
// and commits anyway commits nothing. Before, these returned an error and
// left the transaction committable, so `tok, _ := src.Token(ctx)` in a pod
// that held nothing (token 0) wrote with no fence at all.
func TestRefusalsBeforeAnyStatementAbortTheTransaction(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE tasks (id int PRIMARY KEY, result text, token bigint NOT NULL DEFAULT 0); INSERT INTO tasks (id) VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	row := dbfence.Row{Table: "public.tasks", KeyColumn: "id", TokenColumn: "token"}
	// A request's context, done: database/sql refuses the statement before
	// the database sees it, so only the abort keeps tx from committing.
	done, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		call func(tx *sql.Tx) error
	}{
		{"Guard without a token", func(tx *sql.Tx) error { return table.Guard(ctx, tx, res, 0) }},
		{"Guard with its context done", func(tx *sql.Tx) error { return table.Guard(done, tx, res, 10) }},
		{"Exec with its context done", func(tx *sql.Tx) error {
			_, err := table.Exec(done, tx, res, 10, `UPDATE tasks SET result = 'x' WHERE id = $1`, 1)
			return err
		}},
		{"Exec with an argument the driver cannot encode", func(tx *sql.Tx) error {
			_, err := table.Exec(ctx, tx, res, 10, `UPDATE tasks SET result = $1 WHERE id = 1`, struct{ C chan int }{})
			return err
		}},
		{"Exec with pgx's QueryExecMode in front of its arguments", func(tx *sql.Tx) error {
			_, err := table.Exec(ctx, tx, res, 10, `UPDATE tasks SET result = 'x' WHERE id = $1`, pgx.QueryExecModeSimpleProtocol, 1)
			if err == nil || !strings.Contains(err.Error(), "no driver options") {
				t.Errorf("Exec with a QueryExecMode: %v, want a refusal naming driver options", err)
			}
			return err
		}},
		{"Exec with pgx.NamedArgs", func(tx *sql.Tx) error {
			_, err := table.Exec(ctx, tx, res, 10, `UPDATE tasks SET result = @result WHERE id = @id`, pgx.NamedArgs{"result": "x", "id": 1})
			if err == nil || !strings.Contains(err.Error(), "pgx.NamedArgs") {
				t.Errorf("Exec with pgx.NamedArgs: %v, want a refusal naming pgx.NamedArgs", err)
			}
			return err
		}},
		{"Once with its context done", func(tx *sql.Tx) error {
			_, _, err := table.Once(done, tx, res, "op", 10, func() ([]byte, error) { return nil, nil })
			return err
		}},
		{"Row.Update with its context done", func(tx *sql.Tx) error { return row.Update(done, tx, 1, 10, "result = $3", "x") }},
		{"Guard of the zero resource", func(tx *sql.Tx) error { return table.Guard(ctx, tx, dbfence.Resource{}, 10) }},
		{"GuardSeq with sequence 0", func(tx *sql.Tx) error { return table.GuardSeq(ctx, tx, res, 10, 0) }},
		{"Exec without a token", func(tx *sql.Tx) error {
			_, err := table.Exec(ctx, tx, res, 0, `UPDATE tasks SET result = 'x' WHERE id = 1`)
			return err
		}},
		{"Exec of a SELECT", func(tx *sql.Tx) error {
			_, err := table.Exec(ctx, tx, res, 10, `SELECT 1`)
			return err
		}},
		{"Exec with a resource that is not UTF-8, and no token", func(tx *sql.Tx) error {
			_, err := table.Exec(ctx, tx, dbfence.Lease("/fencer@x", "default", "r\xff"), 0, `UPDATE tasks SET result = 'x' WHERE id = 1`)
			if err != nil && strings.Contains(err.Error(), "could not be aborted") {
				t.Errorf("the abort reads as failed: %v", err)
			}
			return err
		}},
		{"Exec with a placeholder past its arguments", func(tx *sql.Tx) error {
			_, err := table.Exec(ctx, tx, res, 10, `UPDATE tasks SET result = $1 WHERE id = 1`)
			return err
		}},
		{"Once without a token", func(tx *sql.Tx) error {
			_, _, err := table.Once(ctx, tx, res, "op", 0, func() ([]byte, error) { return nil, nil })
			return err
		}},
		{"Once without an operation ID", func(tx *sql.Tx) error {
			_, _, err := table.Once(ctx, tx, res, "", 10, func() ([]byte, error) { return nil, nil })
			return err
		}},
		{"Row.Update without a token", func(tx *sql.Tx) error { return row.Update(ctx, tx, 1, 0, "result = $3", "x") }},
		{"Row.Update of a column that is no identifier", func(tx *sql.Tx) error {
			bad := row
			bad.TokenColumn = "Token"
			return bad.Update(ctx, tx, 1, 10, "result = $3", "x")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := begin(t, db)
			if err := tc.call(tx); err == nil {
				t.Fatal("no error")
			}
			// The careless caller: the error ignored, a write, a commit.
			_, werr := tx.ExecContext(ctx, `UPDATE tasks SET result = $1 WHERE id = 1`, tc.name)
			cerr := tx.Commit()
			if werr == nil && cerr == nil {
				t.Fatal("the transaction committed after the refusal")
			}
			var result sql.NullString
			if err := db.QueryRow(`SELECT result FROM tasks WHERE id = 1`).Scan(&result); err != nil || result.Valid {
				t.Fatalf("after the refusal the row holds %q (%v), want it unwritten", result.String, err)
			}
		})
	}
}

// ForgetOperations with an age under a second (zero, negative, or an
// untyped 24 read as nanoseconds) would forget every operation, those a
// client may still retry: refused, nothing deleted.
func TestForgetOperationsRefusesAnAgeOfZero(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	tx := begin(t, db)
	if _, _, err := table.Once(ctx, tx, res, "op", 10, func() ([]byte, error) { return []byte("done"), nil }); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, age := range []time.Duration{0, -time.Hour, 24} {
		if n, err := table.ForgetOperations(ctx, db, age); err == nil || !strings.Contains(err.Error(), "at least a second") {
			t.Fatalf("ForgetOperations(%s): %d, %v; want a refusal", age, n, err)
		}
	}
	if _, found, err := table.Lookup(ctx, db, res, "op"); err != nil || !found {
		t.Fatalf("the record after the refused ForgetOperations: found %v, %v", found, err)
	}
}

// Exec reads its statement's verb past any whitespace, a line break or a
// tab included, as PostgreSQL does: a statement written over several
// lines is guarded and run, not refused (which would abort its
// transaction).
func TestExecTakesAVerbFollowedByALineBreak(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	tx := begin(t, db)
	if _, err := table.Exec(ctx, tx, res, 10, "\n\tINSERT\n\tINTO reports VALUES (1, 'multi-line', $1)", int64(10)); err != nil {
		t.Fatalf("Exec of an INSERT over several lines: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := body(t, db); got != "multi-line" {
		t.Fatalf("body %q", got)
	}
}

// A statement that opens with a comment, as tools and ORMs write them
// (/* app=orders */, -- a note), is guarded and run: PostgreSQL reads past
// the comment, and so does Exec (it refused them before).
func TestExecTakesAStatementOpeningWithAComment(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	tx := begin(t, db)
	if _, err := table.Exec(ctx, tx, res, 10, "/* app=orders */ -- the nightly report\nINSERT INTO reports VALUES (1, 'commented', $1)", int64(10)); err != nil {
		t.Fatalf("Exec of an INSERT behind comments: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := body(t, db); got != "commented" {
		t.Fatalf("body %q", got)
	}
}

// pgx.NamedArgs in front of Exec's arguments rewrote the statement and
// dropped the guard's own arguments, so the guard's placeholders bound the
// caller's values: a stale holder's write committed after a newer
// holder's, under a fence row of another name. It is refused, and the
// newer holder's row stands, also when the NamedArgs come wrapped in
// sql.Named, which database/sql unwraps before pgx sees them (with one $1
// in the statement, the count of placeholders matched the one argument).
func TestExecRefusesNamedArgumentsOfAStaleHolder(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	if err := write(ctx, db, table, nil, 20, "twenty"); err != nil {
		t.Fatal(err)
	}
	named := pgx.NamedArgs{"body": "stale", "r": res.String(), "tok": int64(100), "seq": int64(0)}
	for _, c := range []struct {
		name  string
		query string
		arg   any
	}{
		{"bare", `UPDATE reports SET body = @body, token = @tok WHERE id = 1`, named},
		{"in sql.Named", `UPDATE reports SET body = @body WHERE id = 1 AND $1::text = @body AND @r::text <> '' AND @tok::bigint > 0 AND @seq::bigint = 0`,
			sql.Named("args", named)},
		{"in sql.Named twice", `UPDATE reports SET body = @body WHERE id = 1 AND $1::text = @body AND @r::text <> '' AND @tok::bigint > 0 AND @seq::bigint = 0`,
			sql.Named("outer", sql.Named("args", named))},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx := begin(t, db)
			_, err := table.Exec(ctx, tx, res, 10, c.query, c.arg)
			if err == nil || !strings.Contains(err.Error(), "rewrites the query") {
				t.Fatalf("Exec with pgx.NamedArgs: %v, want a refusal", err)
			}
			if err := tx.Commit(); err == nil {
				t.Fatal("the refused transaction committed")
			}
			if got := body(t, db); got != "twenty" {
				t.Fatalf("body %q, want the newer holder's", got)
			}
		})
	}
}

// A nil transaction is refused with an error, never a panic.
func TestANilTransactionIsRefused(t *testing.T) {
	var table dbfence.Table
	ctx := context.Background()
	row := dbfence.Row{Table: "public.tasks", KeyColumn: "id", TokenColumn: "token"}
	_, execErr := table.Exec(ctx, nil, res, 10, `UPDATE tasks SET result = 'x' WHERE id = $1`, 1)
	_, _, onceErr := table.Once(ctx, nil, res, "op", 10, func() ([]byte, error) { return nil, nil })
	for name, err := range map[string]error{
		"Guard":      table.Guard(ctx, nil, res, 10),
		"GuardSeq":   table.GuardSeq(ctx, nil, res, 10, 1),
		"Exec":       execErr,
		"Once":       onceErr,
		"Row.Update": row.Update(ctx, nil, 1, 10, "result = $3", "x"),
	} {
		if err == nil || !strings.Contains(err.Error(), "tx is nil") {
			t.Errorf("%s with a nil tx: %v, want a refusal naming it", name, err)
		}
	}
}

// A nil database, transaction or connection to read from is refused with
// an error naming the call, never a panic, whether the nil is typed or not.
func TestNilReadersAreRefused(t *testing.T) {
	var table dbfence.Table
	ctx := context.Background()
	var db *sql.DB // sql.Open failed, or was never called
	var tx *sql.Tx
	var conn *sql.Conn
	_, forgetErr := table.ForgetOperations(ctx, db, time.Hour)
	errs := map[string]error{"ForgetOperations": forgetErr}
	for name, q := range map[string]interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}{"a nil *sql.DB": db, "a nil *sql.Tx": tx, "a nil *sql.Conn": conn, "nil": nil} {
		_, _, errs["Floor of "+name] = table.Floor(ctx, q, res)
		_, _, errs["Lookup of "+name] = table.Lookup(ctx, q, res, "op")
	}
	for name, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "needs") {
			t.Errorf("%s: %v, want a refusal naming what is missing", name, err)
		}
	}
}

// Once with no operation to run is refused before it records one, and its
// transaction is aborted: a record without a result, committed by a
// caller that went on, would answer every retry with nothing, as if done.
func TestOnceRefusesANilOperation(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	tx := begin(t, db)
	if err := table.Guard(ctx, tx, res, 10); err != nil {
		t.Fatal(err)
	}
	_, _, err := table.Once(ctx, tx, res, "op", 10, nil)
	if err == nil || !strings.Contains(err.Error(), "do is nil") {
		t.Fatalf("Once with a nil do: %v, want a refusal naming it", err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("the refused transaction committed")
	}
	if _, found, err := table.Lookup(ctx, db, res, "op"); err != nil || found {
		t.Fatalf("the operation's record: found %v (%v), want none", found, err)
	}
}

// A -- comment at the end of Row.Update's assignments (the caller's note)
// ends with its line: the token's assignment and the fencing WHERE after
// it still apply.
func TestRowUpdateTakesACommentAfterItsAssignments(t *testing.T) {
	db, _ := setup(t)
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE tasks (id int PRIMARY KEY, result text, token bigint NOT NULL DEFAULT 0); INSERT INTO tasks VALUES (1, 'new', 20), (2, 'other', 30)`); err != nil {
		t.Fatal(err)
	}
	row := dbfence.Row{Table: "public.tasks", KeyColumn: "id", TokenColumn: "token"}
	for _, note := range []string{" -- the worker's verdict", " -- a note ending in a carriage return\r"} {
		tx := begin(t, db)
		var stale *dbfence.StaleError
		if err := row.Update(ctx, tx, 1, 10, "result = $3"+note, "stale"); !errors.As(err, &stale) || stale.Floor != 20 {
			t.Fatalf("Update under token 10 of a row at 20, set ending %q: %v, want a *StaleError at 20", note, err)
		}
		tx = begin(t, db)
		if err := row.Update(ctx, tx, 1, 20, "result = $3"+note, "verdict"); err != nil {
			t.Fatalf("Update under token 20, set ending %q: %v", note, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := db.Query(`SELECT id, result, token FROM tasks ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var id, token int64
		var result string
		if err := rows.Scan(&id, &result, &token); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %s %d", id, result, token))
	}
	if want := []string{"1 verdict 20", "2 other 30"}; !slices.Equal(got, want) {
		t.Fatalf("rows %q, want %q", got, want)
	}
}
