package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
)

// Path is where the manager serves the fencing webhook.
const Path = "/validate-fenced"

// LiveLookup returns the live state of a Lease's etcd key, authoritatively.
type LiveLookup interface {
	Lookup(ctx context.Context, namespace, name string) (etcdstore.Live, error)
}

// Fence is the admission handler for fenced objects.
type Fence struct {
	// Leases reads Lease objects (the manager's cache).
	Leases client.Reader
	// APIReader double-checks a Lease the cache has not seen yet.
	APIReader client.Reader
	Live      LiveLookup
}

var _ admission.Handler = &Fence{}

// objectMeta is all the webhook reads of any object.
type objectMeta struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}

// Handle decides one AdmissionReview.
func (f *Fence) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	op := string(req.Operation)
	reason, resp := f.handle(ctx, req)
	metrics.AdmissionDecisions.WithLabelValues(op, resultOf(resp), string(reason)).Inc()
	metrics.AdmissionSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	return resp
}

func resultOf(resp admission.Response) string {
	if resp.Allowed {
		return "allowed"
	}
	return "refused"
}

func (f *Fence) handle(ctx context.Context, req admission.Request) (Reason, admission.Response) {
	w, leaseName, d := parse(req)
	if d != nil {
		return d.Reason, denied(d)
	}
	if leaseName == "" {
		return ReasonNotFenced, admission.Allowed("not fenced")
	}
	log := ctrl.LoggerFrom(ctx).WithValues("lease", w.leaseRef, "operation", req.Operation, "kind", req.Kind.Kind, "object", req.Name)
	lease, d := f.lease(ctx, req.Namespace, leaseName, w.leaseRef)
	if d != nil {
		return d.Reason, denied(d)
	}
	live, err := f.Live.Lookup(ctx, req.Namespace, leaseName)
	if err != nil {
		log.Error(err, "live token lookup failed")
		return ReasonLookupFailed, denied(&Denial{Code: http.StatusServiceUnavailable, Reason: ReasonLookupFailed,
			Message: fmt.Sprintf("fencer: cannot read the live token of lease %s from etcd (%v); the write is refused because its token cannot be checked, retry", w.leaseRef, err)})
	}
	if d := decide(w, lease, live); d != nil && !brokenForTests {
		log.V(1).Info("refused", "reason", d.Reason, "message", d.Message)
		return d.Reason, denied(d)
	}
	return ReasonAllowed, admission.Allowed("")
}

// lease fetches the fencing Lease, from the cache or, if the cache has not
// seen it, from the apiserver.
func (f *Fence) lease(ctx context.Context, namespace, name, ref string) (*v1.Lease, *Denial) {
	lease := &v1.Lease{}
	key := client.ObjectKey{Namespace: namespace, Name: name}
	err := f.Leases.Get(ctx, key, lease)
	if apierrors.IsNotFound(err) && f.APIReader != nil {
		err = f.APIReader.Get(ctx, key, lease)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, deny(ReasonUnknownLease, "lease %s does not exist: objects labeled %s=%s can be written only while that Lease (leases.fencer.io) exists", ref, LeaseLabel, name)
	case err != nil:
		return nil, &Denial{Code: http.StatusServiceUnavailable, Reason: ReasonLookupFailed, Message: fmt.Sprintf("fencer: cannot read lease %s: %v", ref, err)}
	}
	return lease, nil
}

// parse extracts the write from the request. leaseName is "" for writes that
// involve no fenced object.
func parse(req admission.Request) (write, string, *Denial) {
	w := write{user: req.UserInfo}
	var obj, old *objectMeta
	var err error
	if obj, err = decodeMeta(req.Object.Raw); err != nil {
		return w, "", &Denial{Code: http.StatusBadRequest, Reason: ReasonBadRequest, Message: "fencer: cannot read the object: " + err.Error()}
	}
	if old, err = decodeMeta(req.OldObject.Raw); err != nil {
		return w, "", &Denial{Code: http.StatusBadRequest, Reason: ReasonBadRequest, Message: "fencer: cannot read the old object: " + err.Error()}
	}
	newLease, oldLease := labelOf(obj), labelOf(old)

	switch req.Operation {
	case admissionv1.Create:
		if obj == nil {
			return w, "", &Denial{Code: http.StatusBadRequest, Reason: ReasonBadRequest, Message: "fencer: CREATE without an object"}
		}
		w.offered = annotationOf(obj)
	case admissionv1.Update:
		if obj == nil || old == nil {
			return w, "", &Denial{Code: http.StatusBadRequest, Reason: ReasonBadRequest, Message: "fencer: UPDATE needs the object and the old object"}
		}
		if newLease != "" && oldLease != "" && newLease != oldLease {
			return w, "", deny(ReasonLabelChange, "%s cannot change from %q to %q in one write: remove the label (with a token of lease %s), then add the new one", LeaseLabel, oldLease, newLease, oldLease)
		}
		w.offered = annotationOf(obj)
		if newLease == oldLease {
			w.recorded = annotationOf(old)
		}
		if newLease == "" {
			newLease = oldLease // removing the label is a write under the old lease
		}
	case admissionv1.Delete:
		if old == nil {
			return w, "", &Denial{Code: http.StatusBadRequest, Reason: ReasonBadRequest, Message: "fencer: DELETE without the old object"}
		}
		// A delete carries no annotations: it is judged by the token of the
		// last write to the object, so only an object last written under the
		// live token can be deleted.
		w.offered = annotationOf(old)
		newLease = oldLease
	default:
		return w, "", nil
	}
	if newLease != "" {
		w.leaseRef = req.Namespace + "/" + newLease
	}
	return w, newLease, nil
}

func decodeMeta(raw []byte) (*objectMeta, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	m := &objectMeta{}
	if err := json.Unmarshal(raw, m); err != nil {
		return nil, err
	}
	return m, nil
}

func labelOf(m *objectMeta) string {
	if m == nil {
		return ""
	}
	return m.Metadata.Labels[LeaseLabel]
}

func annotationOf(m *objectMeta) string {
	if m == nil {
		return ""
	}
	return m.Metadata.Annotations[TokenAnnotation]
}

var statusReasons = map[int32]metav1.StatusReason{
	http.StatusConflict:           metav1.StatusReasonConflict,
	http.StatusBadRequest:         metav1.StatusReasonBadRequest,
	http.StatusServiceUnavailable: metav1.StatusReasonServiceUnavailable,
}

func denied(d *Denial) admission.Response {
	resp := admission.Denied(d.Message)
	resp.Result.Code = d.Code
	resp.Result.Reason = statusReasons[d.Code]
	return resp
}
