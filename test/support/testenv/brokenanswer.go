package testenv

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// The gRPC methods of etcd whose answers BrokenAnswers breaks.
const (
	KVRange    = "/etcdserverpb.KV/Range"
	KVTxn      = "/etcdserverpb.KV/Txn"
	LeaseGrant = "/etcdserverpb.Lease/LeaseGrant"
)

// BrokenAnswers breaks etcd's answer to the next call of one method, after
// etcd has served it: what a faulty proxy between a client and etcd could
// hand back. Tests use it to show that such an answer is an error, never a
// panic, and never read as a fact. Install it with DialOption.
type BrokenAnswers struct {
	mu     sync.Mutex
	method string
	breaks func(reply any)
}

// Next breaks the answer to the next call of method with breaks.
func (b *BrokenAnswers) Next(method string, breaks func(reply any)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.method, b.breaks = method, breaks
}

// DialOption installs b in a client's connection (clientv3.Config.DialOptions).
func (b *BrokenAnswers) DialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(b.intercept)
}

func (b *BrokenAnswers) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	b.mu.Lock()
	breaks := b.breaks
	if err != nil || method != b.method || breaks == nil {
		breaks = nil
	} else {
		b.breaks = nil
	}
	b.mu.Unlock()
	if breaks != nil {
		breaks(reply)
	}
	return err
}

// NoHeader drops the header of a range, transaction or lease grant answer.
func NoHeader(reply any) { setHeader(reply, nil) }

// EmptyHeader gives a range, transaction or lease grant answer a header
// with no revision (0) and no cluster ID.
func EmptyHeader(reply any) { setHeader(reply, &etcdserverpb.ResponseHeader{}) }

func setHeader(reply any, h *etcdserverpb.ResponseHeader) {
	switch r := reply.(type) {
	case *etcdserverpb.RangeResponse:
		r.Header = h
	case *etcdserverpb.TxnResponse:
		r.Header = h
	case *etcdserverpb.LeaseGrantResponse:
		r.Header = h
	}
}

// NoResponses drops every response of a transaction's answer, keeping its
// header and whether it succeeded.
func NoResponses(reply any) {
	if r, ok := reply.(*etcdserverpb.TxnResponse); ok {
		r.Responses = nil
	}
}

// PutsForReads answers every operation of a transaction with a put's
// response: the right count, the wrong kind.
func PutsForReads(reply any) {
	if r, ok := reply.(*etcdserverpb.TxnResponse); ok {
		for i := range r.Responses {
			r.Responses[i] = &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponsePut{ResponsePut: &etcdserverpb.PutResponse{Header: r.Header}}}
		}
	}
}

// BrokenClient connects to the etcd at endpoint through a BrokenAnswers,
// which the test arms with Next; it is closed when the test ends.
func BrokenClient(t testing.TB, endpoint string) (*clientv3.Client, *BrokenAnswers) {
	t.Helper()
	b := &BrokenAnswers{}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{b.DialOption()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, b
}
