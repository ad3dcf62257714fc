package fence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Locker's session lease has an ID the Locker draws at random, not one
// etcd picks. etcd's own IDs count up, and etcd lets any user attach a key
// to, or revoke, a lease that carries no key that user may not write: an
// idle session carries none. Another namespace's identity could count down
// from a lease of its own to find it, then revoke it or attach a key of
// its own to it, after which every Lock of this namespace would be refused
// (etcd requires the right to write every key of a lease a put attaches
// to). A random 63-bit ID cannot be counted to. etcd lists leases only to
// a user who may read every key attached to any of them: while a manager
// leads, its election key rules that out. With no leader and no other
// keys live, the list is open: a marker key of the namespace's own on the
// session would close that gap (not done yet; docs/guarantees.md says so).

// sessionGrantTries bounds the draws when etcd already has a lease of the
// ID drawn (about one chance in 2^63 each).
const sessionGrantTries = 3

// grantSession grants an etcd lease of ttl seconds under a random ID.
func grantSession(ctx context.Context, cli *clientv3.Client, ttl int64) (*pb.LeaseGrantResponse, error) {
	leases := pb.NewLeaseClient(cli.ActiveConnection())
	var err error
	for range sessionGrantTries {
		var resp *pb.LeaseGrantResponse
		resp, err = leases.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: ttl, ID: randomLeaseID()})
		if err = rpctypes.Error(err); err == nil {
			if resp.Error != "" {
				return nil, fmt.Errorf("etcd refused the session lease: %s", resp.Error)
			}
			return resp, nil
		}
		if !errors.Is(err, rpctypes.ErrLeaseExist) {
			return nil, err
		}
	}
	return nil, err
}

// randomLeaseID is a lease ID above zero (zero asks etcd to pick one).
// math/rand/v2's global source is ChaCha8, seeded by the runtime from the
// operating system: no other process can predict it.
func randomLeaseID() int64 { return rand.Int64N(1<<63-1) + 1 }

// sessionUnusable says whether etcd refused a put attached to a session
// lease for good: the lease is gone (revoked, or expired before its
// keepalive noticed), or the put is not permitted, which is also what
// etcd answers once the lease carries a key this identity may not write.
// Either way the session is given up (it is not revoked: a lease with
// another's key on it cannot be), and the next Lock grants a new one.
func sessionUnusable(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrPermissionDenied)
}
