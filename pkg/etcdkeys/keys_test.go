package etcdkeys

import (
	"errors"
	"strings"
	"testing"
)

func TestLayout(t *testing.T) {
	for got, want := range map[string]string{
		LeaseKey(DefaultPrefix, "ns", "report"):        "/fencer/leases/ns/report",
		LeasesPrefix("/p"):                             "/p/leases/",
		IDRangeNextKey("/p", "ns", "ids"):              "/p/idranges/ns/ids/next",
		SlotKey("/p", "ns", "ids", 7):                  "/p/idranges/ns/ids/slots/7",
		IDRangeConsumedKey("/p", "ns", "ids", 1000):    "/p/idranges/ns/ids/consumed/1000",
		LeaderKey("/p"):                                "/p/controller/leader",
		DeletedLeaseKey("/p", "ns", "report", "u-1"):   "/p/deleted/ns/report/u-1",
		LeaseKey(OrDefault(""), "ns", "report"):        "/fencer/leases/ns/report",
		LeaseKey(OrDefault("/custom"), "ns", "report"): "/custom/leases/ns/report",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	ns, name, n, ok := ParseSlotKey("/p", SlotKey("/p", "ns", "ids", 7))
	if !ok || ns != "ns" || name != "ids" || n != 7 {
		t.Errorf("ParseSlotKey round trip: %s %s %d %v", ns, name, n, ok)
	}
}

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
		if got := LeaseKey(prefix, ns, name); got != key {
			t.Fatalf("ParseLeaseKey(%q, %q) = %q, %q, which rebuilds %q", prefix, key, ns, name, got)
		}
	})
}

// FuzzParseDeletedLeaseKey: any key either parses into a namespace, name
// and UID that rebuild exactly the same key, or is refused; it never panics.
func FuzzParseDeletedLeaseKey(f *testing.F) {
	for _, seed := range []string{"/fencer/deleted/ns/a/u", "/fencer/deleted/ns/a", "/fencer/deleted/ns/a/u/x", "/fencer/deleted//a/u", "/fencer/deleted/ns/a/", ""} {
		f.Add("/fencer", seed)
	}
	f.Fuzz(func(t *testing.T, prefix, key string) {
		ns, name, uid, ok := ParseDeletedLeaseKey(prefix, key)
		if !ok {
			return
		}
		if ns == "" || name == "" || uid == "" || strings.ContainsRune(ns+name+uid, '/') {
			t.Fatalf("ParseDeletedLeaseKey(%q, %q) = %q, %q, %q: parts must be non-empty and slash-free", prefix, key, ns, name, uid)
		}
		if got := DeletedLeaseKey(prefix, ns, name, uid); got != key {
			t.Fatalf("ParseDeletedLeaseKey(%q, %q) = %q, %q, %q, which rebuilds %q", prefix, key, ns, name, uid, got)
		}
	})
}

func TestParseSlotKey(t *testing.T) {
	ns, name, n, ok := ParseSlotKey("/fencer", SlotKey("/fencer", "ns", "workers", 7))
	if !ok || ns != "ns" || name != "workers" || n != 7 {
		t.Fatalf("round trip: %q %q %d %v", ns, name, n, ok)
	}
	for _, bad := range []string{"/fencer/idranges/ns/workers/slots/7/clock", "/fencer/idranges/ns/workers/next", "/fencer/leases/ns/a", "/other/idranges/ns/w/slots/1", "/fencer/idranges/ns/w/slots/x"} {
		if _, _, _, ok := ParseSlotKey("/fencer", bad); ok {
			t.Errorf("ParseSlotKey(%q) accepted", bad)
		}
	}
}

// FuzzParseSlotKey: a key parses only into parts that rebuild it exactly.
func FuzzParseSlotKey(f *testing.F) {
	for _, seed := range []string{"/fencer/idranges/ns/r/slots/3", "/fencer/idranges/ns/r/slots/3/clock", "/fencer/idranges/ns/r/next", "/fencer/idranges//r/slots/1", "/fencer/idranges/ns/r/slots/-1", "/fencer/idranges/ns/r/slots/+1"} {
		f.Add("/fencer", seed)
	}
	f.Fuzz(func(t *testing.T, prefix, key string) {
		ns, name, n, ok := ParseSlotKey(prefix, key)
		if !ok {
			return
		}
		if got := SlotKey(prefix, ns, name, n); got != key {
			t.Fatalf("ParseSlotKey(%q, %q) = %q, %q, %d, which rebuilds %q", prefix, key, ns, name, n, got)
		}
	})
}

func TestLockKeysRoundTrip(t *testing.T) {
	for _, key := range []string{"dir/42", "a", "a/b/c", "%2F", "ünï cödé", "x y?z#"} {
		k := LockWaiterKey("/fencer", "ns", key, "1a2b-7")
		ns, got, waiter, ok := ParseLockWaiterKey("/fencer", k)
		if !ok || ns != "ns" || got != key || waiter != "1a2b-7" {
			t.Errorf("%q: %s parsed as %q %q %q %v", key, k, ns, got, waiter, ok)
		}
	}
	// A key and its extension never share a waiter prefix.
	if strings.HasPrefix(LockPrefix("/fencer", "ns", "a/b"), LockPrefix("/fencer", "ns", "a")) {
		t.Error(`"a/b" is below "a"`)
	}
}

// A session's marker key is in the namespace's locks prefix (the only
// range its identity may write) and is no waiter key.
func TestLockSessionKeyIsNoWaiter(t *testing.T) {
	k := LockSessionKey("/fencer", "ns", 0x1a2b)
	if !strings.HasPrefix(k, NamespaceLocksPrefix("/fencer", "ns")) {
		t.Errorf("%s is outside the namespace's locks", k)
	}
	if ns, key, waiter, ok := ParseLockWaiterKey("/fencer", k); ok {
		t.Errorf("%s parsed as waiter %q of lock %q in %q", k, waiter, key, ns)
	}
}

func TestValidLockKey(t *testing.T) {
	for key, want := range map[string]string{
		"":                                   "empty",
		strings.Repeat("k", MaxLockKeyLen+1): "over the limit",
		"\xff":                               "UTF-8",
		"a\x00b":                             "control character",
		"a\nb":                               "control character",
	} {
		err := ValidLockKey(key)
		if !errors.Is(err, ErrBadLockKey) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an ErrBadLockKey saying %q", key, err, want)
		}
	}
	if err := ValidLockKey(strings.Repeat("k", MaxLockKeyLen)); err != nil {
		t.Errorf("a key of the maximum length: %v", err)
	}
}

// Any string either is refused or round-trips through its etcd key.
func FuzzLockKey(f *testing.F) {
	for _, s := range []string{"dir/42", "", "%zz", "a/b", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if ValidLockKey(key) != nil {
			return
		}
		ns, got, _, ok := ParseLockWaiterKey("/p", LockWaiterKey("/p", "ns", key, "w"))
		if !ok || ns != "ns" || got != key {
			t.Fatalf("%q did not round-trip: %q %q %v", key, ns, got, ok)
		}
		// No lock's queue holds a session's marker key.
		if marker := LockSessionKey("/p", "ns", 0x7f); strings.HasPrefix(marker, LockPrefix("/p", "ns", key)) {
			t.Fatalf("the session marker %s is in the queue of %q", marker, key)
		}
	})
}

// CheckPrefix takes what --etcd-prefix takes, and refuses the rest with
// ErrBadPrefix: the SDK's prefix arguments are checked with it.
func TestCheckPrefix(t *testing.T) {
	for _, ok := range []string{DefaultPrefix, "/a", "/team-a/fencer"} {
		if err := CheckPrefix(ok); err != nil {
			t.Errorf("CheckPrefix(%q): %v", ok, err)
		}
	}
	for bad, want := range map[string]string{"": "must start with '/'", "fencer": "must start with '/'", "/fencer/": "not end with '/'", "/": "not end with '/'", "/a:b": "must not contain ':'"} {
		if err := CheckPrefix(bad); !errors.Is(err, ErrBadPrefix) || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckPrefix(%q): %v, want an ErrBadPrefix saying %q", bad, err, want)
		}
	}
}
