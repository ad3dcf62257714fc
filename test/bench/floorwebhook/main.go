// Command floorwebhook is the cheapest mutating webhook that does what
// fencer's does to a write: it reads the AdmissionReview, then allows it,
// either unchanged (/allow) or with fencer's patch shape (/patch: the
// offered annotation bench.fencer.io/token removed, and recorded as
// bench.fencer.io/written-token when that differs). It makes no decision
// and reads nothing else, so the apiserver's time in it is the floor any
// mutating webhook pays: the bench (TestAdmissionEndToEnd) sets fencer's
// fenced write beside it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

func serve(w http.ResponseWriter, r *http.Request, patch bool) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	if patch {
		var obj struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(review.Request.Object.Raw, &obj); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if ops := patchOps(obj.Metadata.Annotations); len(ops) > 0 {
			raw, _ := json.Marshal(ops)
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = raw, &pt
		}
	}
	review.Request, review.Response = nil, resp
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

// patchOps moves the offer into the record, as fencer's recordPatch does.
func patchOps(ann map[string]string) []map[string]string {
	v, ok := ann[offered]
	if !ok {
		return nil
	}
	ops := []map[string]string{{"op": "remove", "path": pointer(offered)}}
	if ann[written] != v {
		ops = append(ops, map[string]string{"op": "add", "path": pointer(written), "value": v})
	}
	return ops
}

func pointer(key string) string {
	return "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}
