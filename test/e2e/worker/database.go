package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the worker's PostgreSQL driver

	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/test/e2e/history"
)

// AuditTable is where each guarded transaction records itself, with the
// guard row's commit counter: the order the checker replays. WritesTable
// takes the transactions' own writes.
const (
	AuditTable  = "fault_audit"
	WritesTable = "fault_writes"
)

// inTransaction is how long each transaction stays open after its guard,
// holding the resource's row lock, so that the nemesis finds workers in
// the middle of one to pause.
const inTransaction = 10 * time.Millisecond

// database is a worker's connection to the fault run's PostgreSQL.
type database struct {
	db    *sql.DB
	table dbfence.Table
	// unguarded is the checker's mutation (--db-unguarded): the guard row
	// counts commits but compares no tokens.
	unguarded bool
	mu        sync.Mutex
	// install names the etcd that issues the tokens; read once.
	install string
}

// openDatabase connects as application_name=<pod>, so the nemesis can
// find and kill this worker's sessions, with the timeouts docs/sdk.md
// recommends: a lock wait gives up after 1 s, and a session paused inside
// a transaction is ended after 2 s, which frees its row lock.
func openDatabase(dsn, pod string, unguarded bool) (*database, error) {
	db, err := sql.Open("pgx", fmt.Sprintf("%s application_name=%s lock_timeout=1000 idle_in_transaction_session_timeout=2000", dsn, pod))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	return &database{db: db, unguarded: unguarded}, nil
}

// writeRow commits one transaction through the guard under token, of the
// Lease or keyed lock (kind "lease" or "lock") named name: the guard, the
// guard row's counter read under its lock, a pause, the audit row. The
// history records whether it committed.
func (w *worker) writeRow(ctx context.Context, kind, name string, token int64) {
	if w.database == nil {
		return
	}
	res, ok := w.resource(ctx, kind, name)
	if !ok {
		return
	}
	seq := w.nextSeq()
	err := w.guardedTx(ctx, res, token, seq)
	if ctx.Err() != nil {
		return
	}
	a := history.Attempt{Kind: history.KindDBWrite, Lease: name, Target: res.String(), Token: token, Seq: seq, OK: err == nil}
	if err != nil {
		a.Reason, a.Message = dbReason(err), err.Error()
	}
	w.record(a)
}

// guardedTx is one transaction through the guard. Under a lock's token it
// guards with Exec, the guard in the statement of the write; under a
// Lease's with Guard, then the write. The counter is read after both, so
// it sees the guard's update.
func (w *worker) guardedTx(ctx context.Context, res dbfence.Resource, token, seq int64) error {
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	tx, err := w.database.db.BeginTx(tctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	const write = `INSERT INTO ` + WritesTable + ` (resource, token, writer, seq) VALUES ($1, $2, $3, $4)`
	if res.Kind == "lock" && !w.database.unguarded {
		_, err = w.database.table.Exec(tctx, tx, res, token, write, res.String(), token, w.pod, seq)
	} else if err = w.database.guard(tctx, tx, res, token); err == nil {
		_, err = tx.ExecContext(tctx, write, res.String(), token, w.pod, seq)
	}
	if err != nil {
		return err
	}
	var counter int64
	if err := tx.QueryRowContext(tctx, `SELECT commits FROM fencer.fences WHERE resource = $1`, res.String()).Scan(&counter); err != nil {
		return err
	}
	time.Sleep(inTransaction)
	if _, err := tx.ExecContext(tctx, `INSERT INTO `+AuditTable+` (resource, counter, token, writer, seq) VALUES ($1, $2, $3, $4, $5)`,
		res.String(), counter, token, w.pod, seq); err != nil {
		return err
	}
	return commit(tctx, tx)
}

// commit commits tx, begun under tctx. When tctx ran out first (a pause
// just before Commit), database/sql has rolled tx back and Commit says
// only sql.ErrTxDone: nothing committed, and the cause is the deadline.
func commit(tctx context.Context, tx *sql.Tx) error {
	err := tx.Commit()
	if errors.Is(err, sql.ErrTxDone) && tctx.Err() != nil {
		return fmt.Errorf("%w: %w", tctx.Err(), err)
	}
	return err
}

// guard is dbfence's Guard, or, unguarded, the same row lock and counter
// without the compare: what the checker must catch.
func (d *database) guard(ctx context.Context, tx *sql.Tx, res dbfence.Resource, token int64) error {
	if !d.unguarded {
		return d.table.Guard(ctx, tx, res, token)
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO fencer.fences AS f (resource, token, commits) VALUES ($1, $2, 1)
		ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, commits = f.commits + 1`, res.String(), token)
	return err
}

// resource names what a token fences in the database; "" until etcd has
// answered once with its cluster ID.
func (w *worker) resource(ctx context.Context, kind, name string) (dbfence.Resource, bool) {
	w.database.mu.Lock()
	defer w.database.mu.Unlock()
	if w.database.install == "" {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		install, err := dbfence.InstallOf(ictx, w.etcd, w.prefix)
		cancel()
		if err != nil {
			return dbfence.Resource{}, false
		}
		w.database.install = install
	}
	return dbfence.Resource{Install: w.database.install, Kind: kind, Namespace: w.namespace, Name: name}, true
}

// dbReason names why a guarded transaction did not commit: a refusal, a
// timeout, or a lost session. Anything else is left unnamed, and the
// checker fails the run.
func dbReason(err error) string {
	var stale *dbfence.StaleError
	var pg *pgconn.PgError
	switch {
	case errors.As(err, &stale):
		return history.ReasonFenced
	case errors.Is(err, context.DeadlineExceeded):
		return history.ReasonTimeout
	case errors.As(err, &pg):
		switch pg.Code {
		case "55P03", "57014": // lock_timeout; a statement cancelled by its context
			return history.ReasonTimeout
		case "57P01", "25P03": // pg_terminate_backend; idle_in_transaction_session_timeout
			return history.ReasonDBUnavailable
		}
		return ""
	case lostSession(err):
		return history.ReasonDBUnavailable
	}
	fmt.Fprintln(os.Stderr, "worker: database:", err)
	return ""
}

// lostSession reports an error of a connection that is gone: closed by
// the server (its FATAL already read, or not), or failing to reconnect.
func lostSession(err error) bool {
	var netErr net.Error
	msg := err.Error()
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.As(err, &netErr) || strings.Contains(msg, "conn closed") || strings.Contains(msg, "failed to connect")
}
