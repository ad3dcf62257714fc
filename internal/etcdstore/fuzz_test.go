package etcdstore

import (
	"strings"
	"testing"
)

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
