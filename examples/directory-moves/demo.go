package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fencer-io/fencer/examples/internal/story"
	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/test/support/postgres"
)

// The tree every run starts from: /projects is one entry below its limit.
const tree = `DROP TABLE IF EXISTS entries;
CREATE TABLE entries (dir text NOT NULL, name text NOT NULL, PRIMARY KEY (dir, name));
INSERT INTO entries VALUES ('/inbox', 'report.pdf'), ('/projects', 'plan.md'), ('/projects', 'budget.xlsx');`

// database is $STORY_DATABASE, or a PostgreSQL the demo runs itself from
// Debian's package (as root); stop tears that down.
func database(ctx context.Context) (dsn string, stop func(), err error) {
	if dsn := os.Getenv("STORY_DATABASE"); dsn != "" {
		return dsn, func() {}, nil
	}
	story.Say("demo", "starting PostgreSQL (Debian's postgresql, installed when missing)")
	s, err := postgres.Run(ctx)
	if errors.Is(err, postgres.ErrNotRoot) {
		return "", nil, errors.New("this story needs PostgreSQL: run `make demo STORY=directory-moves` as root (it runs Debian's postgresql as the postgres user, installing it when missing), or set STORY_DATABASE to a DSN of a database of yours")
	}
	if err != nil {
		return "", nil, err
	}
	return s.DSN, func() { _ = s.Stop() }, nil
}

func demo(ctx context.Context) error {
	if story.OnRealNode() {
		return errors.New("this story runs its replicas as local processes, beside the PostgreSQL it starts on a unix socket: run it without NODE=real")
	}
	dsn, stop, err := database(ctx)
	if err != nil {
		return err
	}
	defer stop()
	os.Setenv("STORY_DATABASE", dsn) // for the replicas
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	migration, err := dbfence.Table{}.Migration()
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, migration); err != nil {
		return fmt.Errorf("the guard's migration: %w", err)
	}
	if _, err := story.Setup(ctx, "directory-moves", "dir-0", "dir-1"); err != nil {
		return err
	}
	// Operation IDs of this demo's requests: a database of yours may hold
	// the records of an earlier demo.
	run := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)
	for _, mode := range []string{"naive", "fenced"} {
		if err := play(ctx, db, mode, run); err != nil {
			return err
		}
	}
	return nil
}

// play runs the story once: dir-0 serves a move into /projects, passes its
// check and is frozen; dir-1 serves an upload into /projects; dir-0 wakes
// up and commits. With fencer, the upload's client then retries.
func play(ctx context.Context, db *sql.DB, mode, run string) error {
	title, verdict := "without fencer: a mutex in each replica", "without fencer"
	if mode == "fenced" {
		title, verdict = "with fencer: a keyed lock per directory, writes through the database guard", "with fencer"
	}
	story.Section(title)
	if _, err := db.ExecContext(ctx, tree); err != nil {
		return err
	}
	move := []string{"serve", mode, "move-" + run, "move", "report.pdf", "/inbox", "/projects"}
	upload := []string{"serve", mode, "upload-" + run, "upload", "notes.txt", "-", "/projects"}
	a, err := story.Start(move[0], "dir-0", move[1:]...)
	if err != nil {
		return err
	}
	defer story.KillAll(a)
	if err := a.WaitForCount(ctx, "checked", 1, 60*time.Second); err != nil {
		return err
	}
	a.Pause()
	story.Say("demo", "dir-0 stays frozen for 4 s, past its keyed locks' TTL (%s)", lockTTL)
	frozen := time.Now()
	b, err := story.Start(upload[0], "dir-1", upload[1:]...)
	if err != nil {
		return err
	}
	defer story.KillAll(b)
	if err := b.WaitForCount(ctx, "uploaded", 1, 60*time.Second); err != nil {
		return err
	}
	time.Sleep(time.Until(frozen.Add(4 * time.Second)))
	a.Resume()
	outcome := "moved"
	if mode == "fenced" {
		outcome = "REFUSED"
	}
	if err := a.WaitForCount(ctx, outcome, 1, 60*time.Second); err != nil {
		return err
	}
	retried := true
	if mode == "fenced" {
		story.Say("demo", "the upload's client lost dir-1's answer and retries %s on dir-0", upload[2])
		c, err := story.Start(upload[0], "dir-0", upload[1:]...)
		if err != nil {
			return err
		}
		defer story.KillAll(c)
		retried = c.WaitForCount(ctx, "idempotency record", 1, 60*time.Second) == nil
	}
	story.Verdict(verdict, anomaly(ctx, db, retried))
	return nil
}

// anomaly checks the tree's invariant and what the requests left: the
// upload once, the refused move not applied, and the retry answered from
// the record; "" when all hold.
func anomaly(ctx context.Context, db *sql.DB, retried bool) string {
	var problems []string
	rows, err := db.QueryContext(ctx, `SELECT dir, count(*) FROM entries GROUP BY dir HAVING count(*) > $1`, limit)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	for rows.Next() {
		var dir string
		var n int
		if err := rows.Scan(&dir, &n); err != nil {
			return err.Error()
		}
		problems = append(problems, fmt.Sprintf("%s has %d entries, over its limit of %d: both replicas passed their checks before either wrote", dir, n, limit))
	}
	if !retried {
		problems = append(problems, "the retried upload was not answered from its idempotency record")
	}
	return strings.Join(problems, "; ")
}
