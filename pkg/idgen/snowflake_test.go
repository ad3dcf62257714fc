package idgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// leaseSlot writes slot n as the controller would and returns its token.
func leaseSlot(t *testing.T, cli *clientv3.Client, n int64) int64 { return leaseSlotB(t, cli, n) }

func leaseSlotB(t testing.TB, cli *clientv3.Client, n int64) int64 {
	t.Helper()
	l, err := cli.Grant(context.Background(), 30)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(context.Background(), etcdkeys.SlotKey(etcdkeys.DefaultPrefix, "ns", "workers", n), `{"pod":"p","podUID":"uid-p"}`, clientv3.WithLease(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func newGen(t *testing.T, cli *clientv3.Client, slot, token int64, now func() time.Time) *Snowflake {
	t.Helper()
	g, err := NewSnowflake(context.Background(), cli, SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: slot, Token: token, PodUID: "uid-p", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

func TestLayoutLastsPast2100(t *testing.T) {
	end := Epoch.Add(time.Duration(1<<TimeBits) * time.Millisecond)
	if end.Year() <= 2100 || TimeBits+WorkerBits+SeqBits != 63 {
		t.Fatalf("layout ends in %d with %d bits", end.Year(), TimeBits+WorkerBits+SeqBits)
	}
}

// A clock past the layout's time (set far ahead) issues no ID, and
// reserves nothing: the slot's clock key written that far ahead made every
// later holder of the slot refuse, as a clock gone back, until then.
func TestAClockPastTheLayoutReservesNothing(t *testing.T) {
	cli := startEtcd(t)
	tok := leaseSlot(t, cli, 7)
	ctx := context.Background()
	at := Epoch.Add(time.Duration(1<<TimeBits) * time.Millisecond).Add(time.Hour)
	c := &clock{now: at}
	wrong := newGen(t, cli, 7, tok, c.Now)
	if id, err := wrong.Next(ctx); err == nil || !strings.Contains(err.Error(), "outside the snowflake layout") {
		t.Fatalf("Next at %s: %d, %v; want a refusal naming the layout", at, id, err)
	}
	wrong.Close()
	// A generator with a right clock, after them, starts at once.
	g := newGen(t, cli, 7, tok, nil)
	if _, err := g.Next(ctx); err != nil {
		t.Fatalf("Next with a right clock after the wrong ones: %v", err)
	}
}

func TestTwoSlotsNeverCollide(t *testing.T) {
	cli := startEtcd(t)
	a := newGen(t, cli, 1, leaseSlot(t, cli, 1), nil)
	b := newGen(t, cli, 2, leaseSlot(t, cli, 2), nil)
	seen := map[int64]bool{}
	var last int64
	for range 100_000 {
		for _, g := range []*Snowflake{a, b} {
			id, err := g.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if seen[id] {
				t.Fatalf("duplicate ID %d", id)
			}
			seen[id] = true
			if g == a {
				if id <= last {
					t.Fatalf("IDs of one generator went backwards: %d after %d", id, last)
				}
				last = id
			}
		}
	}
}

// A generator reserves again each time its clock passes the last
// reservation, fenced by the clock key's revision of its own last write:
// a run of reservations, each under the one before, never counts the slot
// as lost.
func TestAGeneratorReservesAgainAndAgain(t *testing.T) {
	cli := startEtcd(t)
	c := &clock{now: time.Now()}
	g := newGen(t, cli, 5, leaseSlot(t, cli, 5), c.Now)
	ctx := context.Background()
	var last int64
	for i := range 5 {
		id, err := g.Next(ctx)
		if err != nil {
			t.Fatalf("reservation %d: %v", i+1, err)
		}
		if id <= last {
			t.Fatalf("reservation %d: ID %d after %d", i+1, id, last)
		}
		last = id
		c.Add(1500 * time.Millisecond) // past the default 1 s reservation
	}
}

func TestClockRollback(t *testing.T) {
	cli := startEtcd(t)
	c := &clock{now: time.Now()}
	g := newGen(t, cli, 3, leaseSlot(t, cli, 3), c.Now)
	ctx := context.Background()
	first, err := g.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A small step back is waited out: move the clock forward from another
	// goroutine while Next waits, as time passing would.
	c.Add(-5 * time.Millisecond)
	go func() { time.Sleep(20 * time.Millisecond); c.Add(10 * time.Millisecond) }()
	second, err := g.Next(ctx)
	if err != nil || second <= first {
		t.Fatalf("after a 5ms step back: %d, %v (first %d)", second, err, first)
	}
	// A large one is refused, with the size of the step.
	c.Add(-time.Second)
	_, err = g.Next(ctx)
	var rb *ClockRollbackError
	if !errors.As(err, &rb) || rb.Back < 900*time.Millisecond {
		t.Fatalf("after a 1s step back: %v", err)
	}
}

// TestRestartAfterRollbackCannotRepeat: a generator restarted on the same
// slot with a clock behind what its predecessor reserved waits (or refuses)
// instead of repeating IDs.
func TestRestartAfterRollbackCannotRepeat(t *testing.T) {
	cli := startEtcd(t)
	tok := leaseSlot(t, cli, 4)
	c := &clock{now: time.Now()}
	g := newGen(t, cli, 4, tok, c.Now)
	issued := map[int64]bool{}
	for range 1000 {
		id, err := g.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		issued[id] = true
	}
	g.Close()
	c.Add(-5 * time.Second) // far behind the reservation: refused
	if _, err := NewSnowflake(context.Background(), cli, SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: 4, Token: tok, PodUID: "uid-p", Now: c.Now}); !errors.As(err, new(*ClockRollbackError)) {
		t.Fatalf("restart 5s behind: %v, want a ClockRollbackError", err)
	}
	c.Add(5 * time.Second) // back where it was, inside the reservation: waits it out
	go func() {
		for range 200 {
			time.Sleep(5 * time.Millisecond)
			c.Add(10 * time.Millisecond)
		}
	}()
	g2 := newGen(t, cli, 4, tok, c.Now)
	for range 1000 {
		id, err := g2.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if issued[id] {
			t.Fatalf("restarted generator repeated ID %d", id)
		}
	}
}

func TestSlotLossStopsIssuance(t *testing.T) {
	cli := startEtcd(t)
	g := newGen(t, cli, 5, leaseSlot(t, cli, 5), nil)
	if _, err := g.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(context.Background(), etcdkeys.SlotKey(etcdkeys.DefaultPrefix, "ns", "workers", 5)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := g.Next(context.Background())
		if errors.Is(err, ErrSlotLost) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still issuing IDs after the slot was lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := NewSnowflake(context.Background(), cli, SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: 5, Token: 1, PodUID: "uid-p"}); !errors.Is(err, ErrSlotLost) {
		t.Fatalf("a generator on a lost slot started: %v", err)
	}
}

func TestParseSlot(t *testing.T) {
	if s, tok, err := ParseSlot("slot=7,token=1234"); err != nil || s != 7 || tok != 1234 {
		t.Fatalf("%d %d %v", s, tok, err)
	}
	for _, bad := range []string{"", "slot=x", "block=1-2", "slot=-1,token=3", "slot=1,token=0", "slot=03,token=7", "slot=00,token=1", "slot=3,token=07"} {
		if _, _, err := ParseSlot(bad); err == nil {
			t.Errorf("ParseSlot(%q) accepted", bad)
		}
	}
}

// FuzzParseSlot: an annotation parses only if it is exactly the form the
// controller writes, so a parsed slot and token print back to the input.
func FuzzParseSlot(f *testing.F) {
	for _, seed := range []string{"slot=7,token=1234", "slot=0,token=1", "slot=7,token=12x", "slot=-1,token=5", "slot=1,token=0", " slot=1,token=2", "slot=1,,token=2", "", "slot=00,token=1"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		slot, tok, err := ParseSlot(s)
		if err != nil {
			return
		}
		if slot < 0 || tok <= 0 {
			t.Fatalf("ParseSlot(%q) = %d, %d: out of range", s, slot, tok)
		}
		if back := fmt.Sprintf("slot=%d,token=%d", slot, tok); back != s {
			t.Fatalf("ParseSlot(%q) = %d, %d, which prints as %q", s, slot, tok, back)
		}
	})
}

// A pod carrying a copy of another live pod's slot annotation (from
// `kubectl get pod -o yaml`, renamed and applied) must not run a second
// generator on that slot: the two would issue the same IDs.
func TestSnowflakeRefusesASlotLeasedToAnotherPod(t *testing.T) {
	cli := startEtcd(t)
	tok := leaseSlot(t, cli, 6) // leased to uid-p
	owner := newGen(t, cli, 6, tok, nil)
	_, err := NewSnowflake(context.Background(), cli, SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: 6, Token: tok, PodUID: "uid-copier"})
	if !errors.Is(err, ErrSlotOfAnotherPod) || !strings.Contains(err.Error(), "leased to pod p (uid uid-p), not to this pod (uid uid-copier)") {
		t.Fatalf("a copied slot annotation: got %v, want ErrSlotOfAnotherPod naming both pods", err)
	}
	if _, err := NewSnowflake(context.Background(), cli, SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: 6, Token: tok}); err == nil || !strings.Contains(err.Error(), "PodUID is required") {
		t.Fatalf("no PodUID: got %v, want a configuration error", err)
	}
	if _, err := owner.Next(context.Background()); err != nil {
		t.Fatalf("the owner: %v", err)
	}
	// A slot key rewritten to name another pod (same create revision)
	// stops the owner's reservations.
	if _, err := cli.Put(context.Background(), etcdkeys.SlotKey(etcdkeys.DefaultPrefix, "ns", "workers", 6), `{"pod":"q","podUID":"uid-q"}`, clientv3.WithIgnoreLease()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past the owner's 1 s reservation
	if _, err := owner.Next(context.Background()); !errors.Is(err, ErrSlotLost) {
		t.Fatalf("the owner reserved on a slot that names another pod: %v", err)
	}
}

// Two generators on one slot of one pod (two containers, or a tool run
// with kubectl exec, both passing the pod's own UID) never issue the same
// ID: the second waits out the first's reservation, and whichever reserves
// second stops with ErrSlotLost.
func TestTwoGeneratorsOnOneSlotNeverRepeat(t *testing.T) {
	cli := startEtcd(t)
	tok := leaseSlot(t, cli, 7)
	first := newGen(t, cli, 7, tok, nil)
	seen := map[int64]string{}
	issue := func(g *Snowflake, name string, until time.Time) error {
		for time.Now().Before(until) {
			id, err := g.Next(context.Background())
			if err != nil {
				return err
			}
			if other, dup := seen[id]; dup {
				t.Fatalf("ID %d issued by %s and %s", id, other, name)
			}
			seen[id] = name
		}
		return nil
	}
	if err := issue(first, "first", time.Now().Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	second := newGen(t, cli, 7, tok, nil) // waits out first's reservation
	errSecond := issue(second, "second", time.Now().Add(1500*time.Millisecond))
	errFirst := issue(first, "first", time.Now().Add(1500*time.Millisecond))
	if !errors.Is(errFirst, ErrSlotLost) && !errors.Is(errSecond, ErrSlotLost) {
		t.Fatalf("both generators kept issuing on one slot: first %v, second %v", errFirst, errSecond)
	}
}
