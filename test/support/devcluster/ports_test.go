package devcluster

import (
	"net"
	"strconv"
	"testing"
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
