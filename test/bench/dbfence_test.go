package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/test/support/postgres"
)

// TestDatabaseGuard measures a guarded transaction against the same
// transaction without the guard, on one PostgreSQL (synchronous_commit on,
// a unix socket), interleaved: BEGIN, one UPDATE by primary key, COMMIT,
// with and without pkg/dbfence's guard, as Guard before the UPDATE and as
// Exec, the guard and the UPDATE in one statement. It runs when `make bench` runs as
// root (FENCER_TEST_DB), as `make test-db` does.
func TestDatabaseGuard(t *testing.T) {
	db := postgres.Start(t).Open(t)
	db.SetMaxOpenConns(16)
	ctx := context.Background()
	table := dbfence.Table{}
	m, err := table.Migration()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(m); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE items (id int PRIMARY KEY, v bigint); INSERT INTO items SELECT g, 0 FROM generate_series(0, 999) g`); err != nil {
		t.Fatal(err)
	}
	// form is how the transaction is guarded: not at all, Guard then the
	// UPDATE, or both in one statement (Exec).
	tx := func(id int, token int64, form string) time.Duration {
		start := time.Now()
		x, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		res := dbfence.Lock("/fencer@bench", "bench", fmt.Sprint(id))
		switch form {
		case "guarded":
			if err := table.Guard(ctx, x, res, token); err != nil {
				t.Fatal(err)
			}
			_, err = x.ExecContext(ctx, `UPDATE items SET v = v + 1 WHERE id = $1`, id)
		case "exec":
			_, err = table.Exec(ctx, x, res, token, `UPDATE items SET v = v + 1 WHERE id = $1`, id)
		default:
			_, err = x.ExecContext(ctx, `UPDATE items SET v = v + 1 WHERE id = $1`, id)
		}
		if err == nil {
			err = x.Commit()
		}
		if err != nil {
			// Not Fatal: the throughput's goroutines call this too. A
			// failed transaction ends them (-1), and fails the test.
			_ = x.Rollback()
			t.Errorf("%s transaction on %d under token %d: %v", form, id, token, err)
			return -1
		}
		return time.Since(start)
	}
	n := lockSamples()
	forms := []string{"guarded", "exec", "plain"}
	for i := range 500 {
		for _, f := range forms {
			tx(0, int64(i+1), f)
		}
	}
	// Interleaved, in a rotating order, so that no form always goes first.
	samples := map[string][]time.Duration{}
	for i := range n {
		for j := range forms {
			f := forms[(i+j)%len(forms)]
			samples[f] = append(samples[f], tx(0, int64(1000+i), f))
		}
	}
	plain := sorted(samples["plain"])
	for _, f := range forms[:2] {
		g := sorted(samples[f])
		t.Logf("| %s transaction, %d interleaved samples | %s p50 %s p99 %s | plain p50 %s p99 %s | ratio p50 %.2f p99 %.2f (targets ≤1.15, ≤1.3) |",
			f, n, f, us(quantile(g, .5)), us(quantile(g, .99)), us(quantile(plain, .5)), us(quantile(plain, .99)),
			ratio(quantile(g, .5), quantile(plain, .5)), ratio(quantile(g, .99), quantile(plain, .99)))
		record(t, "DatabaseGuard/"+f, quantile(g, .5).Nanoseconds(), "p50-ns", quantile(g, .99).Nanoseconds(), "p99-ns")
	}
	record(t, "DatabaseGuard/plain", quantile(plain, .5).Nanoseconds(), "p50-ns", quantile(plain, .99).Nanoseconds(), "p99-ns")

	// Throughput: 1,000 resources from 16 connections, 10 s each way.
	var token atomic.Int64
	token.Store(1 << 40) // above every token of the rows above, and growing across the forms
	for _, form := range forms {
		var ops atomic.Int64
		deadline := time.Now().Add(10 * time.Second)
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for k := 0; time.Now().Before(deadline); k++ {
					if tx(w+16*(k%62), token.Add(1), form) < 0 { // each goroutine its own 62 resources
						return
					}
					ops.Add(1)
				}
			})
		}
		wg.Wait()
		t.Logf("| 1,000 resources, 16 connections, 10 s | %s %.0f transactions/s |", form, float64(ops.Load())/10)
		record(t, "DatabaseGuard/throughput/"+form, float64(ops.Load())/10, "tx/s")
	}
}
