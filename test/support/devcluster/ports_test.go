package devcluster

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestFreePortsAreOutsideTheEphemeralRange(t *testing.T) {
	lo, err := ephemeralStart()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := FreePorts(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < portsFrom || p >= lo {
			t.Errorf("port %d outside [%d, %d): a socket numbered by the kernel could take it", p, portsFrom, lo)
		}
		if seen[p] {
			t.Errorf("port %d given twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		l.Close()
	}
}

// Two choosers over the same range, as two test processes are, never hand
// out the same port, though each lets go of its listeners before the port
// is used.
func TestReservedPortsAreNotChosenAgain(t *testing.T) {
	lo, err := ephemeralStart()
	if err != nil {
		t.Fatal(err)
	}
	// Ten ports near the top of the range, where nothing else here listens.
	r := reservations{dir: t.TempDir(), from: lo - 10, to: lo}
	first, err := r.choose(5)
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.choose(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range append(first, second...) {
		if seen[p] {
			t.Errorf("port %d chosen twice: first %v, then %v", p, first, second)
		}
		seen[p] = true
	}
	if got, err := r.choose(1); err == nil {
		t.Errorf("all ten ports are reserved, yet %v was chosen", got)
	} else if !strings.Contains(err.Error(), "stay reserved") {
		t.Errorf("the error does not say why no port was left: %v", err)
	}
}

// A reservation older than reserveFor is from a run long over.
func TestAnOldReservationLapses(t *testing.T) {
	lo, err := ephemeralStart()
	if err != nil {
		t.Fatal(err)
	}
	r := reservations{dir: t.TempDir(), from: lo - 1, to: lo}
	if _, err := r.choose(1); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-reserveFor - time.Minute)
	if err := os.Chtimes(r.path(lo-1), old, old); err != nil {
		t.Fatal(err)
	}
	if got, err := r.choose(1); err != nil || got[0] != lo-1 {
		t.Errorf("choose = %v, %v; want the lapsed port %d", got, err, lo-1)
	}
}
