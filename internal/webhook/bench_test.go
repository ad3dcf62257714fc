package webhook

import (
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkServeHTTP: one AdmissionReview through the webhook's HTTP handler
// (decode, Lease from a cache, decision, encode), with the etcd lookup
// replaced by a constant: the webhook's own cost, not etcd's.
func BenchmarkServeHTTP(b *testing.B) {
	f := newChecker(b, fakeLive{live: held(42, 50)})
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}}
	r := request(admissionv1.Update, obj("report", "42"), obj("report", "42"))
	review.Request = &r.AdmissionRequest
	body, err := json.Marshal(review)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if rec := serve(b, f, body); rec.Code != 200 {
				b.Fatalf("status %d", rec.Code)
			}
		}
	})
}
