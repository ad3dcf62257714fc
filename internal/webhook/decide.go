// Package webhook is fencer's admission webhook: a mutating half that turns
// each write's token offer into a record, and a validating half that refuses
// writes to fenced Kubernetes objects whose token is stale, forged or missing
// (docs/webhook.md).
package webhook

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// The pod-name and pod-uid claims of a bound service-account token, as the
// apiserver passes them in userInfo.extra.
const (
	podNameExtra = "authentication.kubernetes.io/pod-name"
	podUIDExtra  = "authentication.kubernetes.io/pod-uid"
)

// Reason labels a decision, in metrics and in a Denial's causes.
type Reason = fencerv1.DenialReason

// Reasons for allowing a write, and for refusing one that the API package
// does not name because it is not about the token.
const (
	ReasonAllowed   Reason = "Allowed"
	ReasonNotFenced Reason = "NotFenced"
	ReasonExempt    Reason = "ExemptIdentity"
	// ReasonFinalizersReleased: an UPDATE of an object already being
	// deleted that only removes finalizers, from any identity.
	ReasonFinalizersReleased Reason = "FinalizersReleased"
	ReasonLookupFailed       Reason = "LookupFailed"
	ReasonBadRequest         Reason = "BadRequest"
	// ReasonHandlerPanicked: the handler panicked and the write was
	// refused (the webhooks fail closed). Counted, so a bug that refuses
	// writes shows in the metrics, not only in the log.
	ReasonHandlerPanicked Reason = "HandlerPanicked"
)

// Denial is a refused write: an HTTP code, a message a person can act on,
// and the facts behind it, which also travel as structured causes.
type Denial struct {
	Code    int32
	Reason  Reason
	Message string
	// Lease is namespace/name; the rest is "" or 0 where unknown.
	Lease    string
	Offered  string
	Recorded string
	Current  int64
	Holder   string
}

func (d *Denial) Error() string { return d.Message }

// write is what the decision needs to know about one admission request.
type write struct {
	// leaseRef is namespace/name of the fencing Lease, for messages.
	leaseRef string
	// tokenless names a write that cannot carry a token ("a DELETE", "a
	// write to /status"); "" for a CREATE or UPDATE of the object itself.
	tokenless string
	// offered is the token this write itself sent, "" if it sent none.
	offered string
	// recorded is the token of the object's last accepted write, "" if
	// none; hasRecord tells an empty record (damaged) from none.
	recorded  string
	hasRecord bool
	// fencing is a write that makes the object fenced by this lease (a
	// CREATE, or adding the label): it has no trusted record to compare.
	fencing bool
	user    authenticationv1.UserInfo
}

// facts fills a Denial with what the decision knew.
type facts struct {
	w    write
	live etcdstore.Live
}

func (f facts) deny(reason Reason, format string, args ...any) *Denial {
	d := &Denial{Code: http.StatusConflict, Reason: reason, Lease: f.w.leaseRef, Offered: f.w.offered, Recorded: f.w.recorded}
	if reason == fencerv1.DenialTokenless {
		// No token can make this write pass, so it is no conflict to retry
		// (kubectl scale retries conflicts for minutes): it is forbidden.
		d.Code = http.StatusForbidden
	}
	if g := f.live.Grant; g != nil {
		d.Current, d.Holder = g.Token, g.Holder
	}
	// One buffer for the whole message: a refusal costs no etcd read, so
	// under a flood of stale writes its allocations are most of its cost.
	msg := make([]byte, 0, 256)
	msg = append(msg, "fencer: "...)
	msg = fmt.Appendf(msg, format, args...)
	d.Message = string(d.appendSummary(msg))
	return d
}

// appendSummary appends every fact of d to the message, so a person
// reading only the kubectl output sees what the causes carry.
func (d *Denial) appendSummary(b []byte) []byte {
	b = append(b, " [lease "...)
	b = append(b, d.Lease...)
	b = append(b, "; offered token "...)
	b = appendQuotedOrNone(b, d.Offered)
	b = append(b, "; recorded token "...)
	b = appendQuotedOrNone(b, d.Recorded)
	b = append(b, "; current token "...)
	b = strconv.AppendInt(b, d.Current, 10)
	b = append(b, "; holder "...)
	if d.Holder == "" {
		b = append(b, "none"...)
	} else {
		b = append(b, d.Holder...)
	}
	return append(b, ']')
}

func appendQuotedOrNone(b []byte, s string) []byte {
	if s == "" {
		return append(b, "none"...)
	}
	return strconv.AppendQuote(b, s)
}

// decide applies the rules of docs/webhook.md to one write, given the Lease
// and the live state of its etcd key, in the documented order. nil means
// allowed.
func decide(w write, lease *fencerv1.Lease, live etcdstore.Live) *Denial {
	f := facts{w: w, live: live}
	if d := checkSameLease(f, lease); d != nil {
		return d
	}
	if w.tokenless != "" {
		return decideTokenless(f, lease)
	}
	offered, d := parseOffer(f, lease)
	if d != nil {
		return d
	}
	issued := lastIssued(lease, live)
	if d := checkRegressed(f, lease); d != nil {
		return d
	}
	if offered > issued {
		return f.deny(fencerv1.DenialForged, "forged token %d for lease %s: no token above %d has been issued for it", offered, w.leaseRef, issued)
	}
	if d := checkRecord(f, offered); d != nil {
		return d
	}
	if d := checkPolicy(f, lease, offered); d != nil {
		return d
	}
	if w.fencing && offered < issued {
		// Only the newest token may fence an object, so an object unfenced
		// under a newer token cannot be fenced again under an older one,
		// whatever record it carries.
		return f.deny(fencerv1.DenialNotNewest, "stale token %d for lease %s: a write that fences an object (a CREATE, or adding the label %s) must send the newest token issued for the lease, %d",
			offered, w.leaseRef, fencerv1.LeaseLabel, issued)
	}
	if lease.Spec.BindIdentity {
		return checkIdentity(f)
	}
	return nil
}

// refuseWithoutEtcd decides the refusals that need no etcd read, before
// the live-token lookup: a token that is missing or malformed, below the
// object's record, or, under policy Current, below a token the Lease's
// status records as issued. Tokens only grow, so such a token is refused
// by decide whatever etcd holds now: below a newer grant's, with no holder,
// or below an issued token after etcd regressed. The status comes from the
// informer cache, a prefix of what the controller wrote: a lagging cache
// only refuses less here, and decide sees the rest. (Under Monotonic, a
// token below the last issued one passes while nobody holds the lease, so
// only etcd can tell.) Tokenless writes are left to decide: under
// bindIdentity they need the live holder. nil means: ask etcd.
func refuseWithoutEtcd(w write, lease *fencerv1.Lease) *Denial {
	if w.tokenless != "" {
		return nil
	}
	f := facts{w: w}
	// The current token and holder, as the status has them: these refusals
	// do not read etcd.
	if lease.Status.Holder != "" {
		f.live.Grant = &etcdstore.Grant{Token: lease.Status.Token, GrantValue: etcdstore.GrantValue{Holder: lease.Status.Holder}}
	}
	offered, d := parseOffer(f, lease)
	if d != nil {
		return d
	}
	if d := checkRecord(f, offered); d != nil {
		return d
	}
	if top := lease.Status.HighestToken(); lease.Spec.Policy != fencerv1.PolicyMonotonic && offered < top {
		return f.deny(fencerv1.DenialSuperseded, "stale token %d for lease %s: token %d has been issued since, as the Lease's status records", offered, w.leaseRef, top)
	}
	return nil
}

// parseOffer reads the token the write sent: present, plain decimal, and
// positive (an absent etcd key's CreateRevision is 0: no grant has token 0).
func parseOffer(f facts, lease *fencerv1.Lease) (int64, *Denial) {
	offered, err := fencerv1.ParseToken(f.w.offered)
	if errors.Is(err, fencerv1.ErrMissingToken) {
		return 0, f.deny(fencerv1.DenialMissingToken, "this write sends no fencing token for lease %s: every write to a fenced object must set the annotation %s to the holder's token itself; a token stored on the object by an earlier write does not count",
			f.w.leaseRef, fencerv1.TokenAnnotation)
	}
	if err == nil && offered <= 0 {
		err = &fencerv1.MalformedTokenError{Value: f.w.offered, Reason: "a fencing token is positive"}
	}
	if err != nil {
		return 0, f.deny(fencerv1.DenialMalformed, "%v for lease %s: the annotation %s must be the decimal token from the holder pod's %s%s annotation (or, under tokenDelivery LeaseStatus, the Lease's status.token)",
			err, f.w.leaseRef, fencerv1.TokenAnnotation, fencerv1.HolderTokenAnnotationPrefix, lease.Name)
	}
	return offered, nil
}

// checkRegressed refuses every write while etcd's live grant is below a
// token the Lease already issued (etcd restored from an old snapshot).
func checkRegressed(f facts, lease *fencerv1.Lease) *Denial {
	if g := f.live.Grant; g != nil && g.Token < lease.Status.HighestToken() {
		return f.deny(fencerv1.DenialRegressed, "lease %s: etcd's grant (token %d) is below token %d this Lease already issued, so etcd was restored from an old snapshot; no write is accepted until fencer grants again",
			f.w.leaseRef, g.Token, lease.Status.HighestToken())
	}
	// With nobody holding the Lease, the status alone says what was issued,
	// and etcd's revision bounds it: no token above the revision of a read
	// made now was ever issued. A status above it was not written from
	// this etcd's grants, and is not trusted for a last-issued token.
	if rev := f.live.Revision; f.live.Grant == nil && rev > 0 && rev < lease.Status.HighestToken() {
		return f.deny(fencerv1.DenialRegressed, "lease %s: the Lease's status records token %d as issued, above etcd's revision %d, so etcd was restored from an old snapshot (or the status was not written by fencer); no write is accepted until fencer grants again",
			f.w.leaseRef, lease.Status.HighestToken(), rev)
	}
	return nil
}

// checkSameLease refuses every write under a grant made for another Lease
// object of the same name: one deleted while its grant lived (with no
// fencer webhook to release it at the DELETE), or, to a view behind the
// apiserver, the Lease created in its place. Either way the Lease the
// write is judged against is not the one the token was issued for.
func checkSameLease(f facts, lease *fencerv1.Lease) *Denial {
	if g := f.live.Grant; g != nil && g.LeaseUID != "" && g.LeaseUID != string(lease.UID) {
		return f.deny(fencerv1.DenialLeaseReplaced, "lease %s: etcd's grant (token %d) was made for another Lease object of this name (UID %s), not this one (UID %s): the Lease was deleted and created again; no write is accepted until fencer grants this Lease",
			f.w.leaseRef, g.Token, g.LeaseUID, lease.UID)
	}
	return nil
}

// checkRecord is the per-object rule: never below the token of the object's
// last accepted write.
func checkRecord(f facts, offered int64) *Denial {
	if !f.w.hasRecord {
		return nil
	}
	recorded, err := fencerv1.ParseToken(f.w.recorded)
	if err != nil {
		// Only fencer writes the record; a damaged one must not switch
		// the per-object check off.
		return f.deny(fencerv1.DenialBelowObject, "the object's %s annotation is damaged (%v), so its last token is unknown and no write is accepted under lease %s; an exempt identity or an administrator must repair or remove it",
			fencerv1.WrittenTokenAnnotation, err, f.w.leaseRef)
	}
	if offered < recorded {
		return f.deny(fencerv1.DenialBelowObject, "stale token %d for lease %s: the object was last written under token %d, by a newer holder", offered, f.w.leaseRef, recorded)
	}
	return nil
}

// lastIssued is the highest token ever issued for lease: the live grant's,
// or, when nobody holds it, the newest the controller recorded. Anything
// above it was never issued, so it is forged, under every policy.
func lastIssued(lease *fencerv1.Lease, live etcdstore.Live) int64 {
	if live.Grant != nil {
		return live.Grant.Token
	}
	return lease.Status.HighestToken()
}

func checkPolicy(f facts, lease *fencerv1.Lease, offered int64) *Denial {
	g := f.live.Grant
	switch {
	case g == nil && lease.Spec.Policy == fencerv1.PolicyMonotonic:
		return nil // nothing newer exists to be protected from; the object check above still applies
	case g == nil:
		return f.deny(fencerv1.DenialNoHolder, "lease %s has no holder, so no token is current; token %d is refused until the lease is granted again", f.w.leaseRef, offered)
	case offered < g.Token:
		return f.deny(fencerv1.DenialBelowLive, "stale token %d for lease %s: current token is %d (holder %s)", offered, f.w.leaseRef, g.Token, g.Holder)
	}
	return nil
}

// decideTokenless is the one rule for writes that cannot carry a token:
// under bindIdentity the holder pod's own identity may make them; nobody
// else may (exempt lifecycle identities never get here).
func decideTokenless(f facts, lease *fencerv1.Lease) *Denial {
	if lease.Spec.BindIdentity && checkIdentity(f) == nil {
		return nil
	}
	return f.deny(fencerv1.DenialTokenless, "%s cannot carry a fencing token, so it is refused on an object fenced by lease %s: first unfence the object with a write that sends the live token in %s and removes the label %s, then repeat this request%s",
		f.w.tokenless, f.w.leaseRef, fencerv1.TokenAnnotation, fencerv1.LeaseLabel, bindHint(lease))
}

func bindHint(lease *fencerv1.Lease) string {
	if lease.Spec.BindIdentity {
		return ", or send it from the holder pod's own service-account token"
	}
	return ""
}

// checkIdentity, for bindIdentity Leases, requires the request to come from
// the holder pod's own bound service-account token.
func checkIdentity(f facts) *Denial {
	g := f.live.Grant
	if g == nil {
		return f.deny(fencerv1.DenialNoHolder, "lease %s binds writes to its holder pod's identity, and it has no holder", f.w.leaseRef)
	}
	pod := first(f.w.user.Extra[podNameExtra])
	uid := first(f.w.user.Extra[podUIDExtra])
	ns, _, _ := strings.Cut(f.w.leaseRef, "/")
	// A bound token names the pod and its UID, and its username the
	// pod's namespace: all three must match the holder.
	if pod != g.Holder || uid != g.HolderUID || !strings.HasPrefix(f.w.user.Username, "system:serviceaccount:"+ns+":") {
		from := f.w.user.Username
		if pod != "" {
			from += " (pod " + pod + ")"
		}
		return f.deny(fencerv1.DenialIdentity, "lease %s binds writes to its holder pod %s (bindIdentity); this request comes from %s", f.w.leaseRef, g.Holder, from)
	}
	return nil
}

func first(v authenticationv1.ExtraValue) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
