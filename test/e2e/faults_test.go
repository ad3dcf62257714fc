// Package e2e proves fencer's guarantees (docs/guarantees.md) under faults: a
// seeded nemesis pauses, kills, restarts and partitions the managers, the
// workers and etcd while workers write fenced objects and keys and issue
// IDs, and, with a real PostgreSQL (as root), commit through the database
// guard; then the checker replays every history. `make test-faults` runs it.
//
//	FAULT_DURATION  how long the nemesis runs (default 2m)
//	FAULT_SEED      the nemesis's seed (default: from the clock, printed)
//	FAULT_KEEP      keep the histories of a passing run too
//
// A failing run leaves its histories in bin/faults/<seed>/; replay them with
// `go run ./test/e2e/replay bin/faults/<seed>`.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/e2e/harness"
	"github.com/fencer-io/fencer/test/e2e/history"
	"github.com/fencer-io/fencer/test/support/postgres"
	"github.com/fencer-io/fencer/test/support/testenv"
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(log.FromContext(context.Background()).WithSink(log.NullLogSink{}))
	os.Exit(m.Run())
}

// build compiles pkg with tags into dir.
func build(t *testing.T, dir, out, pkg string, tags ...string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, out)
	args := []string{"build", "-o", path}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return path
}

// runDir is bin/faults/<name>, emptied.
func runDir(t *testing.T, name string) string {
	t.Helper()
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(bin, "faults", name)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// start runs the harness; database is a PostgreSQL DSN for the database
// workers, or "", and unguarded their mutation.
func start(t *testing.T, dir, fencer, database string, unguarded bool) *harness.Harness {
	t.Helper()
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	binaries := t.TempDir()
	worker := build(t, binaries, "worker", "./test/e2e/worker")
	h, err := harness.Start(context.Background(), harness.Options{
		BinDir: bin, Dir: dir, Fencer: fencer, Worker: worker, Workers: 4, Database: database, Unguarded: unguarded,
		Logf: func(format string, args ...any) { t.Logf(format, args...) },
	})
	if err != nil {
		t.Fatalf("starting the harness: %v (logs in %s)", err, dir)
	}
	return h
}

// finish stops the workload, records etcd's history and checks everything.
func finish(t *testing.T, h *harness.Harness, dir string) *history.Report {
	t.Helper()
	ctx := context.Background()
	if err := h.StopWorkload(); err != nil {
		t.Fatal(err)
	}
	if err := h.DumpEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.DumpDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	hs, err := history.Load(dir, etcdkeys.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	return history.Check(hs)
}

// database is a real PostgreSQL for the database workers when the run may
// start one (FENCER_TEST_DB=1, root: `make test-faults` sets it as root),
// else "" and a line saying what was left out.
func database(t *testing.T) string {
	if os.Getenv("FENCER_TEST_DB") == "" {
		fmt.Println("database workers left out: they need a real PostgreSQL, run as root (make test-faults as root sets FENCER_TEST_DB=1)")
		return ""
	}
	return postgres.Start(t).DSN
}

func TestFaults(t *testing.T) {
	duration := 2 * time.Minute
	if d := os.Getenv("FAULT_DURATION"); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("FAULT_DURATION=%q: %v", d, err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FAULT_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("FAULT_SEED=%q: %v", s, err)
		}
	}
	fmt.Printf("fault seed %d, duration %s (rerun with FAULT_SEED=%d)\n", seed, duration, seed)
	dir := runDir(t, strconv.FormatUint(seed, 10))
	fencer := build(t, t.TempDir(), "fencer", "./cmd/fencer")
	h := start(t, dir, fencer, database(t), false)
	defer h.Close()
	ctx := context.Background()

	// The workload runs a little before and after the nemesis, so that
	// every Lease was held before the first fault.
	if _, err := h.WaitHeld(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	counts, err := h.Nemesis(ctx, seed, duration)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	// Bound: the controller's takeover (leader election 4 s, etcd session
	// 2 s) and an etcd that may be electing a leader, on a loaded machine.
	took, err := h.WaitHeld(ctx, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SecurityChecks(ctx); err != nil {
		t.Fatal(err)
	}
	r := finish(t, h, dir)

	kinds := make([]string, 0, len(counts))
	for k, n := range counts {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kinds)
	fmt.Printf("faults by kind: %s\n", strings.Join(kinds, ", "))
	fmt.Printf("refused by reason: %v; IDs issued %d; held again after healing: %v\n", r.RefusedBy, r.IDs, took)
	fmt.Printf("hostile writes by mode: %v; token reports %d; relabels of a holder %d\n", r.HostileBy, r.Reports, r.Relabels)
	fmt.Printf("database: commits %d %v, refused by reason %v\n", r.DBCommits, r.DBCommitsByKind, r.DBRefusedBy)
	for _, v := range r.Violations {
		fmt.Println("violation:", v)
	}
	fmt.Println(r.Summary())
	if !r.OK() {
		t.Fatalf("guarantees violated; histories kept in %s (replay: go run ./test/e2e/replay %s)", dir, dir)
	}
	if r.Accepted == 0 || r.Refused == 0 || r.IDs == 0 {
		t.Fatalf("the workload did not exercise fencing: %d accepted, %d refused, %d IDs", r.Accepted, r.Refused, r.IDs)
	}
	// "0 violations" is evidence only of what the run did: faults, stale
	// writes the fences refused, and each hostile write tried.
	if r.Faults == 0 || r.RefusedBy[history.ReasonFenced] == 0 || r.Relabels == 0 {
		t.Fatalf("the run exercised too little: %d faults, %d writes refused by a fence, %d relabels of a holder", r.Faults, r.RefusedBy[history.ReasonFenced], r.Relabels)
	}
	for _, mode := range []string{"merge-no-token", "apply-no-token", "label-remove", "annotate", "forge-future", "forged-record",
		"scale", "status", "delete", "delete-deployment", "copied-slot", "forged-block", "copied-block"} {
		if r.HostileBy[mode] == 0 {
			t.Errorf("no hostile %s write was tried: %v", mode, r.HostileBy)
		}
	}
	if os.Getenv("FENCER_TEST_DB") != "" && (r.DBCommitsByKind["lease"] == 0 || r.DBCommitsByKind["lock"] == 0) {
		t.Fatalf("the database workers committed too little: %v by kind of token", r.DBCommitsByKind)
	}
	if os.Getenv("FAULT_KEEP") == "" {
		_ = os.RemoveAll(dir)
	}
}

// TestCheckerCatchesBrokenWebhook runs a manager built with the webhook's
// checks disabled (build tag fencer_e2e_broken) and pauses the holder of a
// Lease past its TTL: it wakes up and writes with its stale token, the
// broken webhook lets that through, and the checker must say so. Without
// this, a checker that never finds anything would look like a pass.
func TestCheckerCatchesBrokenWebhook(t *testing.T) {
	dir := runDir(t, "broken-webhook")
	fencer := build(t, t.TempDir(), "fencer-broken", "./cmd/fencer", "fencer_e2e_broken")
	// The database workers commit without the guard's compare: the woken
	// holder's commits must show up out of order in the audit.
	db := database(t)
	h := start(t, dir, fencer, db, true)
	defer h.Close()
	ctx := context.Background()
	if _, err := h.WaitHeld(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	holder, err := h.PauseHolder(ctx, "alpha", 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the woken holder writes with its stale token
	r := finish(t, h, dir)
	t.Logf("paused %s; %s", holder, r.Summary())
	if r.StaleAccepted == 0 {
		t.Fatalf("the webhook admitted everything, yet the checker found no stale write: %s", r.Summary())
	}
	if db != "" && r.DBStaleCommits == 0 {
		t.Fatalf("the database workers committed without the guard, yet the audit shows no commit out of order: %s", r.Summary())
	}
	if r.HostileAccepted == 0 {
		t.Fatalf("the webhook admitted everything, yet the checker found no hostile write accepted: %s", r.Summary())
	}
	for _, v := range r.Violations {
		if strings.Contains(v, "object cm-alpha") {
			t.Logf("caught: %s", v)
			_ = os.RemoveAll(dir)
			return
		}
	}
	t.Fatalf("no stale write to cm-alpha reported: %v", r.Violations)
}
