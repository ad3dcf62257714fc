package controllers

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// The Low condition counts exactly, near the top of int64 too (the CRD
// admits any max below MaxInt64): in float64 a range of 807 IDs read as
// 1,025, and one of 101 as 1, which was never Low.
func TestTheLowConditionCountsExactly(t *testing.T) {
	for _, tc := range []struct {
		min, max, remaining int64
		want                string
		low                 bool
	}{
		{9223372036854775000, 9223372036854775806, 805, "805 of 807 remain", false},
		{9223372036854775000, 9223372036854775806, 80, "80 of 807 remain", true},
		{9223372036854775000, 9223372036854775806, 81, "81 of 807 remain", false},
		{0, 9223372036854775806, 0, "0 of 9223372036854775807 remain", true},
		{9223372036854774785, 9223372036854774885, 5, "5 of 101 remain", true},
		{0, 99, 9, "9 of 100 remain", true},
		{0, 99, 10, "10 of 100 remain", false},
		{0, 100, 10, "10 of 101 remain", true},
		{5, 5, 0, "0 of 1 remain", true},
		{5, 5, 1, "1 of 1 remain", false},
	} {
		rng := &fencerv1.IDRange{Spec: fencerv1.IDRangeSpec{Min: tc.min, Max: tc.max}, Status: fencerv1.IDRangeStatus{Remaining: tc.remaining}}
		setLowCondition(rng)
		c := meta.FindStatusCondition(rng.Status.Conditions, fencerv1.ConditionLow)
		if c == nil || c.Message != tc.want || meta.IsStatusConditionTrue(rng.Status.Conditions, fencerv1.ConditionLow) != tc.low {
			t.Errorf("[%d, %d] with %d remaining: Low %+v, want %q and Low %v", tc.min, tc.max, tc.remaining, c, tc.want, tc.low)
		}
	}
}
