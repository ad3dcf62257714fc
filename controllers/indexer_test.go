package controllers

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

func TestIndexFunctions(t *testing.T) {
	l := &fencerv1.Lease{Spec: fencerv1.LeaseSpec{HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}}}
	l.Status.Holder = "w-0"
	if got := selectorLabelValues(l); !slices.Equal(got, []string{"app=w"}) {
		t.Errorf("selector values %v", got)
	}
	if got := selectorLabelValues(&fencerv1.Lease{}); !slices.Equal(got, []string{indexAnyLabel}) {
		t.Errorf("a selector without matchLabels indexes as %v, want any", got)
	}
	if got := holderValues(l); !slices.Equal(got, []string{"w-0"}) {
		t.Errorf("holder values %v", got)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "w"}}}
	if got := podLabelValues(p); !slices.Equal(got, []string{"app=w"}) {
		t.Errorf("pod label values %v", got)
	}
	// A wrong kind yields no values, never a panic in the cache.
	for _, fn := range []client.IndexerFunc{selectorLabelValues, holderValues} {
		if got := fn(p); got != nil {
			t.Errorf("a pod indexed as a Lease: %v", got)
		}
	}
	if got := podLabelValues(l); got != nil {
		t.Errorf("a Lease indexed as a pod: %v", got)
	}
	if got := podLeaseValues(l); got != nil {
		t.Errorf("a Lease indexed as a pod: %v", got)
	}
	p.Annotations = map[string]string{
		"lease.fencer.io/report": "7", "leaseid.fencer.io/report": "9", // one Lease, two annotations
		"leaseid.fencer.io/direct": "3", // a lease ID alone still names its Lease
		"lease.fencer.io/":         "1", // no name
		"idrange.fencer.io/ids":    "block=1-2",
		"other":                    "x",
	}
	got := podLeaseValues(p)
	slices.Sort(got)
	if !slices.Equal(got, []string{"direct", "report"}) {
		t.Errorf("pod lease values %v, want [direct report]", got)
	}
}

// TestSetupIndexesRegistersEveryIndex: every field the controllers list by
// is registered.
func TestSetupIndexesRegistersEveryIndex(t *testing.T) {
	rec := &recordingIndexer{}
	if err := SetupIndexes(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	want := []string{"*v1alpha1.Lease/" + indexSelectorLabel, "*v1alpha1.Lease/" + indexHolder, "*v1.Pod/" + indexPodLabel, "*v1.Pod/" + indexPodLease, "*v1alpha1.WorkloadLease/" + indexWorkload}
	if !slices.Equal(rec.fields, want) {
		t.Fatalf("indexes %v, want %v", rec.fields, want)
	}
}

type recordingIndexer struct{ fields []string }

func (r *recordingIndexer) IndexField(_ context.Context, obj client.Object, field string, _ client.IndexerFunc) error {
	r.fields = append(r.fields, typeName(obj)+"/"+field)
	return nil
}

func typeName(obj client.Object) string {
	switch obj.(type) {
	case *fencerv1.Lease:
		return "*v1alpha1.Lease"
	case *corev1.Pod:
		return "*v1.Pod"
	case *fencerv1.WorkloadLease:
		return "*v1alpha1.WorkloadLease"
	}
	return "?"
}
