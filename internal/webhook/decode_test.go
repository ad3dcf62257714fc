package webhook

import (
	"maps"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The apiserver's view of an object's labels and annotations: the
// unstructured decoder it uses for custom resources.
func apiserverMeta(raw []byte) (labels, annotations map[string]string, ok bool) {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, nil, false
	}
	labels, okL, errL := unstructured.NestedStringMap(u.Object, "metadata", "labels")
	annotations, okA, errA := unstructured.NestedStringMap(u.Object, "metadata", "annotations")
	if errL != nil || errA != nil {
		return nil, nil, false
	}
	if !okL {
		labels = nil
	}
	if !okA {
		annotations = nil
	}
	return labels, annotations, true
}

// agreeWithAPIServer fails when fencer reads other labels or annotations
// than the apiserver does from raw. Where the apiserver cannot read the
// object at all it would never send it for review, so nothing is compared.
func agreeWithAPIServer(t *testing.T, raw []byte) {
	t.Helper()
	wantL, wantA, ok := apiserverMeta(raw)
	if !ok {
		return
	}
	m, err := decodeMeta(raw)
	if err != nil {
		t.Fatalf("fencer cannot read %q, which the apiserver reads: %v", raw, err)
	}
	if m == nil {
		t.Fatalf("fencer read no object from %q", raw)
	}
	if !maps.Equal(m.Metadata.Labels, wantL) || !maps.Equal(m.Metadata.Annotations, wantA) {
		t.Fatalf("%q: fencer reads labels %v annotations %v, the apiserver %v %v", raw, m.Metadata.Labels, m.Metadata.Annotations, wantL, wantA)
	}
}

// A custom resource that keeps unknown fields may store a top-level
// "Metadata"; encoding/json would read it as metadata (keys match
// case-insensitively), the apiserver does not.
func TestDecodeMetaIsCaseSensitive(t *testing.T) {
	for _, raw := range []string{
		`{"apiVersion":"x/v1","kind":"K","metadata":{"name":"a","labels":{"fencer.io/lease":"report"}},"Metadata":{"labels":{"fencer.io/lease":"other"}}}`,
		`{"apiVersion":"x/v1","kind":"K","Metadata":{"labels":{"fencer.io/lease":"report"}},"metadata":{"name":"a"}}`,
		`{"apiVersion":"x/v1","kind":"K","metadata":{"name":"a","Labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/token":"7"},"ANNOTATIONS":{"fencer.io/token":"9"}}}`,
	} {
		agreeWithAPIServer(t, []byte(raw))
	}
}

// JSON the apiserver reads loosely: a name repeated in one object (it
// decodes objects into maps, where the last value wins; encoding/json's
// struct decoding merged the two, and read a lease label the apiserver
// does not see), and strings that are not UTF-8 (mended to U+FFFD).
func TestDecodeMetaReadsLooseJSONAsTheAPIServerDoes(t *testing.T) {
	for _, raw := range []string{
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"labels":{"fencer.io/lease":"report"}},"metadata":{"name":"a"}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"labels":{"fencer.io/lease":"report"},"labels":{"app":"x"}}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"annotations":{"fencer.io/token":"7"},"annotations":{},"labels":{"fencer.io/lease":"report"}}}`,
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"labels":{"fencer.io/lease":"a","fencer.io/lease":"b"}}}`,
		"{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"labels\":{\"fencer.io/lease\":\"r\xff\"},\"annotations\":{\"fencer.io/token\":\"7\\udc00\"}}}",
	} {
		if _, _, ok := apiserverMeta([]byte(raw)); !ok {
			t.Fatalf("the apiserver cannot read %s: the case tests nothing", raw)
		}
		agreeWithAPIServer(t, []byte(raw))
	}
}

// FuzzDecodeMeta: fencer reads the labels and annotations the apiserver
// reads, from any bytes the apiserver can decode.
func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"x/v1","kind":"K","metadata":{"name":"a","labels":{"fencer.io/lease":"report"}},"Metadata":{"labels":{"fencer.io/lease":"other"}}}`))
	f.Add([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","annotations":{"fencer.io/token":"12"}}}`))
	f.Add([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":null}}`))
	f.Add([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"a":"\u00e9"}}}`))
	f.Add([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"labels":{"fencer.io/lease":"report"},"labels":{"app":"x"}},"metadata":{"annotations":{}}}`))
	f.Fuzz(agreeWithAPIServer)
}
