package dbfence_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencer-io/fencer/pkg/dbfence"
)

// An operation runs once: a repeat gets the stored result; a retry while
// the first is in flight waits for it and gets its result; after the first
// rolls back, the retry runs the operation itself.
func TestOnceAnswersARetryFromTheRecord(t *testing.T) {
	db, table := setup(t)
	ctx := context.Background()
	var runs atomic.Int32
	op := func(result string) func() ([]byte, error) {
		return func() ([]byte, error) {
			runs.Add(1)
			return []byte(result), nil
		}
	}
	once := func(opID, result string) (string, bool, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return "", false, err
		}
		defer func() { _ = tx.Rollback() }()
		got, replayed, err := table.Once(ctx, tx, res, opID, 10, op(result))
		if err != nil {
			return "", false, err
		}
		return string(got), replayed, tx.Commit()
	}
	if got, replayed, err := once("op-1", "first"); err != nil || replayed || got != "first" {
		t.Fatalf("first: %q %v %v", got, replayed, err)
	}
	if got, replayed, err := once("op-1", "second"); err != nil || !replayed || got != "first" || runs.Load() != 1 {
		t.Fatalf("repeat: %q replayed %v, %v; runs %d", got, replayed, err, runs.Load())
	}
	// Lookup answers outside a transaction: the committed record, and
	// nothing for an operation never run, or run on another resource.
	if got, found, err := table.Lookup(ctx, db, res, "op-1"); err != nil || !found || string(got) != "first" {
		t.Fatalf("Lookup(op-1): %q %v %v", got, found, err)
	}
	other := dbfence.Lease("/fencer@test", "default", "other")
	for _, c := range []struct {
		res dbfence.Resource
		op  string
	}{{res, "op-never"}, {other, "op-1"}} {
		if got, found, err := table.Lookup(ctx, db, c.res, c.op); err != nil || found || got != nil {
			t.Fatalf("Lookup(%s, %s): %q %v %v, want not found", c.res, c.op, got, found, err)
		}
	}

	// In flight: the first holds its record uncommitted.
	for _, commit := range []bool{true, false} {
		opID := "op-commit"
		if !commit {
			opID = "op-rollback"
		}
		first, _ := db.BeginTx(ctx, nil)
		if _, _, err := table.Once(ctx, first, res, opID, 10, op("in flight")); err != nil {
			t.Fatal(err)
		}
		if _, found, err := table.Lookup(ctx, db, res, opID); err != nil || found {
			t.Fatalf("Lookup found %s while its transaction is in flight (%v)", opID, err)
		}
		type answer struct {
			got      string
			replayed bool
			err      error
		}
		retry := make(chan answer, 1)
		go func() {
			got, replayed, err := once(opID, "retry")
			retry <- answer{got, replayed, err}
		}()
		select {
		case a := <-retry:
			t.Fatalf("the retry did not wait for the first: %+v", a)
		case <-time.After(300 * time.Millisecond):
		}
		if commit {
			if err := first.Commit(); err != nil {
				t.Fatal(err)
			}
		} else {
			_ = first.Rollback()
		}
		a := <-retry
		want := answer{"in flight", true, nil}
		if !commit {
			want = answer{"retry", false, nil}
		}
		if a != want {
			t.Fatalf("retry after the first %s: %+v, want %+v", map[bool]string{true: "committed", false: "rolled back"}[commit], a, want)
		}
	}

	// A failed operation aborts its transaction: committed anyway, it
	// leaves no record that would answer a retry with nothing.
	tx, _ := db.BeginTx(ctx, nil)
	if _, _, err := table.Once(ctx, tx, res, "fails", 10, func() ([]byte, error) { return nil, errors.New("boom") }); err == nil {
		t.Fatal("a failed operation succeeded")
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("the transaction of a failed operation committed")
	}
	if got, replayed, err := once("fails", "ran"); err != nil || replayed || got != "ran" {
		t.Fatalf("the retry of a failed operation: %q replayed %v, %v", got, replayed, err)
	}

	tx, _ = db.BeginTx(ctx, nil)
	if _, _, err := table.Once(ctx, tx, res, "big", 10, func() ([]byte, error) { return make([]byte, dbfence.MaxResult+1), nil }); !errors.Is(err, dbfence.ErrResultTooLarge) {
		t.Fatalf("a result over the bound: %v", err)
	}
	_ = tx.Rollback()
	// Made an hour old, as records are when forgotten.
	if _, err := db.Exec(`UPDATE fencer.fences_ops SET created = created - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if n, err := table.ForgetOperations(ctx, db, time.Minute); err != nil || n != 4 {
		t.Fatalf("forget: %d %v, want the 4 records", n, err)
	}
}

// The per-row form: a row written only under a token at or above its own.
func TestRowUpdate(t *testing.T) {
	db, _ := setup(t)
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE tasks (id int PRIMARY KEY, result text, token bigint NOT NULL DEFAULT 0); INSERT INTO tasks (id) VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	row := dbfence.Row{Table: "public.tasks", KeyColumn: "id", TokenColumn: "token"}
	update := func(token int64, result string) error {
		tx, _ := db.BeginTx(ctx, nil)
		defer func() { _ = tx.Rollback() }()
		if err := row.Update(ctx, tx, 42, token, "result = $3", result); err != nil {
			return err
		}
		return tx.Commit()
	}
	for _, c := range []struct {
		token int64
		ok    bool
	}{{5, true}, {5, true}, {7, true}, {6, false}} {
		if err := update(c.token, "by "+string(rune('0'+c.token))); (err == nil) != c.ok {
			t.Fatalf("token %d: %v", c.token, err)
		}
	}
	var stale *dbfence.StaleError
	if err := update(6, "x"); !errors.As(err, &stale) || stale.Floor != 7 {
		t.Fatalf("token 6 under 7: %v", err)
	}
	// Refused, the transaction is aborted: its other writes never commit.
	tx0, _ := db.BeginTx(ctx, nil)
	if _, err := tx0.ExecContext(ctx, `INSERT INTO tasks (id) VALUES (99)`); err != nil {
		t.Fatal(err)
	}
	if err := row.Update(ctx, tx0, 42, 6, "result = $3", "x"); !errors.As(err, &stale) {
		t.Fatal(err)
	}
	if err := tx0.Commit(); err == nil {
		t.Fatal("a refused transaction committed")
	}
	tx, _ := db.BeginTx(ctx, nil)
	if err := row.Update(ctx, tx, 43, 9, "result = $3", "x"); !errors.Is(err, dbfence.ErrNoRow) {
		t.Fatalf("a missing row: %v", err)
	}
	_ = tx.Rollback()
	if err := (dbfence.Row{Table: "tasks; drop", KeyColumn: "id", TokenColumn: "token"}).Update(ctx, nil, 1, 1, "x = 1"); err == nil || !strings.Contains(err.Error(), "not a plain") {
		t.Fatalf("a bad table name: %v", err)
	}
}
