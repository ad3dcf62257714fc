package webhook

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// RefusalEventInterval is the least time between two Warning Events for
// refused writes on one Lease: a client retrying in a loop costs one Event
// per interval, not one per attempt. Every refusal is counted in the
// metric and the audit annotations; the log line is subject to the
// logger's sampling (controller-runtime's production logger: the first 100
// a second, then every 100th), so a flood does not flood the log.
const RefusalEventInterval = 10 * time.Second

// ReasonWriteRefused is the reason of the Warning Event on a Lease when a
// write to an object it fences was refused.
const ReasonWriteRefused = "WriteRefused"

// podNameKey is the user info extra that names the pod a service account
// token was issued for (bound tokens, Kubernetes 1.30+).
const podNameKey = "authentication.kubernetes.io/pod-name"

// Refusals makes every refused write traceable to its sender: a log line at
// the default level, audit annotations that the apiserver's audit log
// records with the request, and a rate-limited Warning Event on the Lease.
type Refusals struct {
	// Recorder emits the Events; nil emits none.
	Recorder events.EventRecorder
	// Leases reads the Lease an Event goes on (the manager's cache).
	Leases LeaseReader

	mu   sync.Mutex
	last map[string]time.Time // Lease namespace/name -> last Event
	now  func() time.Time
}

// causes are what a refusal's StatusCauses say, by cause type.
type causes map[metav1.CauseType]string

func causesOf(resp admission.Response) causes {
	f := causes{}
	if resp.Result != nil && resp.Result.Details != nil {
		for _, c := range resp.Result.Details.Causes {
			f[c.Type] = c.Message
		}
	}
	return f
}

// report traces one refusal, adding its audit annotations to resp.
func (r *Refusals) report(ctx context.Context, req admission.Request, reason Reason, resp *admission.Response) {
	f := causesOf(*resp)
	requester := req.UserInfo.Username
	pod := strings.Join(req.UserInfo.Extra[podNameKey], ",")
	groups := append([]string(nil), req.UserInfo.Groups...)
	sort.Strings(groups)
	dryRun := req.DryRun != nil && *req.DryRun
	// The fields are built here, for refusals only: most writes pass.
	ctrl.LoggerFrom(ctx).Info("refused a write to a fenced object",
		"reason", reason, "user", requester, "groups", groups, "pod", pod, "dryRun", dryRun, "uid", req.UID,
		"namespace", req.Namespace, "name", req.Name, "resource", req.Resource.Resource,
		"operation", req.Operation, "kind", req.Kind.Kind, "subresource", req.SubResource,
		"lease", f[fencerv1.CauseLease], "offeredToken", f[fencerv1.CauseOfferedToken],
		"recordedToken", f[fencerv1.CauseRecordedToken], "currentToken", f[fencerv1.CauseCurrentToken],
		"holder", f[fencerv1.CauseHolder])
	audit := map[string]string{"decision": "refused", "reason": string(reason)}
	for key, cause := range map[string]metav1.CauseType{
		"lease": fencerv1.CauseLease, "offered-token": fencerv1.CauseOfferedToken, "current-token": fencerv1.CauseCurrentToken,
	} {
		if v, ok := f[cause]; ok {
			audit[key] = v
		}
	}
	if resp.AuditAnnotations == nil {
		resp.AuditAnnotations = map[string]string{}
	}
	for k, v := range audit {
		resp.AuditAnnotations[k] = v // the apiserver prefixes them with the webhook's name
	}
	if !dryRun { // a dry run (kubectl fencer check) asked; nothing was attempted
		r.event(ctx, req, reason, f[fencerv1.CauseLease], requester, pod, f)
	}
}

// event puts a Warning Event on the Lease, at most one per Lease per
// RefusalEventInterval.
func (r *Refusals) event(ctx context.Context, req admission.Request, reason Reason, leaseRef, requester, pod string, f causes) {
	ns, name, ok := strings.Cut(leaseRef, "/")
	if r == nil || r.Recorder == nil || !ok || !r.allow(leaseRef) {
		return
	}
	shared, err := r.Leases.Lease(ctx, ns, name)
	if err != nil {
		return // an unknown Lease: the log line and the metric remain
	}
	// The Event names the Lease; the shared object itself is not handed on.
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: shared.UID, ResourceVersion: shared.ResourceVersion}}
	who := requester
	if pod != "" {
		who += " (pod " + pod + ")"
	}
	r.Recorder.Eventf(lease, nil, corev1.EventTypeWarning, ReasonWriteRefused, string(req.Operation),
		"%s of %s %s/%s by %s refused (%s): offered token %q, current token %s; at most one such Event per %s",
		req.Operation, req.Kind.Kind, req.Namespace, req.Name, who, reason,
		f[fencerv1.CauseOfferedToken], f[fencerv1.CauseCurrentToken], RefusalEventInterval)
}

func (r *Refusals) allow(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.now != nil {
		now = r.now()
	}
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	if at, ok := r.last[key]; ok && now.Sub(at) < RefusalEventInterval {
		return false
	}
	// Forget old entries so that the map stays as small as the set of
	// Leases with recent refusals.
	for k, at := range r.last {
		if now.Sub(at) >= RefusalEventInterval {
			delete(r.last, k)
		}
	}
	r.last[key] = now
	return true
}
