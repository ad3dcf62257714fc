package main

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// TestOwnKindsAreFencersCRDs: check's list of fencer's own kinds, and the
// fencing webhooks' matchCondition that skips them, name every CRD fencer
// defines, so a kind added later is never judged by the fence by mistake.
func TestOwnKindsAreFencersCRDs(t *testing.T) {
	files, err := filepath.Glob("../../config/crd/bases/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd/bases: %v", err)
	}
	var plurals []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Plural string `json:"plural"`
				} `json:"names"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if crd.Spec.Group != "fencer.io" {
			t.Fatalf("%s: group %q, want fencer.io", f, crd.Spec.Group)
		}
		plurals = append(plurals, crd.Spec.Names.Plural)
	}
	slices.Sort(plurals)
	if got := slices.Sorted(maps.Keys(ownKinds)); !slices.Equal(got, plurals) {
		t.Errorf("ownKinds is %v; fencer's CRDs are %v", got, plurals)
	}
	quoted := make([]string, len(plurals))
	for i, p := range plurals {
		quoted[i] = "'" + p + "'"
	}
	want := "request.resource.resource in [" + strings.Join(quoted, ", ") + "]"
	webhooks, err := os.ReadFile("../../config/webhook/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Both fencing webhooks carry it (record and fenced); the chart's
	// copy is held equal to this one by test/chart.
	if n := strings.Count(string(webhooks), want); n != 2 {
		t.Errorf("config/webhook/manifests.yaml has %d matchConditions with %q, want 2", n, want)
	}
}

// A fencer.io/lease label fences nothing on a cluster-scoped object (the
// webhooks take namespaced ones only), and a labelled object's write that
// passed with no token was never judged by fencer (or came from an exempt
// user): check says so instead of naming the Lease as its fence.
func TestCheckSaysWhatTheFenceNeverJudges(t *testing.T) {
	for _, c := range []struct {
		d    decision
		want string
	}{
		{decision{Object: "clusterrole/x", ClusterScoped: true, Allowed: true}, "- (cluster-scoped: fencer fences namespaced objects only"},
		{decision{Object: "configmap/x", Lease: "team-a/job", Allowed: true}, "a write with no token passed: fencer's webhooks do not see this namespace"},
	} {
		var b strings.Builder
		w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		c.d.table(w)
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("%+v printed\n%s\nwant a line containing %q", c.d, b.String(), c.want)
		}
	}
	// A token sent and accepted needs no note.
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	decision{Object: "configmap/x", Lease: "team-a/job", Offered: "7", Allowed: true}.table(w)
	_ = w.Flush()
	if strings.Contains(b.String(), "Note:") {
		t.Errorf("an accepted token printed a note:\n%s", b.String())
	}
}
