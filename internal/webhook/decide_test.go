package webhook

import (
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

func testLease(policy v1.FencingPolicy, bind bool) *v1.Lease {
	return &v1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: "default"},
		Spec:       v1.LeaseSpec{Policy: policy, BindIdentity: bind},
	}
}

func held(tok, rev int64) etcdstore.Live {
	g := &etcdstore.Grant{Token: tok}
	g.Holder, g.HolderUID = "reporter-b", "uid-b"
	return etcdstore.Live{Grant: g, Revision: rev}
}

var unheld = etcdstore.Live{Revision: 100}

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
		lease  *v1.Lease
		live   etcdstore.Live
		reason Reason // "" means allowed
		msg    string
	}{
		{"live token passes", write{offered: "42"}, testLease(v1.PolicyCurrent, false), held(42, 50), "", ""},
		{"missing token", write{}, testLease(v1.PolicyCurrent, false), held(42, 50), ReasonMissingToken,
			"fencer: missing fencing token for lease default/report: set the annotation fencer.io/token to the holder's token (current token is 42, holder reporter-b)"},
		{"missing token, no holder", write{}, testLease(v1.PolicyCurrent, false), unheld, ReasonMissingToken, "(the lease has no holder now)"},
		{"malformed token", write{offered: "4 2"}, testLease(v1.PolicyCurrent, false), held(42, 50), ReasonMalformed,
			`fencer: malformed fencing token "4 2": character ' ' at offset 1; only decimal digits are allowed for lease default/report`},
		{"negative token", write{offered: "-42"}, testLease(v1.PolicyCurrent, false), held(42, 50), ReasonMalformed, "only decimal digits"},
		{"overflowing token", write{offered: "99999999999999999999"}, testLease(v1.PolicyCurrent, false), held(42, 50), ReasonMalformed, "does not fit a 64-bit integer"},
		{"forged future token", write{offered: "51"}, testLease(v1.PolicyCurrent, false), held(42, 50), ReasonForged,
			"fencer: forged token 51 for lease default/report: no token above 50 has been issued"},
		{"forged even under Monotonic", write{offered: "51"}, testLease(v1.PolicyMonotonic, false), held(42, 50), ReasonForged, "forged token 51"},
		{"stale token under Current", write{offered: "41"}, testLease(v1.PolicyCurrent, false), held(42, 50), ReasonBelowLive,
			"fencer: stale token 41 for lease default/report: current token is 42 (holder reporter-b)"},
		{"stale token under Monotonic", write{offered: "41"}, testLease(v1.PolicyMonotonic, false), held(42, 50), ReasonBelowLive, "stale token 41"},
		{"newer token not current under Current", write{offered: "45"}, testLease(v1.PolicyCurrent, false), held(42, 50), ReasonNotCurrent,
			"fencer: token 45 is not the current token of lease default/report: current token is 42 (holder reporter-b)"},
		{"newer token passes under Monotonic", write{offered: "45"}, testLease(v1.PolicyMonotonic, false), held(42, 50), "", ""},
		{"below the object's token", write{offered: "42", recorded: "43"}, testLease(v1.PolicyMonotonic, false), held(42, 50), ReasonBelowObject,
			"fencer: stale token 42 for lease default/report: the object already carries token 43, written by a newer holder"},
		{"equal to the object's token", write{offered: "42", recorded: "42"}, testLease(v1.PolicyCurrent, false), held(42, 50), "", ""},
		{"object token malformed is ignored", write{offered: "42", recorded: "junk"}, testLease(v1.PolicyCurrent, false), held(42, 50), "", ""},
		{"no holder under Current", write{offered: "42"}, testLease(v1.PolicyCurrent, false), unheld, ReasonNoHolder,
			"fencer: lease default/report has no holder, so no token is current; token 42 is refused until the lease is granted again"},
		{"no holder under Monotonic", write{offered: "42"}, testLease(v1.PolicyMonotonic, false), unheld, "", ""},
		{"bindIdentity: the holder pod", write{offered: "42", user: podUser("reporter-b", "uid-b")}, testLease(v1.PolicyCurrent, true), held(42, 50), "", ""},
		{"bindIdentity: another pod", write{offered: "42", user: podUser("reporter-a", "uid-a")}, testLease(v1.PolicyCurrent, true), held(42, 50), ReasonIdentity,
			"fencer: lease default/report binds writes to its holder pod reporter-b (bindIdentity); this request comes from system:serviceaccount:default:reporter (pod reporter-a)"},
		{"bindIdentity: a recreated pod of the same name", write{offered: "42", user: podUser("reporter-b", "uid-old")}, testLease(v1.PolicyCurrent, true), held(42, 50), ReasonIdentity, "binds writes to its holder pod"},
		{"bindIdentity: no pod claim", write{offered: "42", user: authenticationv1.UserInfo{Username: "alice"}}, testLease(v1.PolicyCurrent, true), held(42, 50), ReasonIdentity, "this request comes from alice"},
		{"bindIdentity: no holder", write{offered: "42", user: podUser("reporter-b", "uid-b")}, testLease(v1.PolicyMonotonic, true), unheld, ReasonNoHolder, "has no holder"},
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
			if d.Reason != tc.reason || d.Code != 409 || !strings.Contains(d.Message, tc.msg) {
				t.Fatalf("got %s %d %q\nwant %s 409 containing %q", d.Reason, d.Code, d.Message, tc.reason, tc.msg)
			}
		})
	}
}
