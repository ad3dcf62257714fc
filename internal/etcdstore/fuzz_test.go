package etcdstore

import (
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"strings"
	"testing"
)

// FuzzParseLeaseKey: any key either parses into a namespace and name that
// rebuild exactly the same key, or is refused; it never panics.
func FuzzParseLeaseKey(f *testing.F) {
	for _, seed := range []string{"/fencer/leases/ns/a", "/fencer/leases/ns/a/b", "/fencer/leases//a", "/fencer/leases/ns/", "/other/x", "", "/fencer/leases/"} {
		f.Add("/fencer", seed)
	}
	f.Fuzz(func(t *testing.T, prefix, key string) {
		ns, name, ok := ParseLeaseKey(prefix, key)
		if !ok {
			return
		}
		if ns == "" || name == "" || strings.Contains(ns, "/") || strings.Contains(name, "/") {
			t.Fatalf("ParseLeaseKey(%q, %q) = %q, %q: parts must be non-empty and slash-free", prefix, key, ns, name)
		}
		if got := etcdkeys.LeaseKey(prefix, ns, name); got != key {
			t.Fatalf("ParseLeaseKey(%q, %q) = %q, %q, which rebuilds %q", prefix, key, ns, name, got)
		}
	})
}

// FuzzDecodeGrant: whatever bytes sit under a lease key, decoding returns a
// grant or an error naming the key, and never panics.
func FuzzDecodeGrant(f *testing.F) {
	f.Add([]byte(`{"holder":"p","holderUID":"u","leaseID":7,"grantTime":"2026-01-01T00:00:00Z","ttlSeconds":15}`))
	f.Add([]byte(`{"holder":`))
	f.Add([]byte(`null`))
	f.Add([]byte{0xff, 0x00})
	f.Fuzz(func(t *testing.T, value []byte) {
		g, err := decodeGrant([]byte("/fencer/leases/ns/l"), value, 42, 7)
		if err != nil {
			if !strings.Contains(err.Error(), "/fencer/leases/ns/l") {
				t.Fatalf("error does not name the key: %v", err)
			}
			return
		}
		if g.Token != 42 || g.LeaseID != 7 {
			t.Fatalf("token/lease from the key's metadata were lost: %+v", g)
		}
	})
}

func TestParseSlotKey(t *testing.T) {
	ns, name, n, ok := etcdkeys.ParseSlotKey("/fencer", etcdkeys.SlotKey("/fencer", "ns", "workers", 7))
	if !ok || ns != "ns" || name != "workers" || n != 7 {
		t.Fatalf("round trip: %q %q %d %v", ns, name, n, ok)
	}
	for _, bad := range []string{"/fencer/idranges/ns/workers/slots/7/clock", "/fencer/idranges/ns/workers/next", "/fencer/leases/ns/a", "/other/idranges/ns/w/slots/1", "/fencer/idranges/ns/w/slots/x"} {
		if _, _, _, ok := etcdkeys.ParseSlotKey("/fencer", bad); ok {
			t.Errorf("etcdkeys.ParseSlotKey(%q) accepted", bad)
		}
	}
}

// FuzzParseSlotKey: a key parses only into parts that rebuild it exactly.
func FuzzParseSlotKey(f *testing.F) {
	for _, seed := range []string{"/fencer/idranges/ns/r/slots/3", "/fencer/idranges/ns/r/slots/3/clock", "/fencer/idranges/ns/r/next", "/fencer/idranges//r/slots/1", "/fencer/idranges/ns/r/slots/-1", "/fencer/idranges/ns/r/slots/+1"} {
		f.Add("/fencer", seed)
	}
	f.Fuzz(func(t *testing.T, prefix, key string) {
		ns, name, n, ok := etcdkeys.ParseSlotKey(prefix, key)
		if !ok {
			return
		}
		if got := etcdkeys.SlotKey(prefix, ns, name, n); got != key {
			t.Fatalf("etcdkeys.ParseSlotKey(%q, %q) = %q, %q, %d, which rebuilds %q", prefix, key, ns, name, n, got)
		}
	})
}
