package harness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the harness's PostgreSQL driver

	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/test/e2e/history"
)

// auditTable matches the worker's: each guarded transaction's resource,
// the guard row's counter, its token, and the worker's write number.
const auditTable = "fault_audit"

// startDatabase applies the guard's migration and the audit table, and
// keeps an admin connection for the nemesis and the dump.
func (h *Harness) startDatabase(ctx context.Context) error {
	if h.opts.Database == "" {
		return nil
	}
	db, err := sql.Open("pgx", h.opts.Database)
	if err != nil {
		return err
	}
	h.db = db
	m, err := dbfence.Table{}.Migration()
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, m); err != nil {
		return fmt.Errorf("the guard's migration: %w", err)
	}
	_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+auditTable+` (
	resource text NOT NULL, counter bigint NOT NULL, token bigint NOT NULL, writer text NOT NULL, seq bigint NOT NULL);
CREATE TABLE IF NOT EXISTS fault_writes (resource text NOT NULL, token bigint NOT NULL, writer text NOT NULL, seq bigint NOT NULL)`)
	return err
}

// databaseFaults break the workers' transactions: a worker paused in the
// middle of one, holding its row lock, and a worker's sessions killed.
// The pause (4–8 s) outlasts idle_in_transaction_session_timeout (2 s):
// PostgreSQL ends the session and frees the lock, and the woken worker's
// commit fails. It proves the lock is freed and the others go on, not a
// late commit: the guard's refusal of those is the paused-worker fault's.
func (h *Harness) databaseFaults() []fault {
	if h.db == nil {
		return nil
	}
	return []fault{
		{"pause-worker-in-transaction", 4 * time.Second, 8 * time.Second, func(ctx context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			w := h.workerInTransaction(ctx, rng)
			w.pause()
			return w.name, func(context.Context) error { w.resume(); return nil }
		}},
		{"kill-db-connections", 0, time.Second, func(ctx context.Context, rng *rand.Rand) (string, func(context.Context) error) {
			w := h.workers[rng.IntN(len(h.workers))]
			var n int
			err := h.db.QueryRowContext(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, w.name).Scan(&n)
			if err != nil {
				h.opts.Logf("killing %s's database sessions: %v", w.name, err)
			}
			return fmt.Sprintf("%s (%d sessions)", w.name, n), func(context.Context) error { return nil }
		}},
	}
}

// workerInTransaction is a worker with a transaction open, as
// pg_stat_activity shows it, found within a second; else any worker.
func (h *Harness) workerInTransaction(ctx context.Context, rng *rand.Rand) *process {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		var name string
		err := h.db.QueryRowContext(ctx, `SELECT application_name FROM pg_stat_activity
			WHERE state = 'idle in transaction' AND application_name LIKE 'w-%' ORDER BY random() LIMIT 1`).Scan(&name)
		for _, w := range h.workers {
			if err == nil && w.name == name {
				return w
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.opts.Logf("no worker in a transaction within 1s; pausing one at random")
	return h.workers[rng.IntN(len(h.workers))]
}

// DumpDatabase writes the audit table to db.jsonl; nothing without a
// database.
func (h *Harness) DumpDatabase(ctx context.Context) error {
	if h.db == nil {
		return nil
	}
	w, err := history.Create(filepath.Join(h.opts.Dir, "db.jsonl"))
	if err != nil {
		return err
	}
	defer w.Close()
	rows, err := h.db.QueryContext(ctx, `SELECT resource, counter, token, writer, seq FROM `+auditTable)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c history.DBCommit
		if err := rows.Scan(&c.Resource, &c.Counter, &c.Token, &c.Writer, &c.Seq); err != nil {
			return err
		}
		if err := w.Add(c); err != nil {
			return err
		}
	}
	return errors.Join(rows.Err(), rows.Close())
}
