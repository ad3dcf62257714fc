package controllers

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

func pod(ready bool, deleting bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}}
	if deleting {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	return p
}

// finished sets p's phase, as the pod garbage collector's status patch
// does, leaving its Ready condition as it was.
func finished(p *corev1.Pod, phase corev1.PodPhase) *corev1.Pod {
	p.Status.Phase = phase
	return p
}

func lease(renewal fencerv1.RenewalMode, suspend bool) *fencerv1.Lease {
	return &fencerv1.Lease{Spec: fencerv1.LeaseSpec{Renewal: renewal, Suspend: suspend}}
}

func TestDecideTenure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease *fencerv1.Lease
		pod   *corev1.Pod
		want  tenureAction
	}{
		{"suspended ends now, even with a Ready holder", lease(fencerv1.RenewalPodReady, true), pod(true, false), endSuspended},
		{"suspended Direct ends now", lease(fencerv1.RenewalDirect, true), pod(true, false), endSuspended},
		{"Direct is the holder's to renew, Ready or not", lease(fencerv1.RenewalDirect, false), pod(false, false), keepDirect},
		{"Direct with the holder gone, replaced or unselected ends now, even if it still renews", lease(fencerv1.RenewalDirect, false), nil, endHolderLost},
		{"Direct with the holder terminating: it still renews", lease(fencerv1.RenewalDirect, false), pod(true, true), keepDirect},
		{"PodReady, Ready holder: renew", lease(fencerv1.RenewalPodReady, false), pod(true, false), keepRenewing},
		{"PodReady, holder not Ready: end after a TTL", lease(fencerv1.RenewalPodReady, false), pod(false, false), endUnrenewed},
		{"PodReady, holder being deleted", lease(fencerv1.RenewalPodReady, false), pod(true, true), endUnrenewed},
		{"PodReady, holder gone, replaced or unselected ends now", lease(fencerv1.RenewalPodReady, false), nil, endHolderLost},
		{"suspended with the holder gone", lease(fencerv1.RenewalPodReady, true), nil, endSuspended},
		{"PodReady, holder Failed though still Ready: gone, ends now", lease(fencerv1.RenewalPodReady, false), finished(pod(true, false), corev1.PodFailed), endHolderLost},
		{"Direct, holder Failed: gone, ends now, even if it still renews", lease(fencerv1.RenewalDirect, false), finished(pod(true, false), corev1.PodFailed), endHolderLost},
		{"PodReady, holder Succeeded though still Ready", lease(fencerv1.RenewalPodReady, false), finished(pod(true, false), corev1.PodSucceeded), endHolderLost},
	} {
		if got := decideTenure(tc.lease, tc.pod); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestTenureEndFrom(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	lastRenew := clk.Now()
	clk.Step(1500 * time.Millisecond) // the holder went not Ready 1.5 s after the last renewal
	now := clk.Now()
	ttl := 5 * time.Second
	if got, want := tenureEndFrom(lastRenew, true, ttl, 0, now), lastRenew.Add(ttl); !got.Equal(want) {
		t.Errorf("renewed here: ends %s, want one TTL after the last renewal, %s", got, want)
	}
	// Adopted: etcd says 3 s remain (rounded down from up to 3.999 s), so
	// the tenure must not end before now+4 s.
	if got, want := tenureEndFrom(time.Time{}, false, ttl, 3*time.Second, now), now.Add(4*time.Second); !got.Equal(want) {
		t.Errorf("adopted: ends %s, want %s", got, want)
	}
}

func TestBelowIssued(t *testing.T) {
	l := &fencerv1.Lease{Status: fencerv1.LeaseStatus{Token: 40, History: []fencerv1.Tenure{{Token: 40}, {Token: 55}, {Token: 12}}}}
	for rev, want := range map[int64]bool{0: true, 54: true, 55: false, 56: false} {
		floor, below := belowIssued(l, rev)
		if floor != 55 || below != want {
			t.Errorf("rev %d: floor %d below %v, want 55 %v", rev, floor, below, want)
		}
	}
	if _, below := belowIssued(&fencerv1.Lease{}, 1); below {
		t.Error("a Lease that never issued a token has no floor")
	}
}

func TestWhyNotQualified(t *testing.T) {
	for _, tc := range []struct {
		pod  *corev1.Pod
		want fencerv1.TenureEndReason
	}{
		{nil, fencerv1.TenureHolderGone},
		{pod(true, true), fencerv1.TenureHolderGone},
		{pod(false, false), fencerv1.TenureHolderNotReady},
	} {
		if got := whyNotQualified(tc.pod); got != tc.want {
			t.Errorf("got %s, want %s", got, tc.want)
		}
	}
}

// A Lease without a slot (this replica has not refreshed it) shows the
// last renewal only when its status shows no renewal of the current grant.
func TestRefreshDueWithoutSlot(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	last := now.Add(90 * time.Second)
	r := &LeaseReconciler{mem: newLeaseMemory()}
	for _, tc := range []struct {
		name             string
		acquire, renewed *time.Time
		want             bool // the last renewal is shown
	}{
		{"nothing shown", ptrTo(now), nil, true},
		{"adopted from another replica, its renewal shown", ptrTo(now), ptrTo(now.Add(time.Minute)), false},
		{"a renewal from before this grant (its first write failed)", ptrTo(now), ptrTo(now.Add(-time.Minute)), true},
	} {
		l := &fencerv1.Lease{}
		if tc.acquire != nil {
			l.Status.AcquireTime = microTime(*tc.acquire)
		}
		if tc.renewed != nil {
			l.Status.RenewTime = microTime(*tc.renewed)
		}
		if r.mem.refreshDue("k", now.Add(2*time.Minute)) {
			t.Fatalf("%s: a Lease without a slot is due", tc.name)
		}
		showRenewal(l, last, 15*time.Second, r.mem.refreshDue("k", now.Add(2*time.Minute)))
		if got := l.Status.RenewTime.Time.Equal(last); got != tc.want {
			t.Errorf("%s: last renewal shown %v, want %v (renewTime %s)", tc.name, got, tc.want, l.Status.RenewTime.Time)
		}
	}
}

func TestShowRenewal(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ttl := 15 * time.Second
	for _, tc := range []struct {
		name  string
		shown *time.Time
		due   bool
		want  time.Time
	}{
		{"nothing shown yet", nil, false, t0.Add(time.Minute)},
		{"a renewal before the refresh is due is not worth a write", ptrTo(t0), false, t0},
		{"the periodic refresh shows the last renewal", ptrTo(t0), true, t0.Add(time.Minute)},
		{"a renewal from before acquireTime is replaced", ptrTo(t0.Add(-time.Hour)), false, t0.Add(time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &fencerv1.Lease{}
			l.Status.AcquireTime = microTime(t0.Add(-time.Minute))
			if tc.shown != nil {
				l.Status.RenewTime = microTime(*tc.shown)
			}
			showRenewal(l, t0.Add(time.Minute), ttl, tc.due)
			if !l.Status.RenewTime.Time.Equal(tc.want) {
				t.Errorf("renewTime %s, want %s", l.Status.RenewTime.Time, tc.want)
			}
			if got := l.Status.ExpireTime.Sub(l.Status.RenewTime.Time); got != ttl {
				t.Errorf("expireTime %s after renewTime, want the TTL", got)
			}
		})
	}
}

func ptrTo(t time.Time) *time.Time { return &t }

// A status time read back from the apiserver equals the one set: the
// reconcile after a write finds nothing to write.
func TestMicroTimeRoundTrips(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 123456789, time.UTC)
	set := fencerv1.LeaseStatus{AcquireTime: microTime(at)}
	raw, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	var back fencerv1.LeaseStatus
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(set, back) {
		t.Errorf("acquireTime %s set, %s read back", set.AcquireTime.UTC(), back.AcquireTime.UTC())
	}
}
