// Package etcdlease grants etcd leases that no other etcd user can find.
//
// etcd lets any user revoke a lease, or attach a key of its own to it,
// while every key on the lease is one that user may write, and asks no
// permission at all to look up the remaining time of a lease with no keys.
// A lease granted with etcd's own ID is the next of a sequence: in the
// moment between its grant and the write that puts a key on it, another
// namespace's identity can count up from a lease of its own, find it, and
// revoke it (the write then fails) or attach its own key (the lease's
// holder can then never renew it). A lease ID drawn at random, 63 bits,
// cannot be found that way.
package etcdlease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// grantTries bounds the draws when etcd already has a lease of the ID
// drawn: about one chance in 2^63 each, or a retried grant that did apply.
const grantTries = 3

// ErrNoConnection: the client has neither a gRPC connection nor a lease
// API, as a zero clientv3.Client.
var ErrNoConnection = errors.New("the etcd client is not connected; make it with clientv3.New")

// Grant grants an etcd lease of ttl seconds under a random ID. It waits
// for a connection and retries an etcd that is unavailable (no leader) as
// clientv3's own Grant does, until ctx ends. A client with no gRPC
// connection of its own (clientv3.NewCtxClient, an embedded etcd's
// in-process client) cannot ask for an ID: etcd then picks one.
func Grant(ctx context.Context, cli *clientv3.Client, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	conn := cli.ActiveConnection()
	if conn == nil {
		if cli.Lease == nil {
			return nil, ErrNoConnection
		}
		return checked(cli.Grant(ctx, ttl))
	}
	// RetryLeaseClient retries a grant etcd answered Unavailable through
	// the retry interceptor clientv3.New put on conn. A retry of a grant
	// that did apply is refused as ErrLeaseExist and draws again; the
	// first lease, with no key on it, expires with its TTL.
	leases := clientv3.RetryLeaseClient(cli)
	var err error
	for range grantTries {
		var resp *pb.LeaseGrantResponse
		resp, err = leases.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: ttl, ID: randomID()}, grpc.WaitForReady(true))
		if err = rpctypes.Error(err); err == nil {
			return checked(&clientv3.LeaseGrantResponse{ResponseHeader: resp.Header, ID: clientv3.LeaseID(resp.ID), TTL: resp.TTL, Error: resp.Error}, nil)
		}
		if !errors.Is(err, rpctypes.ErrLeaseExist) {
			return nil, err
		}
	}
	return nil, err
}

// checked turns etcd's error inside a grant's answer into an error.
func checked(resp *clientv3.LeaseGrantResponse, err error) (*clientv3.LeaseGrantResponse, error) {
	if err != nil {
		return nil, err
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("etcd refused the lease: %s", resp.Error)
	}
	return resp, nil
}

// randomID is a lease ID above zero (zero asks etcd to pick one).
// math/rand/v2's global source is ChaCha8, seeded by the runtime from the
// operating system: no other process can predict it.
func randomID() int64 { return rand.Int64N(1<<63-1) + 1 }
