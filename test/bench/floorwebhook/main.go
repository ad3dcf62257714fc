// Command floorwebhook is the cheapest mutating webhook that does what
// fencer's does to a write: it reads the AdmissionReview, then allows it,
// either unchanged (/allow) or with fencer's patch shape (/patch: the
// offered annotation bench.fencer.io/token removed, and recorded as
// bench.fencer.io/written-token when that differs). It makes no decision
// and reads nothing else, so the apiserver's time in it is the floor any
// mutating webhook pays: the bench (TestAdmissionEndToEnd) sets fencer's
// fenced write beside it.
//
// It is as lean as fencer's own review path, so that the floor is no
// slower than fencer for reasons fencer has already removed: it decodes
// with JSON v2 (the same decoder as fencer) only the fields it needs (the
// review's UID and, for /patch, the object's annotations), skipping the
// rest, and writes its response without reflection.
package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"log"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

const (
	offered = "bench.fencer.io/token"
	written = "bench.fencer.io/written-token"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to serve TLS on")
	certDir := flag.String("cert-dir", "", "directory with tls.crt and tls.key")
	flag.Parse()
	var allowed, patched atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/allow", func(w http.ResponseWriter, r *http.Request) { allowed.Add(1); serve(w, r, false) })
	mux.HandleFunc("/patch", func(w http.ResponseWriter, r *http.Request) { patched.Add(1); serve(w, r, true) })
	// How many reviews each path served: the bench checks it was called.
	mux.HandleFunc("/calls", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "%d %d\n", allowed.Load(), patched.Load())
	})
	log.Fatal(http.ListenAndServeTLS(*addr, filepath.Join(*certDir, "tls.crt"), filepath.Join(*certDir, "tls.key"), mux))
}

// review is what the floor reads of an AdmissionReview; json v2 skips
// every other field.
type review struct {
	Request *struct {
		UID    string `json:"uid"`
		Object struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		} `json:"object"`
	} `json:"request"`
}

func serve(w http.ResponseWriter, r *http.Request, patch bool) {
	var rev review
	if err := json.UnmarshalRead(r.Body, &rev); err != nil || rev.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	out := make([]byte, 0, 256)
	out = append(out, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":`...)
	out = quote(out, rev.Request.UID)
	out = append(out, `,"allowed":true`...)
	if patch {
		if ops := patchOps(rev.Request.Object.Metadata.Annotations); len(ops) > 0 {
			out = append(out, `,"patchType":"JSONPatch","patch":"`...)
			out = base64.StdEncoding.AppendEncode(out, ops)
			out = append(out, '"')
		}
	}
	out = append(out, "}}"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// patchOps moves the offer into the record, as fencer's recordPatch
// does, as a JSON patch; nil when there is no offer.
func patchOps(ann map[string]string) []byte {
	v, ok := ann[offered]
	if !ok {
		return nil
	}
	ops := quote([]byte(`[{"op":"remove","path":`), pointer(offered))
	ops = append(ops, '}')
	if ann[written] != v {
		ops = append(ops, `,{"op":"add","path":`...)
		ops = quote(ops, pointer(written))
		ops = append(ops, `,"value":`...)
		ops = quote(ops, v)
		ops = append(ops, '}')
	}
	return append(ops, ']')
}

// quote appends s as a JSON string. Invalid UTF-8 is replaced, never
// refused: the apiserver sent it.
func quote(dst []byte, s string) []byte {
	out, _ := jsontext.AppendQuote(dst, s)
	return out
}

func pointer(key string) string {
	return "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}
