package fence

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/etcdlease"
)

// A Locker's session lease is closed to every other namespace. etcd lets a
// user revoke a lease, attach a key to it, or list it among all leases,
// when that user may write (to list: read) every key attached to it. An
// idle session carries no waiter key, so without more any identity could
// do all three; attaching a key of its own would have every later Lock of
// the namespace refused (a put attached to a lease needs the right to
// write every key of that lease). Two things close it:
//
//   - the session's marker key (etcdkeys.LockSessionKey), put on the lease
//     right after the grant under the namespace's own locks prefix, which
//     no other namespace may read or write; and
//   - a lease ID drawn at random (63 bits), not etcd's sequential one, so
//     that in the moment between the grant and the marker another
//     namespace cannot count down from a lease of its own to find it.

// sessionMarker is the value of a session's marker key: whose it is, for
// an operator reading etcd.
type sessionMarker struct {
	Pod    string `json:"pod,omitempty"`
	PodUID string `json:"podUID,omitempty"`
}

// sessionGrantTries bounds the grants whose marker etcd refused.
const sessionGrantTries = 3

// errNoConnection: the client has neither a gRPC connection nor a lease
// API, as a zero clientv3.Client.
var errNoConnection = errors.New("fence: the etcd client is not connected; make it with clientv3.New (LoadEtcdAccess gives its configuration)")

// grantSession grants an etcd lease of ttl seconds under a random ID
// (etcdlease.Grant). A client without a gRPC connection of its own
// (clientv3.NewCtxClient, as an embedded etcd's in-process client is)
// cannot ask for an ID, so etcd picks one: the marker key still closes the
// session once it is on; until then the ID can be guessed.
// docs/guarantees.md says so.
func grantSession(ctx context.Context, cli *clientv3.Client, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	if cli.ActiveConnection() == nil && (cli.Lease == nil || cli.KV == nil || cli.Watcher == nil) {
		return nil, errNoConnection
	}
	return etcdlease.Grant(ctx, cli, ttl)
}

// sessionUnusable says whether etcd refused a put attached to a session
// lease for good: the lease is gone (revoked, or expired before its
// keepalive noticed), or the put is not permitted, which is also what
// etcd answers once the lease carries a key this identity may not write.
// Either way the session is given up (it is not revoked: a lease with
// another's key on it cannot be), and the next Lock grants a new one.
func sessionUnusable(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrPermissionDenied)
}
