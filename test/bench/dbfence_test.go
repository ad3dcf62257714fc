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
// with and without pkg/dbfence's Guard. It runs when `make bench` runs as
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
	tx := func(id int, token int64, guard bool) time.Duration {
		start := time.Now()
		x, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if guard {
			if err := table.Guard(ctx, x, dbfence.Lock("/fencer@bench", "bench", fmt.Sprint(id)), token); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := x.ExecContext(ctx, `UPDATE items SET v = v + 1 WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		if err := x.Commit(); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	n := lockSamples()
	var guarded, plain []time.Duration
	for i := range 500 {
		tx(0, int64(i+1), true)
		tx(0, 0, false)
	}
	for i := range n {
		if i%2 == 0 {
			guarded, plain = append(guarded, tx(0, int64(1000+i), true)), append(plain, tx(0, 0, false))
		} else {
			plain, guarded = append(plain, tx(0, 0, false)), append(guarded, tx(0, int64(1000+i), true))
		}
	}
	guarded, plain = sorted(guarded), sorted(plain)
	t.Logf("| guarded transaction, %d interleaved samples | guarded p50 %s p99 %s | plain p50 %s p99 %s | ratio p50 %.2f p99 %.2f (targets ≤1.15, ≤1.3) |",
		n, us(quantile(guarded, .5)), us(quantile(guarded, .99)), us(quantile(plain, .5)), us(quantile(plain, .99)),
		ratio(quantile(guarded, .5), quantile(plain, .5)), ratio(quantile(guarded, .99), quantile(plain, .99)))
	record(t, "DatabaseGuard/guarded", quantile(guarded, .5).Nanoseconds(), "p50-ns", quantile(guarded, .99).Nanoseconds(), "p99-ns")
	record(t, "DatabaseGuard/plain", quantile(plain, .5).Nanoseconds(), "p50-ns", quantile(plain, .99).Nanoseconds(), "p99-ns")

	// Throughput: 1,000 resources from 16 connections, 10 s each way.
	for _, guard := range []bool{true, false} {
		var ops, token atomic.Int64
		token.Store(1 << 40) // above every token of the rows above
		deadline := time.Now().Add(10 * time.Second)
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for k := 0; time.Now().Before(deadline); k++ {
					tx(w+16*(k%62), token.Add(1), guard) // each goroutine its own 62 resources
					ops.Add(1)
				}
			})
		}
		wg.Wait()
		name := map[bool]string{true: "guarded", false: "plain"}[guard]
		t.Logf("| 1,000 resources, 16 connections, 10 s | %s %.0f transactions/s |", name, float64(ops.Load())/10)
		record(t, "DatabaseGuard/throughput/"+name, float64(ops.Load())/10, "tx/s")
	}
}
