package dbfence_test

import (
	"context"
	"database/sql"
	"errors"
	"log"

	"github.com/fencer-io/fencer/pkg/dbfence"
)

// Write under a keyed lock's token: the guard and the writes commit
// together, or a newer holder's token refuses them all.
func ExampleTable_Guard() {
	ctx := context.Background()
	var db *sql.DB     // sql.Open("pgx", dsn)
	var token int64    // lk.Token("dir/inbox").Value
	var install string // dbfence.InstallOf(ctx, etcdCli, prefix)
	res := dbfence.Lock(install, "default", "dir/inbox")

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := (dbfence.Table{}).Guard(ctx, tx, res, token); err != nil {
		var stale *dbfence.StaleError
		if errors.As(err, &stale) {
			log.Printf("a newer holder (token %d) wrote: stop", stale.Floor)
		}
		return // errors.Is(err, dbfence.ErrSerialization): retry the transaction
	}
	if _, err := tx.ExecContext(ctx, `UPDATE entries SET dir = 'inbox' WHERE id = 7`); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// The guard and the first write in one statement, one round trip.
func ExampleTable_Exec() {
	ctx := context.Background()
	var db *sql.DB
	var token int64
	res := dbfence.Lock("/fencer@a1b2", "default", "dir/inbox")

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := (dbfence.Table{}).Exec(ctx, tx, res, token, `UPDATE entries SET dir = $1 WHERE id = $2`, "inbox", 7); err != nil {
		return // a *StaleError: a newer holder wrote; nothing of tx commits
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// A writer numbers its writes within a tenure; restarted in the same
// tenure, it resumes after the stored sequence.
func ExampleTable_GuardSeq() {
	ctx := context.Background()
	var db *sql.DB
	var token int64
	res := dbfence.Lease("/fencer@a1b2", "default", "report")
	table := dbfence.Table{}
	floor, seq, err := table.Floor(ctx, db, res)
	if err != nil {
		log.Fatal(err)
	}
	if floor != token {
		seq = 0 // a new tenure starts its sequence over
	}
	tx, _ := db.BeginTx(ctx, nil)
	defer func() { _ = tx.Rollback() }()
	if err := table.GuardSeq(ctx, tx, res, token, seq+1); err != nil {
		return // a delayed or repeated write of this tenure, or a newer tenure
	}
	_ = tx.Commit()
}

// A table that keeps its own token column.
func ExampleRow_Update() {
	ctx := context.Background()
	var tx *sql.Tx
	var token int64
	tasks := dbfence.Row{Table: "tasks", KeyColumn: "id", TokenColumn: "attempt_token"}
	err := tasks.Update(ctx, tx, 42, token, "result = $3, done = true", "ok")
	var stale *dbfence.StaleError
	if errors.As(err, &stale) {
		log.Printf("task 42 belongs to a newer attempt (token %d)", stale.Floor)
	}
}

// A client retry is answered from the record of the first attempt.
func ExampleTable_Once() {
	ctx := context.Background()
	var tx *sql.Tx
	var token int64
	res := dbfence.Lock("/fencer@a1b2", "default", "dir/inbox")
	table := dbfence.Table{}
	// Once deduplicates; the guard fences. Guard the transaction first.
	if err := table.Guard(ctx, tx, res, token); err != nil {
		log.Fatal(err)
	}
	result, replayed, err := table.Once(ctx, tx, res, "upload-5f2c", token, func() ([]byte, error) {
		// ... the writes, once ...
		return []byte(`{"id": 7}`), nil
	})
	if err != nil {
		log.Fatal(err)
	}
	if replayed {
		log.Printf("a retry: answering %s without writing again", result)
	}
}
