package dbfence_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/test/support/postgres"
)

var res = dbfence.Lease("/fencer@test", "default", "report")

// setup starts PostgreSQL, applies the migration and a data table.
func setup(t *testing.T) (*sql.DB, dbfence.Table) {
	t.Helper()
	db := postgres.Start(t).Open(t)
	var table dbfence.Table
	m, err := table.Migration()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // applying it again changes nothing
		if _, err := db.Exec(m); err != nil {
			t.Fatalf("migration: %v", err)
		}
	}
	if _, err := db.Exec(`CREATE TABLE reports (id int PRIMARY KEY, body text, token bigint)`); err != nil {
		t.Fatal(err)
	}
	return db, table
}

// write runs one fenced transaction: the guard, then the write.
func write(ctx context.Context, db *sql.DB, table dbfence.Table, opts *sql.TxOptions, token int64, body string) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := table.Guard(ctx, tx, res, token); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO reports VALUES (1, $1, $2) ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, token = EXCLUDED.token`, body, token); err != nil {
		return err
	}
	return tx.Commit()
}

func body(t *testing.T, db *sql.DB) string {
	t.Helper()
	var b string
	if err := db.QueryRow(`SELECT body FROM reports WHERE id = 1`).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGuardRefusesAStaleTokenAndAbortsTheTransaction(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	if err := write(ctx, db, table, nil, 10, "ten"); err != nil {
		t.Fatal(err)
	}
	if err := write(ctx, db, table, nil, 10, "ten again"); err != nil {
		t.Fatalf("an equal token: %v", err)
	}
	// A stale writer that ignores the refusal still commits nothing.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE reports SET body = 'stale' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	err = table.Guard(ctx, tx, res, 9)
	var stale *dbfence.StaleError
	if !errors.As(err, &stale) || stale.Floor != 10 || stale.Offered != 9 {
		t.Fatalf("token 9 after 10: %v, want a StaleError naming floor 10", err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("the refused transaction committed")
	}
	if got := body(t, db); got != "ten again" {
		t.Fatalf("body %q: the refused transaction's write is visible", got)
	}
	if err := write(ctx, db, table, nil, 0, "zero"); !errors.Is(err, dbfence.ErrNoToken) {
		t.Fatalf("token 0: %v", err)
	}
	// A | in the install or namespace would blur two resources.
	tx, _ = db.BeginTx(ctx, nil)
	if err := table.Guard(ctx, tx, dbfence.Lock("/fencer@test", "a|b", "c"), 1); err == nil {
		t.Fatal("a namespace with a | passed")
	}
	_ = tx.Rollback()
	// Tokens of another lock, or another install, are never compared.
	tx, _ = db.BeginTx(ctx, nil)
	if err := table.Guard(ctx, tx, dbfence.Lock("/fencer@test", "default", "report"), 1); err != nil {
		t.Fatalf("another lock's token 1: %v", err)
	}
	_ = tx.Rollback()
}

// The paused writer: A pauses inside its transaction before its guard;
// B takes a newer token and commits; A resumes and is refused, and nothing
// of its transaction commits. Paused after its guard, A holds the
// resource's row lock: B waits for it, so A's commit comes first and B's
// newer one after, never the other way round.
func TestThePausedWriter(t *testing.T) {
	ctx := context.Background()
	t.Run("before the guard", func(t *testing.T) {
		db, table := setup(t)
		if err := write(ctx, db, table, nil, 10, "ten"); err != nil {
			t.Fatal(err)
		}
		a, _ := db.BeginTx(ctx, nil)
		defer func() { _ = a.Rollback() }()
		if _, err := a.ExecContext(ctx, `UPDATE reports SET body = 'A, stale' WHERE id = 1`); err != nil {
			t.Fatal(err)
		}
		// A pauses; B blocks on A's row lock of reports, not of the guard:
		// B's write goes to another row.
		b, _ := db.BeginTx(ctx, nil)
		if err := table.Guard(ctx, b, res, 20); err != nil {
			t.Fatal(err)
		}
		if _, err := b.ExecContext(ctx, `INSERT INTO reports VALUES (2, 'B', 20)`); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		err := table.Guard(ctx, a, res, 10)
		var stale *dbfence.StaleError
		if !errors.As(err, &stale) || stale.Floor != 20 {
			t.Fatalf("A resumed: %v, want refused below 20", err)
		}
		if err := a.Commit(); err == nil {
			t.Fatal("A committed")
		}
		if got := body(t, db); got != "ten" {
			t.Fatalf("body %q after A was refused", got)
		}
	})
	t.Run("after the guard", func(t *testing.T) {
		db, table := setup(t)
		a, _ := db.BeginTx(ctx, nil)
		defer func() { _ = a.Rollback() }()
		if err := table.Guard(ctx, a, res, 10); err != nil {
			t.Fatal(err)
		}
		bDone := make(chan error, 1)
		go func() { bDone <- write(ctx, db, table, nil, 20, "B") }()
		select {
		case err := <-bDone:
			t.Fatalf("B committed while A held the resource's row: %v", err)
		case <-time.After(500 * time.Millisecond):
		}
		if _, err := a.ExecContext(ctx, `INSERT INTO reports VALUES (1, 'A', 10)`); err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(); err != nil {
			t.Fatalf("A, whose guard came first: %v", err)
		}
		if err := <-bDone; err != nil {
			t.Fatalf("B after A: %v", err)
		}
		if got := body(t, db); got != "B" {
			t.Fatalf("body %q: B's newer write must be last", got)
		}
	})
}

// Many concurrent guards on one resource: in commit order, tokens never go
// down. Each transaction records its token and the guard row's commit
// counter, read under the row lock, which orders the commits.
func TestConcurrentGuardsCommitInTokenOrder(t *testing.T) {
	for _, form := range []string{"Guard", "Exec"} {
		t.Run(form, func(t *testing.T) { concurrentGuards(t, form) })
	}
}

// concurrentGuards: 16 writers, each guarding (form Guard) or writing
// through Exec, then appending the guard row's commit counter to an audit.
func concurrentGuards(t *testing.T, form string) {
	db, table := setup(t)
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE audit (n bigint PRIMARY KEY, token bigint)`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 30 {
				token := int64(1 + (i*16+w*7)%97)
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Error(err)
					return
				}
				var err2 error
				if form == "Guard" {
					err2 = table.Guard(ctx, tx, res, token)
				} else {
					_, err2 = table.Exec(ctx, tx, res, token, `UPDATE reports SET token = $1 WHERE id = 1`, token)
				}
				if err := err2; err != nil {
					_ = tx.Rollback()
					var stale *dbfence.StaleError
					if !errors.As(err, &stale) || stale.Floor <= token {
						t.Errorf("token %d: %v", token, err)
					}
					continue
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO audit SELECT commits, $2 FROM fencer.fences WHERE resource = $1`, res.String(), token); err != nil {
					t.Error(err)
				}
				if err := tx.Commit(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	rows, err := db.Query(`SELECT n, token FROM audit ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var last, n int64
	count := 0
	for rows.Next() {
		var token int64
		if err := rows.Scan(&n, &token); err != nil {
			t.Fatal(err)
		}
		if token < last {
			t.Fatalf("commit %d under token %d after token %d", n, token, last)
		}
		last = token
		count++
	}
	if count < 2 {
		t.Fatalf("only %d commits", count)
	}
}

// Under REPEATABLE READ and SERIALIZABLE a concurrent guard is a
// serialization failure, never a success and never a StaleError.
func TestIsolationLevels(t *testing.T) {
	ctx := context.Background()
	for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		t.Run(level.String(), func(t *testing.T) {
			db, table := setup(t)
			if err := write(ctx, db, table, nil, 10, "ten"); err != nil {
				t.Fatal(err)
			}
			for _, token := range []int64{15, 30} { // below and above B's
				a, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := a.ExecContext(ctx, `SELECT 1 FROM reports`); err != nil { // take the snapshot
					t.Fatal(err)
				}
				if err := write(ctx, db, table, nil, 20+token, "B"); err != nil {
					t.Fatal(err)
				}
				err = table.Guard(ctx, a, res, token)
				if !errors.Is(err, dbfence.ErrSerialization) || !dbfence.IsRetryable(err) {
					t.Fatalf("token %d after a concurrent guard: %v, want ErrSerialization", token, err)
				}
				_ = a.Rollback()
			}
			// Alone, the level guards as READ COMMITTED does.
			if err := write(ctx, db, table, &sql.TxOptions{Isolation: level}, 100, "alone"); err != nil {
				t.Fatal(err)
			}
			if err := write(ctx, db, table, &sql.TxOptions{Isolation: level}, 99, "stale"); err == nil {
				t.Fatal("a stale token passed")
			}
		})
	}
}

// (token, seq) must grow within a tenure: a delayed earlier write and a
// replay are refused; a writer restarted in the same tenure resumes from
// the stored sequence.
func TestSequenceNumbers(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	guard := func(token, seq int64) error {
		tx, _ := db.BeginTx(ctx, nil)
		defer func() { _ = tx.Rollback() }()
		if err := table.GuardSeq(ctx, tx, res, token, seq); err != nil {
			return err
		}
		return tx.Commit()
	}
	for _, c := range []struct {
		token, seq int64
		ok         bool
	}{{10, 1, true}, {10, 3, true}, {10, 2, false}, {10, 3, false}, {9, 9, false}, {11, 1, true}} {
		if err := guard(c.token, c.seq); (err == nil) != c.ok {
			t.Fatalf("(%d, %d): %v, want ok=%v", c.token, c.seq, err, c.ok)
		}
	}
	token, seq, err := table.Floor(ctx, db, res)
	if err != nil || token != 11 || seq != 1 {
		t.Fatalf("floor (%d, %d) %v, want (11, 1): the restarted writer resumes at seq 2", token, seq, err)
	}
	if err := guard(11, 0); err == nil {
		t.Fatal("sequence 0 passed")
	}
}

func TestBadTableNames(t *testing.T) {
	for _, tb := range []dbfence.Table{{Schema: "Fencer"}, {Name: "fences; DROP TABLE x"}, {Name: "1x"}, {Name: strings.Repeat("x", 57)}} {
		if _, err := tb.Migration(); err == nil {
			t.Errorf("%+v passed", tb)
		}
	}
}

// Exec runs the guard and one statement of the caller's in one round
// trip, with the guard's refusal and abort.
func TestExecGuardsTheStatement(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	exec := func(token int64, body string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		_, err = table.Exec(ctx, tx, res, token, `INSERT INTO reports VALUES (1, $1, $2) ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, token = EXCLUDED.token`, body, token)
		if err != nil {
			return err
		}
		return tx.Commit()
	}
	if err := exec(10, "ten"); err != nil {
		t.Fatal(err)
	}
	if err := write(ctx, db, table, nil, 20, "twenty"); err != nil {
		t.Fatal(err)
	}
	err := exec(10, "ten again")
	var stale *dbfence.StaleError
	if !errors.As(err, &stale) || stale.Offered != 10 || stale.Floor != 20 {
		t.Fatalf("Exec under token 10 after 20: %v, want a StaleError with floor 20", err)
	}
	if got := body(t, db); got != "twenty" {
		t.Fatalf("body %q after a refused Exec, want twenty", got)
	}
	if err := exec(20, "twenty again"); err != nil {
		t.Fatalf("an equal token: %v", err)
	}
	// Ignoring the refusal commits nothing: the statement's exception
	// aborted the transaction.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = table.Exec(ctx, tx, res, 5, `UPDATE reports SET body = 'five' WHERE id = 1`)
	if err := tx.Commit(); err == nil {
		t.Fatal("a transaction whose Exec was refused committed")
	}
	if got := body(t, db); got != "twenty again" {
		t.Fatalf("body %q, want twenty again", got)
	}
	for _, q := range []string{"SELECT 1", "WITH x AS (SELECT 1) UPDATE reports SET body = 'x'", "/* a comment */ WITH x AS (SELECT 1) UPDATE reports SET body = 'x'", "-- only a comment", ""} {
		tx, _ := db.BeginTx(ctx, nil)
		if _, err := table.Exec(ctx, tx, res, 30, q); err == nil || !strings.Contains(err.Error(), "INSERT, UPDATE or DELETE") {
			t.Errorf("Exec(%q): %v, want a refusal naming what it takes", q, err)
		}
		_ = tx.Rollback()
	}
}
