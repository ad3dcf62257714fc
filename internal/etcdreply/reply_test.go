package etcdreply

import (
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func rangeOf(kvs ...*mvccpb.KeyValue) *etcdserverpb.ResponseOp {
	return &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponseRange{ResponseRange: &etcdserverpb.RangeResponse{Kvs: kvs}}}
}

var put = &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponsePut{ResponsePut: &etcdserverpb.PutResponse{}}}

func TestRevision(t *testing.T) {
	if rev, err := Revision(&etcdserverpb.ResponseHeader{Revision: 9}); rev != 9 || err != nil {
		t.Fatalf("a header at revision 9: %d, %v", rev, err)
	}
	for name, h := range map[string]*etcdserverpb.ResponseHeader{"no header": nil, "revision 0": {}, "a negative revision": {Revision: -1}} {
		if _, err := Revision(h); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func TestSucceeded(t *testing.T) {
	h := &etcdserverpb.ResponseHeader{Revision: 9}
	nested := func(ok bool) *etcdserverpb.ResponseOp {
		return &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponseTxn{ResponseTxn: &etcdserverpb.TxnResponse{Succeeded: ok}}}
	}
	resp := &clientv3.TxnResponse{Header: h, Responses: []*etcdserverpb.ResponseOp{nested(true), nested(false), put}}
	for i, want := range []bool{true, false} {
		if ok, err := Succeeded(resp, i); ok != want || err != nil {
			t.Errorf("nested transaction %d: %t, %v; want %t", i, ok, err, want)
		}
	}
	if _, err := Succeeded(resp, 2); !errors.Is(err, ErrMalformed) {
		t.Errorf("a put where a transaction was asked: %v, want ErrMalformed", err)
	}
}

func TestTxnAndRange(t *testing.T) {
	h := &etcdserverpb.ResponseHeader{Revision: 9}
	kv := &mvccpb.KeyValue{Key: []byte("k"), CreateRevision: 3}
	whole := &clientv3.TxnResponse{Header: h, Responses: []*etcdserverpb.ResponseOp{put, rangeOf(kv)}}
	if err := Txn(whole, 2); err != nil {
		t.Fatalf("a whole answer: %v", err)
	}
	if kvs, err := Range(whole, 1); err != nil || len(kvs) != 1 || kvs[0] != kv {
		t.Fatalf("its range read: %v, %v", kvs, err)
	}
	if kvs, err := Range(&clientv3.TxnResponse{Header: h, Responses: []*etcdserverpb.ResponseOp{rangeOf()}}, 0); err != nil || len(kvs) != 0 {
		t.Fatalf("a range read that found nothing: %v, %v", kvs, err)
	}
	for name, c := range map[string]struct {
		resp *clientv3.TxnResponse
		n    int
	}{
		"no header":           {&clientv3.TxnResponse{Responses: whole.Responses}, 2},
		"a response short":    {&clientv3.TxnResponse{Header: h, Responses: whole.Responses[:1]}, 2},
		"a response too many": {&clientv3.TxnResponse{Header: h, Responses: whole.Responses}, 1},
	} {
		if err := Txn(c.resp, c.n); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := Range(whole, 0); !errors.Is(err, ErrMalformed) {
		t.Errorf("a put where a read was asked: %v, want ErrMalformed", err)
	}
	if _, err := Range(&clientv3.TxnResponse{Header: h, Responses: []*etcdserverpb.ResponseOp{nil}}, 0); !errors.Is(err, ErrMalformed) {
		t.Errorf("a nil response: %v, want ErrMalformed", err)
	}
}

func TestReads(t *testing.T) {
	h := &etcdserverpb.ResponseHeader{Revision: 9}
	kv := &mvccpb.KeyValue{Key: []byte("k")}
	resp := &clientv3.TxnResponse{Header: h, Responses: []*etcdserverpb.ResponseOp{put, rangeOf(kv), rangeOf()}}
	reads, err := Reads(resp, 3, 1)
	if err != nil || len(reads) != 2 || len(reads[0]) != 1 || reads[0][0] != kv || len(reads[1]) != 0 {
		t.Fatalf("the two reads after a put: %v, %v", reads, err)
	}
	if _, err := Reads(resp, 3, 0); !errors.Is(err, ErrMalformed) {
		t.Errorf("a put taken for a read: %v, want ErrMalformed", err)
	}
	if _, err := Reads(resp, 2, 1); !errors.Is(err, ErrMalformed) {
		t.Errorf("a response too many: %v, want ErrMalformed", err)
	}
}

func TestDeleted(t *testing.T) {
	h := &etcdserverpb.ResponseHeader{Revision: 9}
	del := &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: &etcdserverpb.DeleteRangeResponse{Deleted: 1}}}
	if ok, err := Deleted(&clientv3.TxnResponse{Header: h, Succeeded: true, Responses: []*etcdserverpb.ResponseOp{del}}); !ok || err != nil {
		t.Fatalf("a delete that ran: %v, %v", ok, err)
	}
	if ok, err := Deleted(&clientv3.TxnResponse{Header: h}); ok || err != nil {
		t.Fatalf("a comparison that failed: %v, %v", ok, err)
	}
	for name, resp := range map[string]*clientv3.TxnResponse{
		"no header":             {Succeeded: true, Responses: []*etcdserverpb.ResponseOp{del}},
		"a put for the delete":  {Header: h, Succeeded: true, Responses: []*etcdserverpb.ResponseOp{put}},
		"no response for it":    {Header: h, Succeeded: true},
		"a response to nothing": {Header: h, Responses: []*etcdserverpb.ResponseOp{del}},
	} {
		if _, err := Deleted(resp); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}
