package etcdkeys

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLockKeyLen bounds a keyed lock's key, in bytes before escaping: etcd
// keys stay short, and a key that long is a hash's or an ID's job.
const MaxLockKeyLen = 256

// ErrBadLockKey is wrapped by every error ValidLockKey returns.
var ErrBadLockKey = errors.New("invalid lock key")

// ValidLockKey checks a keyed lock's key: 1 to MaxLockKeyLen bytes of UTF-8
// without control characters. Any other character is allowed, "/"
// included: it is escaped into one etcd key segment (LockPrefix).
func ValidLockKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: the key is empty; name the entity to lock, e.g. \"dir/42\"", ErrBadLockKey)
	case len(key) > MaxLockKeyLen:
		return fmt.Errorf("%w: the key is %d bytes, over the limit of %d; lock a shorter name for the entity, such as its ID or a hash of its path", ErrBadLockKey, len(key), MaxLockKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: the key %q is not valid UTF-8", ErrBadLockKey, key)
	}
	if i := strings.IndexFunc(key, unicode.IsControl); i >= 0 {
		return fmt.Errorf("%w: the key %q has a control character at byte %d", ErrBadLockKey, key, i)
	}
	return nil
}

// LocksPrefix is the prefix of every keyed lock of the install.
func LocksPrefix(prefix string) string { return join(prefix, "locks") + "/" }

// NamespaceLocksPrefix is the prefix of one namespace's keyed locks: the
// range its etcd identity may read and write.
func NamespaceLocksPrefix(prefix, namespace string) string {
	return join(prefix, "locks", namespace) + "/"
}

// LockPrefix is the prefix of one lock's waiter keys: one key per
// acquisition, queued by CreateRevision; the oldest holds the lock. key is
// escaped into a single segment, so "a/b" and "a" never share a prefix.
func LockPrefix(prefix, namespace, key string) string {
	return NamespaceLocksPrefix(prefix, namespace) + url.PathEscape(key) + "/"
}

// LockWaiterKey is the key of one acquisition of a lock: waiter is unique
// to it (the session's etcd lease and a counter), never reused.
func LockWaiterKey(prefix, namespace, key, waiter string) string {
	return LockPrefix(prefix, namespace, key) + waiter
}

// LockSessionKey is the marker key a Locker puts on its session's etcd
// lease as soon as etcd grants it, under the namespace's own locks prefix.
// etcd lets a user revoke a lease, attach a key to it, or list it with
// every other lease, only when that user may write (list: read) every key
// attached to it; the marker makes that true of the namespace's identity
// alone. Its lock-key segment, "%00session", unescapes to a control
// character, which no valid lock key holds, so it lies outside every
// lock's queue and ParseLockWaiterKey refuses it.
func LockSessionKey(prefix, namespace string, lease int64) string {
	return NamespaceLocksPrefix(prefix, namespace) + "%00session/" + strconv.FormatInt(lease, 16)
}

// ParseLockWaiterKey splits a key below LocksPrefix into its namespace,
// lock key (unescaped) and waiter. A session's marker key
// (LockSessionKey) is no waiter key.
func ParseLockWaiterKey(prefix, etcdKey string) (namespace, key, waiter string, ok bool) {
	rest, ok := strings.CutPrefix(etcdKey, LocksPrefix(prefix))
	if !ok {
		return "", "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[0] == "" || parts[2] == "" {
		return "", "", "", false
	}
	key, err := url.PathUnescape(parts[1])
	if err != nil || ValidLockKey(key) != nil {
		return "", "", "", false
	}
	return parts[0], key, parts[2], true
}

// LockFloorKey closes keyed locks and Lease grants while it exists: the manager writes it,
// holding the decimal revision etcd must pass, when it finds etcd's
// revision below one it already saw (etcd restored from an old snapshot
// without --bump-revision), and deletes it once etcd's revision has passed
// that. No lock is queued and no Lease granted while it exists. Namespace identities may read
// it, not write it.
func LockFloorKey(prefix string) string { return join(prefix, "lockfloor") }
