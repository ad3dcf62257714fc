package webhook

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

func testLease(policy fencerv1.FencingPolicy, bind bool) *fencerv1.Lease {
	return &fencerv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: "default"},
		Spec:       fencerv1.LeaseSpec{Policy: policy, BindIdentity: bind},
	}
}

func held(tok, rev int64) etcdstore.Live {
	g := &etcdstore.Grant{Token: tok}
	g.Holder, g.HolderUID = "reporter-b", "uid-b"
	return etcdstore.Live{Grant: g, Revision: rev}
}

var unheld = etcdstore.Live{Revision: 100}

// heldFor is held(tok, rev) with the grant made for the Lease object uid.
func heldFor(uid string, tok, rev int64) etcdstore.Live {
	l := held(tok, rev)
	l.Grant.LeaseUID = uid
	return l
}

// testLeaseUID is testLease with the object's UID set.
func testLeaseUID(uid string, bind bool) *fencerv1.Lease {
	l := testLease(fencerv1.PolicyCurrent, bind)
	l.UID = types.UID(uid)
	return l
}

// leaseIssued is a Lease whose status records token as its last grant.
func leaseIssued(policy fencerv1.FencingPolicy, token int64) *fencerv1.Lease {
	l := testLease(policy, false)
	l.Status.History = []fencerv1.Tenure{{Token: token}}
	return l
}

func bound(l *fencerv1.Lease) *fencerv1.Lease {
	l.Spec.BindIdentity = true
	return l
}

func podUser(name, uid string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{
		Username: "system:serviceaccount:default:reporter",
		Extra: map[string]authenticationv1.ExtraValue{
			podNameExtra: {name},
			podUIDExtra:  {uid},
		},
	}
}

// TestDecide covers every branch of the rules of docs/webhook.md.
func TestDecide(t *testing.T) {
	cases := []struct {
		name   string
		w      write
		lease  *fencerv1.Lease
		live   etcdstore.Live
		reason Reason // "" means allowed
		msg    string
	}{
		{"live token passes", write{offered: "42"}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), "", ""},
		{"missing token", write{}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialMissingToken,
			"fencer: this write sends no fencing token for lease default/report: every write to a fenced object must set the annotation fencer.io/token to the holder's token itself"},
		{"missing token names the facts", write{recorded: "42", hasRecord: true}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialMissingToken,
			`[lease default/report; offered token none; recorded token "42"; current token 42; holder reporter-b]`},
		{"missing token, no holder", write{}, testLease(fencerv1.PolicyCurrent, false), unheld, fencerv1.DenialMissingToken, "current token 0; holder none]"},
		{"malformed token", write{offered: "4 2"}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialMalformed,
			`fencer: malformed fencing token "4 2": character ' ' at offset 1; only decimal digits are allowed for lease default/report`},
		{"negative token", write{offered: "-42"}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialMalformed, "only decimal digits"},
		{"overflowing token", write{offered: "99999999999999999999"}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialMalformed, "does not fit a 64-bit integer"},
		{"forged future token", write{offered: "43"}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialForged,
			"fencer: forged token 43 for lease default/report: no token above 42 has been issued for it"},
		{"forged even under Monotonic", write{offered: "45"}, testLease(fencerv1.PolicyMonotonic, false), held(42, 50), fencerv1.DenialForged, "forged token 45"},
		{"forged under Monotonic with no holder", write{offered: "45"}, leaseIssued(fencerv1.PolicyMonotonic, 42), unheld, fencerv1.DenialForged, "no token above 42 has been issued"},
		{"forged under Monotonic, never granted", write{offered: "1"}, testLease(fencerv1.PolicyMonotonic, false), unheld, fencerv1.DenialForged, "no token above 0 has been issued"},
		{"last issued token under Monotonic with no holder", write{offered: "42"}, leaseIssued(fencerv1.PolicyMonotonic, 42), unheld, "", ""},
		{"a status above etcd's revision, under Monotonic with no holder", write{offered: "1152921504606846976"}, leaseIssued(fencerv1.PolicyMonotonic, 1<<60), unheld, fencerv1.DenialRegressed,
			"records token 1152921504606846976 as issued, above etcd's revision 100"},
		{"a status above etcd's revision refuses the tokens below it too", write{offered: "42", recorded: "42", hasRecord: true}, leaseIssued(fencerv1.PolicyMonotonic, 1<<60), unheld, fencerv1.DenialRegressed, "above etcd's revision"},
		{"stale token under Current", write{offered: "41"}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialBelowLive,
			"fencer: stale token 41 for lease default/report: current token is 42 (holder reporter-b)"},
		{"stale token under Monotonic", write{offered: "41"}, testLease(fencerv1.PolicyMonotonic, false), held(42, 50), fencerv1.DenialBelowLive, "stale token 41"},
		{"below the object's token", write{offered: "40", recorded: "41", hasRecord: true}, leaseIssued(fencerv1.PolicyMonotonic, 42), unheld, fencerv1.DenialBelowObject,
			"fencer: stale token 40 for lease default/report: the object was last written under token 41, by a newer holder"},
		{"equal to the object's token", write{offered: "42", recorded: "42", hasRecord: true}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), "", ""},
		{"a malformed record refuses (never switches the object check off)", write{offered: "42", recorded: "junk", hasRecord: true}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialBelowObject, `malformed fencing token "junk"`},
		{"no holder under Current", write{offered: "42"}, leaseIssued(fencerv1.PolicyCurrent, 42), unheld, fencerv1.DenialNoHolder,
			"fencer: lease default/report has no holder, so no token is current; token 42 is refused until the lease is granted again"},
		{"bindIdentity: the holder pod", write{offered: "42", user: podUser("reporter-b", "uid-b")}, testLease(fencerv1.PolicyCurrent, true), held(42, 50), "", ""},
		{"bindIdentity: another pod", write{offered: "42", user: podUser("reporter-a", "uid-a")}, testLease(fencerv1.PolicyCurrent, true), held(42, 50), fencerv1.DenialIdentity,
			"fencer: lease default/report binds writes to its holder pod reporter-b (bindIdentity); this request comes from system:serviceaccount:default:reporter (pod reporter-a)"},
		{"bindIdentity: a recreated pod of the same name", write{offered: "42", user: podUser("reporter-b", "uid-old")}, testLease(fencerv1.PolicyCurrent, true), held(42, 50), fencerv1.DenialIdentity, "binds writes to its holder pod"},
		{"bindIdentity: no pod claim", write{offered: "42", user: authenticationv1.UserInfo{Username: "alice"}}, testLease(fencerv1.PolicyCurrent, true), held(42, 50), fencerv1.DenialIdentity, "this request comes from alice"},
		{"bindIdentity: no holder", write{offered: "42", user: podUser("reporter-b", "uid-b")}, bound(leaseIssued(fencerv1.PolicyMonotonic, 42)), unheld, fencerv1.DenialNoHolder, "has no holder"},
		{"a restored grant below an issued token", write{offered: "30"}, leaseIssued(fencerv1.PolicyCurrent, 42), held(30, 50), fencerv1.DenialRegressed,
			"etcd's grant (token 30) is below token 42 this Lease already issued"},
		{"token 0 is never issued", write{offered: "0"}, leaseIssued(fencerv1.PolicyMonotonic, 0), unheld, fencerv1.DenialMalformed, "a fencing token is positive"},
		{"a damaged record refuses every write", write{offered: "42", recorded: "", hasRecord: true}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialBelowObject, "annotation is damaged"},
		{"bindIdentity: the pod-uid claim is required", write{offered: "42", user: podUser("reporter-b", "")}, testLease(fencerv1.PolicyCurrent, true), held(42, 50), fencerv1.DenialIdentity, "binds writes to its holder pod"},
		{"bindIdentity: a service account of another namespace", write{offered: "42", user: authenticationv1.UserInfo{Username: "system:serviceaccount:other:reporter",
			Extra: map[string]authenticationv1.ExtraValue{podNameExtra: {"reporter-b"}, podUIDExtra: {"uid-b"}}}}, testLease(fencerv1.PolicyCurrent, true), held(42, 50), fencerv1.DenialIdentity, "binds writes to its holder pod"},
		{"tokenless write refused", write{tokenless: "a DELETE"}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialTokenless,
			"fencer: a DELETE cannot carry a fencing token, so it is refused on an object fenced by lease default/report: first unfence the object with a write that sends the live token in fencer.io/token and removes the label fencer.io/lease, then repeat this request ["},
		{"tokenless write with the live token's holder name but no bindIdentity", write{tokenless: "a DELETE", user: podUser("reporter-b", "uid-b")}, testLease(fencerv1.PolicyCurrent, false), held(42, 50), fencerv1.DenialTokenless, "cannot carry"},
		{"tokenless write from the holder under bindIdentity", write{tokenless: "a UPDATE of the status subresource", user: podUser("reporter-b", "uid-b")}, testLease(fencerv1.PolicyCurrent, true), held(42, 50), "", ""},
		{"the grant of this very Lease object passes", write{offered: "42"}, testLeaseUID("uid-l", false), heldFor("uid-l", 42, 50), "", ""},
		{"a grant made before grants recorded their Lease passes", write{offered: "42"}, testLeaseUID("uid-l", false), held(42, 50), "", ""},
		{"a grant of another Lease object of the same name", write{offered: "42"}, testLeaseUID("uid-new", false), heldFor("uid-old", 42, 50), fencerv1.DenialLeaseReplaced,
			"fencer: lease default/report: etcd's grant (token 42) was made for another Lease object of this name (UID uid-old), not this one (UID uid-new)"},
		{"a grant of another Lease object, under Monotonic", write{offered: "42"}, leaseIssued(fencerv1.PolicyMonotonic, 42), heldFor("uid-old", 42, 50), fencerv1.DenialLeaseReplaced, "another Lease object"},
		{"a grant of another Lease object, tokenless from its holder", write{tokenless: "a DELETE", user: podUser("reporter-b", "uid-b")}, testLeaseUID("uid-new", true), heldFor("uid-old", 42, 50),
			fencerv1.DenialLeaseReplaced, "another Lease object"},
		{"tokenless write from another pod under bindIdentity", write{tokenless: "a DELETE", user: podUser("reporter-a", "uid-a")}, testLease(fencerv1.PolicyCurrent, true), held(42, 50), fencerv1.DenialTokenless,
			"or send it from the holder pod's own service-account token"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.w.leaseRef = "default/report"
			d := decide(tc.w, tc.lease, tc.live)
			if tc.reason == "" {
				if d != nil {
					t.Fatalf("refused: %v", d)
				}
				return
			}
			if d == nil {
				t.Fatalf("allowed; want %s", tc.reason)
			}
			code := int32(409)
			if tc.reason == fencerv1.DenialTokenless {
				code = 403 // no token could make it pass: not a conflict to retry
			}
			if d.Reason != tc.reason || d.Code != code || !strings.Contains(d.Message, tc.msg) {
				t.Fatalf("got %s %d %q\nwant %s %d containing %q", d.Reason, d.Code, d.Message, tc.reason, code, tc.msg)
			}
		})
	}
}

// preCheckCase builds one decision's inputs from fuzzed bytes: the write,
// the Lease (policy, bindIdentity, status) and a live state etcd might hold.
func preCheckCase(b []byte) (write, *fencerv1.Lease, etcdstore.Live) {
	at := func(i int) int {
		if i < len(b) {
			return int(b[i])
		}
		return 0
	}
	tokenText := func(v int) string {
		switch v % 16 {
		case 13:
			return ""
		case 14:
			return "x1"
		case 15:
			return "-3"
		}
		return strconv.Itoa(v % 16)
	}
	w := write{leaseRef: "default/report", offered: tokenText(at(0)), fencing: at(1)%2 == 1}
	if r := at(2) % 3; r > 0 {
		w.hasRecord, w.recorded = true, tokenText(at(3))
	}
	if at(4)%4 == 0 {
		w.tokenless = "a DELETE"
	}
	w.user = podUser([]string{"reporter-a", "reporter-b"}[at(5)%2], []string{"uid-a", "uid-b"}[at(6)%2])
	lease := testLease([]fencerv1.FencingPolicy{fencerv1.PolicyCurrent, fencerv1.PolicyMonotonic}[at(7)%2], at(8)%2 == 1)
	lease.Status.Token = int64(at(9) % 13)
	if lease.Status.Token > 0 {
		lease.Status.Holder = "reporter-b"
	}
	for i := range at(10) % 3 {
		lease.Status.History = append(lease.Status.History, fencerv1.Tenure{Token: int64(at(11+i) % 13)})
	}
	live := etcdstore.Live{Revision: 100}
	if tok := int64(at(14) % 14); tok > 0 {
		live = held(tok, 100)
	}
	return w, lease, live
}

// checkPreCheck: a refusal made before the etcd read is one decide makes
// too, with whatever etcd holds (any live state: a newer grant, none, one
// restored below the status's tokens).
func checkPreCheck(t *testing.T, b []byte) {
	w, lease, _ := preCheckCase(b)
	pre := refuseWithoutEtcd(w, lease)
	if pre == nil {
		return
	}
	for tok := int64(0); tok <= 14; tok++ {
		live := etcdstore.Live{Revision: 100}
		if tok > 0 {
			live = held(tok, 100)
		}
		if d := decide(w, lease, live); d == nil {
			t.Fatalf("refused before the etcd read (%s: %s), but decide allows it with live token %d: write %+v, lease %+v",
				pre.Reason, pre.Message, tok, w, lease)
		}
	}
}

func TestRefuseWithoutEtcdOnlyWhatDecideRefuses(t *testing.T) {
	r := rand.New(rand.NewPCG(20261202, 33))
	refused := map[Reason]int{}
	for range 50000 {
		b := make([]byte, 16)
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		checkPreCheck(t, b)
		w, lease, _ := preCheckCase(b)
		if d := refuseWithoutEtcd(w, lease); d != nil {
			refused[d.Reason]++
		}
	}
	// The test must reach every refusal it guards.
	for _, want := range []Reason{fencerv1.DenialSuperseded, fencerv1.DenialBelowObject, fencerv1.DenialMissingToken, fencerv1.DenialMalformed} {
		if refused[want] == 0 {
			t.Errorf("no case refused %s before the etcd read: %v", want, refused)
		}
	}
}

func FuzzRefuseWithoutEtcd(f *testing.F) {
	f.Add([]byte{3, 0, 0, 0, 1, 1, 1, 0, 0, 7, 1, 7, 0, 0, 7})
	f.Fuzz(func(t *testing.T, b []byte) { checkPreCheck(t, b) })
}

func TestSupersededNamesTheStatus(t *testing.T) {
	l := leaseIssued(fencerv1.PolicyCurrent, 42)
	l.Status.Token, l.Status.Holder = 42, "reporter-b"
	d := refuseWithoutEtcd(write{leaseRef: "default/report", offered: "41"}, l)
	want := `fencer: stale token 41 for lease default/report: token 42 has been issued since, as the Lease's status records [lease default/report; offered token "41"; recorded token none; current token 42; holder reporter-b]`
	if d == nil || d.Reason != fencerv1.DenialSuperseded || d.Message != want || d.Current != 42 || d.Holder != "reporter-b" {
		t.Fatalf("got %+v\nwant %s", d, want)
	}
	if d := refuseWithoutEtcd(write{leaseRef: "default/report", offered: "41"}, leaseIssued(fencerv1.PolicyMonotonic, 42)); d != nil {
		t.Fatalf("refused under Monotonic without etcd: %v (with no holder, 41 passes the policy)", d)
	}
}
