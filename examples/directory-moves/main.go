// Command directory-moves is the story of two replicas editing one
// directory tree in PostgreSQL (README.md). A directory holds at most
// three entries. Without fencer each replica serializes its requests with
// a mutex of its own, so a move and an upload served by different
// replicas both pass the entry-limit check, and the directory ends up
// over its limit. With fencer each request takes keyed locks on the
// directories it touches and writes through the database guard under
// their tokens: a replica frozen past its lock's TTL is refused when it
// wakes up and commits, and a client's retry is answered from the
// operation's idempotency record instead of running again.
//
//	go run ./examples/directory-moves demo   # make demo STORY=directory-moves
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the story's PostgreSQL driver

	"github.com/fencer-io/fencer/examples/internal/story"
	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/pkg/fence"
)

// limit is the tree's invariant: no directory holds more entries.
const limit = 3

// lockTTL is how long a frozen replica keeps its keyed locks.
const lockTTL = 2 * time.Second

func main() {
	story.Main("directory-moves", map[string]story.Role{
		"demo": {Run: func(ctx context.Context, _ []string) error { return demo(ctx) }},
		"serve": {Args: "naive|fenced OP-ID move|upload NAME FROM TO", NArgs: 6, Run: func(ctx context.Context, args []string) error {
			return serve(ctx, args[0], request{op: args[1], kind: args[2], name: args[3], from: args[4], to: args[5]})
		}},
	})
}

// request is one client request: move NAME from FROM into TO, or upload
// NAME into TO (FROM is "-"). op is the client's operation ID, the same
// on a retry.
type request struct {
	op, kind, name, from, to string
}

// dirs are the directories the request changes, in one order for every
// replica, so that guards of two requests never wait for each other in a
// cycle.
func (r request) dirs() []string {
	ds := []string{r.to}
	if r.kind == "move" {
		ds = append(ds, r.from)
	}
	slices.Sort(ds)
	return ds
}

// done describes a served request, as the client is answered.
func (r request) done(entries int) string {
	if r.kind == "move" {
		return fmt.Sprintf("moved %s from %s into %s (%d of %d entries)", r.name, r.from, r.to, entries, limit)
	}
	return fmt.Sprintf("uploaded %s into %s (%d of %d entries)", r.name, r.to, entries, limit)
}

// write applies the request to the tree.
func (r request) write(ctx context.Context, tx *sql.Tx) error {
	if r.kind == "move" {
		res, err := tx.ExecContext(ctx, `UPDATE entries SET dir = $1 WHERE dir = $2 AND name = $3`, r.to, r.from, r.name)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("%s is not in %s", r.name, r.from)
		}
		return nil
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO entries (dir, name) VALUES ($1, $2)`, r.to, r.name)
	return err
}

// work is what the request does between its check and its write:
// copying the file's bytes to object storage.
func work() { time.Sleep(800 * time.Millisecond) }

// check counts the request's target directory's entries and says
// whether there is room for one more.
func check(ctx context.Context, db *sql.DB, r request) (n int, room bool, err error) {
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM entries WHERE dir = $1`, r.to).Scan(&n); err != nil {
		return 0, false, err
	}
	story.Say(story.Pod(), "%s: checked: %s has %d of %d entries", r.op, r.to, n, limit)
	if n >= limit {
		story.Say(story.Pod(), "%s: refused: %s is full", r.op, r.to)
	}
	return n, n < limit, nil
}

// answered answers a retry of an operation already committed from its
// idempotency record, and says whether it did.
func answered(ctx context.Context, db *sql.DB, table dbfence.Table, res dbfence.Resource, op string) (bool, error) {
	result, found, err := table.Lookup(ctx, db, res, op)
	if found {
		story.Say(story.Pod(), "%s: a retry: answered from its idempotency record: %s", op, result)
	}
	return found, err
}

func serve(ctx context.Context, mode string, r request) error {
	db, err := sql.Open("pgx", os.Getenv("STORY_DATABASE"))
	if err != nil {
		return err
	}
	defer db.Close()
	switch mode {
	case "naive":
		return serveNaive(ctx, db, r)
	case "fenced":
		return serveFenced(ctx, db, r)
	}
	return fmt.Errorf("mode %q: want naive or fenced", mode)
}

// mutexes are a replica's own locks, one per directory: they serialize
// this replica's requests and nothing else.
var (
	mutexesMu sync.Mutex
	mutexes   = map[string]*sync.Mutex{}
)

func mutex(dir string) *sync.Mutex {
	mutexesMu.Lock()
	defer mutexesMu.Unlock()
	if mutexes[dir] == nil {
		mutexes[dir] = &sync.Mutex{}
	}
	return mutexes[dir]
}

// serveNaive checks the limit under the replica's mutexes, works, writes.
func serveNaive(ctx context.Context, db *sql.DB, r request) error {
	me := story.Pod()
	for _, d := range r.dirs() {
		mutex(d).Lock()
		defer mutex(d).Unlock()
	}
	story.Say(me, "%s: locked %v (a mutex in this replica)", r.op, r.dirs())
	n, room, err := check(ctx, db, r)
	if err != nil || !room {
		return err
	}
	work()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := r.write(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	story.Say(me, "%s: %s", r.op, r.done(n+1))
	return nil
}

// serveFenced answers a retry from the operation's record; otherwise it
// takes a keyed lock per directory, checks the limit, works, and writes in
// a transaction that guards every directory under its lock's token and
// records the operation.
func serveFenced(ctx context.Context, db *sql.DB, r request) error {
	me := story.Pod()
	env, err := story.Connect(ctx)
	if err != nil {
		return err
	}
	install, err := dbfence.InstallOf(ctx, env.Etcd, env.Prefix)
	if err != nil {
		return err
	}
	var table dbfence.Table
	resource := func(dir string) dbfence.Resource { return dbfence.Lock(install, story.Namespace, dir) }
	if done, err := answered(ctx, db, table, resource(r.to), r.op); err != nil || done {
		return err
	}
	uid, err := story.PodUID()
	if err != nil {
		return err
	}
	locker, err := fence.NewLocker(env.Etcd, env.Prefix, story.Namespace, fence.LockerOptions{Pod: me, PodUID: string(uid), TTL: lockTTL})
	if err != nil {
		return err
	}
	defer locker.Close(context.Background())
	lk, err := locker.Lock(ctx, r.dirs()...)
	if err != nil {
		return err
	}
	defer func() {
		// An Unlock that fails says the work may not have been protected
		// to its end (the lock was lost, or etcd did not answer): the
		// guards decided what committed, but say so.
		if err := lk.Unlock(context.Background()); err != nil {
			story.Say(me, "%s: unlock: %v", r.op, err)
		}
	}()
	tokens := make([]int64, 0, len(r.dirs()))
	for _, d := range r.dirs() {
		tokens = append(tokens, lk.Token(d).Value)
	}
	story.Say(me, "%s: locked %v with tokens %v", r.op, r.dirs(), tokens)
	// A retry that waited for the lock while the first attempt ran: the
	// first committed before it unlocked.
	if done, err := answered(ctx, db, table, resource(r.to), r.op); err != nil || done {
		return err
	}
	if _, room, err := check(ctx, db, r); err != nil || !room {
		return err
	}
	work()
	result, err := commitFenced(ctx, db, table, r, lk, resource)
	var stale *dbfence.StaleError
	if errors.As(err, &stale) {
		story.Say(me, "%s: commit REFUSED: %v", r.op, err)
		return nil
	}
	if errors.Is(err, errFull) {
		story.Say(me, "%s: refused: %v", r.op, err)
		return nil
	}
	if err != nil {
		return err
	}
	story.Say(me, "%s: %s", r.op, result)
	return nil
}

// errFull refuses a request into a full directory.
var errFull = errors.New("the directory is full")

// commitFenced is the request's transaction: the guards first, one per
// directory in the request's order, then, recorded under the operation ID,
// the check again and the write. The check before the work was under the
// lock, which may have expired since; after the guards, under READ
// COMMITTED, it sees every write the database accepted under an earlier
// token, so a holder whose successor had not yet written cannot overfill
// the directory either.
//
// The story begins the transaction with ctx, so that the frozen replica's
// late commit reaches the database and the guard is what refuses it. Your
// code begins it with lk.Context() (docs/sdk.md): a loss the Locker has
// seen then rolls it back before it reaches the guard, which is for the
// loss it has not seen.
func commitFenced(ctx context.Context, db *sql.DB, table dbfence.Table, r request, lk *fence.Lock, resource func(string) dbfence.Resource) (string, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback() }()
	// Bounded below the locks' TTL: a transaction blocked or paused while
	// it holds a directory's guard row does not hold it for long.
	for _, bound := range []string{`SET LOCAL lock_timeout = '1s'`, `SET LOCAL idle_in_transaction_session_timeout = '1s'`} {
		if _, err := tx.ExecContext(ctx, bound); err != nil {
			return "", err
		}
	}
	for _, d := range r.dirs() {
		if err := table.Guard(ctx, tx, resource(d), lk.Token(d).Value); err != nil {
			return "", err
		}
	}
	result, _, err := table.Once(ctx, tx, resource(r.to), r.op, lk.Token(r.to).Value, func() ([]byte, error) {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM entries WHERE dir = $1`, r.to).Scan(&n); err != nil {
			return nil, err
		}
		if n >= limit {
			return nil, fmt.Errorf("%w: %s has %d of %d entries", errFull, r.to, n, limit)
		}
		return []byte(r.done(n + 1)), r.write(ctx, tx)
	})
	if err != nil {
		return "", err
	}
	return string(result), tx.Commit()
}
