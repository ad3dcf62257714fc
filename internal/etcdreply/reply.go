// Package etcdreply checks that an answer from etcd has the shape of the
// request it answers before anything reads it: a header, one response per
// operation of the branch that ran, and each response of its operation's
// kind.
//
// etcd always answers so. A broken answer (a faulty proxy between client
// and server, a server bug) would otherwise be a nil dereference or an
// index out of range, which ends the process: the manager, or a user's
// process running the SDK. With these checks it is an error wrapping
// ErrMalformed, which the caller handles as it handles etcd being away:
// it refuses, retries, or gives the lock up, and never reads a guess.
package etcdreply

import (
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrMalformed is the cause of every error this package returns.
var ErrMalformed = errors.New("etcd's answer does not match its request")

// Revision is the revision in an answer's header: an error if the answer
// has no header, or one without a revision. etcd's revisions start at 1,
// so a 0 is no revision: read as one it would be a token of 0, or a
// revision gone back, or a watch from the start of history.
func Revision(h *etcdserverpb.ResponseHeader) (int64, error) {
	if h == nil {
		return 0, fmt.Errorf("%w: it has no header", ErrMalformed)
	}
	if h.Revision <= 0 {
		return 0, fmt.Errorf("%w: its header has revision %d", ErrMalformed, h.Revision)
	}
	return h.Revision, nil
}

// Txn checks that resp, the answer to a transaction whose branch that ran
// has n operations, has a header with a revision (Revision) and n
// responses.
func Txn(resp *clientv3.TxnResponse, n int) error {
	if _, err := Revision(resp.Header); err != nil {
		return err
	}
	if len(resp.Responses) != n {
		return fmt.Errorf("%w: a transaction of %d operations was answered with %d responses",
			ErrMalformed, n, len(resp.Responses))
	}
	return nil
}

// Range is the KeyValues of the range read answered at response i of
// resp, which Txn has checked: an error if that response is not a range
// read's.
func Range(resp *clientv3.TxnResponse, i int) ([]*mvccpb.KeyValue, error) {
	r := resp.Responses[i].GetResponseRange()
	if r == nil {
		return nil, fmt.Errorf("%w: operation %d, a range read, was answered with another kind of response", ErrMalformed, i)
	}
	return r.Kvs, nil
}

// Reads checks resp, the answer to a transaction whose branch that ran has
// n operations, the last n-from of them range reads (Txn and Range), and
// returns those reads' KeyValues, in order.
func Reads(resp *clientv3.TxnResponse, n, from int) ([][]*mvccpb.KeyValue, error) {
	if err := Txn(resp, n); err != nil {
		return nil, err
	}
	reads := make([][]*mvccpb.KeyValue, 0, n-from)
	for i := from; i < n; i++ {
		kvs, err := Range(resp, i)
		if err != nil {
			return nil, err
		}
		reads = append(reads, kvs)
	}
	return reads, nil
}

// Succeeded is whether the nested transaction answered at response i of
// resp, which Txn has checked, succeeded: an error if that response is not
// a transaction's.
func Succeeded(resp *clientv3.TxnResponse, i int) (bool, error) {
	r := resp.Responses[i].GetResponseTxn()
	if r == nil {
		return false, fmt.Errorf("%w: operation %d, a transaction, was answered with another kind of response", ErrMalformed, i)
	}
	return r.Succeeded, nil
}

// Deleted is whether the transaction resp, of one comparison and one
// delete, ran its delete: an error if its answer does not match that
// question (no header, or a response count or kind its outcome does not
// call for).
func Deleted(resp *clientv3.TxnResponse) (bool, error) {
	n := 0
	if resp.Succeeded {
		n = 1
	}
	if err := Txn(resp, n); err != nil {
		return false, err
	}
	if n == 1 && resp.Responses[0].GetResponseDeleteRange() == nil {
		return false, fmt.Errorf("%w: operation 0, a delete, was answered with another kind of response", ErrMalformed)
	}
	return resp.Succeeded, nil
}
