package main

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/fencer-io/fencer/test/e2e/history"
	"github.com/fencer-io/fencer/test/support/postgres"
)

// A transaction whose deadline ran out before its Commit (the nemesis
// paused the worker in it) is refused for a timeout, not for no nameable
// reason: database/sql has rolled it back, and Commit says only
// sql.ErrTxDone. A 10-minute fault run reported it as unexplained.
func TestCommitAfterTheDeadlineIsATimeout(t *testing.T) {
	db := postgres.Start(t).Open(t)
	tctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	tx, err := db.BeginTx(tctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-tctx.Done()
	// database/sql rolls tx back once tctx is done, in its own goroutine.
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		_, err := tx.ExecContext(context.Background(), `SELECT 1`)
		if errors.Is(err, sql.ErrTxDone) {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the transaction was not rolled back 10s after its deadline: %v", err)
		}
	}
	err = commit(tctx, tx)
	if reason := dbReason(err); reason != history.ReasonTimeout {
		t.Fatalf("Commit after the deadline: %v, reason %q, want %q", err, reason, history.ReasonTimeout)
	}
}
