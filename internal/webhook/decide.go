// Package webhook is fencer's validating admission webhook: it refuses writes
// to fenced Kubernetes objects whose fencing token is stale, forged or
// missing (docs/webhook.md).
package webhook

import (
	"errors"
	"fmt"
	"net/http"

	authenticationv1 "k8s.io/api/authentication/v1"

	v1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/token"
)

// The label that fences an object, and the annotation each write carries.
const (
	LeaseLabel      = "fencer.io/lease"
	TokenAnnotation = "fencer.io/token"
)

// The pod-name and pod-uid claims of a bound service-account token, as the
// apiserver passes them in userInfo.extra.
const (
	podNameExtra = "authentication.kubernetes.io/pod-name"
	podUIDExtra  = "authentication.kubernetes.io/pod-uid"
)

// Reason labels a decision, in metrics and in Denial.
type Reason string

// Reasons for refusing, and for allowing, a write.
const (
	ReasonAllowed      Reason = "Allowed"
	ReasonMissingToken Reason = "MissingToken"
	ReasonMalformed    Reason = "MalformedToken"
	ReasonForged       Reason = "ForgedToken"
	ReasonBelowObject  Reason = "BelowObjectToken"
	ReasonNotCurrent   Reason = "NotCurrentToken"
	ReasonBelowLive    Reason = "BelowLiveToken"
	ReasonNoHolder     Reason = "NoHolder"
	ReasonIdentity     Reason = "NotHolderIdentity"
	ReasonUnknownLease Reason = "UnknownLease"
	ReasonLabelChange  Reason = "LeaseLabelChanged"
	ReasonLookupFailed Reason = "LookupFailed"
	ReasonBadRequest   Reason = "BadRequest"
	ReasonNotFenced    Reason = "NotFenced"
	ReasonUnchecked    Reason = "UncheckedOperation"
)

// Denial is a refused write: an HTTP code and a message a person can act on.
type Denial struct {
	Code    int32
	Reason  Reason
	Message string
}

func (d *Denial) Error() string { return d.Message }

func deny(reason Reason, format string, args ...any) *Denial {
	return &Denial{Code: http.StatusConflict, Reason: reason, Message: "fencer: " + fmt.Sprintf(format, args...)}
}

// write is what the decision needs to know about one admission request.
type write struct {
	// leaseRef is namespace/name of the fencing Lease, for messages.
	leaseRef string
	// offered is the token the write carries (the new object's annotation;
	// for DELETE, the token recorded on the object being deleted).
	offered string
	// recorded is the token on the object being replaced, "" if none or if
	// it was fenced by another lease.
	recorded string
	user     authenticationv1.UserInfo
}

// decide applies the rules of docs/webhook.md to one write, given the Lease
// and the live state of its etcd key. nil means allowed.
func decide(w write, lease *v1.Lease, live etcdstore.Live) *Denial {
	offered, err := token.Parse(w.offered)
	if errors.Is(err, token.ErrMissing) {
		return deny(ReasonMissingToken, "missing fencing token for lease %s: set the annotation %s to the holder's token%s", w.leaseRef, TokenAnnotation, liveSuffix(live))
	}
	if err != nil {
		return deny(ReasonMalformed, "%v for lease %s: the annotation %s must be the decimal token from the holder pod's lease.fencer.io/%s annotation", err, w.leaseRef, TokenAnnotation, lease.Name)
	}
	if offered > live.Revision {
		return deny(ReasonForged, "forged token %d for lease %s: no token above %d has been issued", offered, w.leaseRef, live.Revision)
	}
	if recorded, err := token.Parse(w.recorded); err == nil && offered < recorded {
		return deny(ReasonBelowObject, "stale token %d for lease %s: the object already carries token %d, written by a newer holder", offered, w.leaseRef, recorded)
	}
	if d := checkPolicy(w, lease, live, offered); d != nil {
		return d
	}
	if lease.Spec.BindIdentity {
		return checkIdentity(w, live)
	}
	return nil
}

func checkPolicy(w write, lease *v1.Lease, live etcdstore.Live, offered int64) *Denial {
	g := live.Grant
	switch {
	case g == nil && lease.Spec.Policy == v1.PolicyMonotonic:
		return nil // nothing newer exists to be protected from; the object check above still applies
	case g == nil:
		return deny(ReasonNoHolder, "lease %s has no holder, so no token is current; token %d is refused until the lease is granted again", w.leaseRef, offered)
	case offered < g.Token:
		return deny(ReasonBelowLive, "stale token %d for lease %s: current token is %d (holder %s)", offered, w.leaseRef, g.Token, g.Holder)
	case offered > g.Token && lease.Spec.Policy != v1.PolicyMonotonic:
		return deny(ReasonNotCurrent, "token %d is not the current token of lease %s: current token is %d (holder %s)", offered, w.leaseRef, g.Token, g.Holder)
	}
	return nil
}

// checkIdentity, for bindIdentity Leases, requires the request to come from
// the holder pod's own bound service-account token.
func checkIdentity(w write, live etcdstore.Live) *Denial {
	if live.Grant == nil {
		return deny(ReasonNoHolder, "lease %s binds writes to its holder pod's identity, and it has no holder", w.leaseRef)
	}
	pod := first(w.user.Extra[podNameExtra])
	uid := first(w.user.Extra[podUIDExtra])
	if pod != live.Grant.Holder || (uid != "" && uid != live.Grant.HolderUID) {
		from := w.user.Username
		if pod != "" {
			from += " (pod " + pod + ")"
		}
		return deny(ReasonIdentity, "lease %s binds writes to its holder pod %s (bindIdentity); this request comes from %s", w.leaseRef, live.Grant.Holder, from)
	}
	return nil
}

func first(v authenticationv1.ExtraValue) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func liveSuffix(live etcdstore.Live) string {
	if live.Grant == nil {
		return " (the lease has no holder now)"
	}
	return fmt.Sprintf(" (current token is %d, holder %s)", live.Grant.Token, live.Grant.Holder)
}
