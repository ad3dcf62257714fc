package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/go-logr/logr"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
)

// Paths where the manager serves the fencing webhooks.
const (
	// RecordPath is the mutating webhook that judges every CREATE and UPDATE
	// of a fenced object by the token the write itself sends, and moves that
	// offer into the record of the object's last accepted write.
	RecordPath = "/mutate-fenced"
	// Path validates the writes that cannot carry a token: DELETE and
	// subresource writes of labeled objects.
	Path = "/validate-fenced"
	// ParentPath validates subresource writes whose object carries no labels
	// (/scale, pods/eviction): the parent object says whether it is fenced.
	ParentPath = "/validate-fenced-parent"
)

// LiveLookup returns the live state of a Lease's etcd key, authoritatively.
type LiveLookup interface {
	Lookup(ctx context.Context, namespace, name string) (etcdstore.Live, error)
}

// Checker judges writes to fenced objects: Record is the mutating webhook,
// Validate the validating one.
type Checker struct {
	// Leases reads Lease objects (a LeaseView of the manager's cache).
	Leases LeaseReader
	// APIReader double-checks a Lease the cache has not seen yet.
	APIReader client.Reader
	Live      LiveLookup
	// Exempt identities pass every write: the lifecycle controllers.
	Exempt Exempt
	// Refusals traces every refused write (log, audit annotations, Event).
	Refusals *Refusals
}

// objectMeta is all the webhook reads of any object: its labels and
// annotations. Decoding only these, and not all of metav1.ObjectMeta, skips
// the allocations of managedFields, often most of an object's metadata, on
// every fenced write.
type objectMeta struct {
	Metadata metaFields `json:"metadata"`
}

// metaFields is the part of an object's metadata that the webhook reads.
type metaFields struct {
	Labels      stringMap `json:"labels"`
	Annotations stringMap `json:"annotations"`
	// DeletionTimestamp is only tested for presence: whether a write
	// may be a finalizer release (finalizersReleased), which needs a
	// full decode of both objects that most writes can skip.
	DeletionTimestamp present `json:"deletionTimestamp"`
}

// UnmarshalJSONFrom reads the metadata afresh, so that a second "metadata"
// replaces the first: the apiserver decodes an object into maps, where the
// last value of a name wins, and encoding/json would merge the two.
func (m *metaFields) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	type fields metaFields // without this method
	*m = metaFields{}
	return jsonv2.UnmarshalDecode(dec, (*fields)(m))
}

// stringMap is labels or annotations, read afresh for the same reason.
type stringMap map[string]string

func (s *stringMap) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	*s = nil
	return jsonv2.UnmarshalDecode(dec, (*map[string]string)(s))
}

// Record is the mutating webhook (RecordPath): it judges a CREATE or UPDATE
// of a fenced object and records the token it sent.
func (f *Checker) Record(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	reason, resp := f.record(ctx, req)
	f.observe(ctx, req, reason, &resp, start)
	return resp
}

// Validate is the validating webhook (Path): it judges the writes that
// cannot carry a token. CREATEs and UPDATEs of the object itself were judged
// by Record; the configuration's matchConditions do not send them here.
func (f *Checker) Validate(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	w, leaseName, d := parseTokenless(req)
	reason, resp := f.judge(ctx, req, w, leaseName, d)
	f.observe(ctx, req, reason, &resp, start)
	return resp
}

// record judges a CREATE or UPDATE and, when it passes, patches the object:
// the offer fencer.io/token is removed and becomes the record
// fencer.io/written-token. Since the stored object never keeps an offer, a
// later write that sends none has none. The apiserver runs mutating
// admission inside its optimistic-concurrency loop, against the exact object
// being replaced, so the per-object check and the write are one step.
func (f *Checker) record(ctx context.Context, req admission.Request) (Reason, admission.Response) {
	if req.SubResource != "" || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return ReasonNotFenced, admission.Allowed("not a write of the object itself")
	}
	w, leaseName, obj, old, d := parseWrite(req)
	if d == nil && leaseName != "" {
		// A lifecycle write (a finalizer or ownerReference removed) sends
		// no token and must not erase the record either.
		record, ok := recordOf(old, leaseName)
		switch {
		case beingDeleted(old) && finalizersReleased(req):
			// Whoever owns a finalizer (pvc-protection, say, which is no
			// exempt identity) must be able to remove it, or the object
			// hangs in deletion forever. The object is going away, and
			// nothing else changes.
			return ReasonFinalizersReleased, admission.Patched("finalizers removed from an object being deleted", recordPatch(obj, record, ok)...)
		case f.Exempt.Matches(req.UserInfo) && lifecycleOnly(req):
			return ReasonExempt, admission.Patched("exempt lifecycle identity", recordPatch(obj, record, ok)...)
		}
	}
	reason, resp := f.judge(ctx, req, w, leaseName, d)
	if resp.Allowed && leaseName != "" {
		resp = admission.Patched("", recordPatch(obj, w.offered, true)...)
	}
	return reason, resp
}

// observe counts a decision and traces it when it is a refusal.
func (f *Checker) observe(ctx context.Context, req admission.Request, reason Reason, resp *admission.Response, start time.Time) {
	op := string(req.Operation)
	metrics.AdmissionDecisions.WithLabelValues(op, resultOf(*resp), string(reason)).Inc()
	metrics.AdmissionSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if !resp.Allowed && f.Refusals != nil {
		f.Refusals.report(ctx, req, reason, resp)
	}
}

func resultOf(resp admission.Response) string {
	if resp.Allowed {
		return "allowed"
	}
	return "refused"
}

// judge decides a parsed write: for tokenless writes, exempt identities
// first (they may delete objects whose Lease is already gone); then the
// Lease and its live token.
func (f *Checker) judge(ctx context.Context, req admission.Request, w write, leaseName string, d *Denial) (Reason, admission.Response) {
	if d != nil {
		return d.Reason, denied(d)
	}
	if leaseName == "" {
		return ReasonNotFenced, admission.Allowed("not fenced")
	}
	if w.tokenless != "" && f.Exempt.Matches(req.UserInfo) {
		return ReasonExempt, admission.Allowed("exempt lifecycle identity")
	}
	// Built only for a refusal: most writes pass, and this is the hot path.
	log := func() logr.Logger {
		return ctrl.LoggerFrom(ctx).WithValues("lease", w.leaseRef, "operation", req.Operation, "kind", req.Kind.Kind,
			"subresource", req.SubResource, "object", req.Name, "user", req.UserInfo.Username)
	}
	lease, d := f.lease(ctx, req.Namespace, leaseName, w)
	if d != nil {
		return d.Reason, denied(d)
	}
	if d := refuseWithoutEtcd(w, lease); d != nil && !brokenForTests {
		return d.Reason, denied(d)
	}
	live, err := f.Live.Lookup(ctx, req.Namespace, leaseName)
	if err != nil {
		log().Error(err, "live token lookup failed")
		return ReasonLookupFailed, denied(lookupFailed(w, err))
	}
	d = decide(w, lease, live)
	if afresh(d, lease, live) && f.APIReader != nil {
		// Nobody holds the Lease, and under Monotonic a write may then pass:
		// what stops an older token is the newest token the status records
		// as issued, and the Lease's existence. The cache may be behind on
		// both (a Lease granted again and released since, or deleted), and
		// an acceptance must not rest on it, so read it afresh, after the
		// review arrived. The status records a token before any pod learns
		// it, so no token a write could have been accepted under is missing.
		if lease, d = leaseFrom(ctx, ReaderLeases{f.APIReader}, req.Namespace, leaseName, w); d == nil {
			if lease.Status.HighestToken() > live.Revision {
				// Read after etcd, the status records a grant made since
				// that read: judge it against etcd read again, not as a
				// status above etcd's revision (a restore's sign).
				if live, err = f.Live.Lookup(ctx, req.Namespace, leaseName); err != nil {
					log().Error(err, "live token lookup failed")
					return ReasonLookupFailed, denied(lookupFailed(w, err))
				}
			}
			d = decide(w, lease, live)
		}
	}
	if d != nil && !brokenForTests {
		return d.Reason, denied(d) // traced in observe (Refusals)
	}
	return ReasonAllowed, admission.Allowed("")
}

// lookupFailed refuses a write whose live token etcd did not give.
func lookupFailed(w write, err error) *Denial {
	return &Denial{Code: http.StatusServiceUnavailable, Reason: ReasonLookupFailed, Lease: w.leaseRef, Offered: w.offered,
		Message: fmt.Sprintf("fencer: cannot read the live token of lease %s from etcd (%v)%s; the write is refused because its token cannot be checked, retry", w.leaseRef, err, stalled(err))}
}

// afresh reports whether decision d, made from the cached Lease, must be
// made again from the Lease read afresh: an acceptance, or a token refused
// as forged (a newer status may show it issued), of a Monotonic Lease that
// nobody holds. Other refusals stand whatever the fresher Lease says.
func afresh(d *Denial, lease *fencerv1.Lease, live etcdstore.Live) bool {
	return live.Grant == nil && lease.Spec.Policy == fencerv1.PolicyMonotonic && (d == nil || d.Reason == fencerv1.DenialForged)
}

// lease fetches the fencing Lease, from the cache or, if the cache has not
// seen it, from the apiserver.
func (f *Checker) lease(ctx context.Context, namespace, name string, w write) (*fencerv1.Lease, *Denial) {
	lease, err := f.Leases.Lease(ctx, namespace, name)
	if err == nil {
		return lease, nil // the hot path: no error to classify
	}
	if apierrors.IsNotFound(err) && f.APIReader != nil {
		return leaseFrom(ctx, ReaderLeases{f.APIReader}, namespace, name, w)
	}
	return nil, leaseDenial(w, name, err)
}

// leaseFrom reads the fencing Lease from r, with lease's refusals.
func leaseFrom(ctx context.Context, r LeaseReader, namespace, name string, w write) (*fencerv1.Lease, *Denial) {
	lease, err := r.Lease(ctx, namespace, name)
	if err != nil {
		return nil, leaseDenial(w, name, err)
	}
	return lease, nil
}

// leaseDenial refuses a write whose fencing Lease could not be read (err
// is not nil).
func leaseDenial(w write, name string, err error) *Denial {
	if apierrors.IsNotFound(err) {
		return facts{w: w}.deny(fencerv1.DenialUnknownLease, "lease %s does not exist: objects labeled %s=%s can be written only while that Lease (leases.fencer.io) exists",
			w.leaseRef, fencerv1.LeaseLabel, name)
	}
	return &Denial{Code: http.StatusServiceUnavailable, Reason: ReasonLookupFailed, Lease: w.leaseRef,
		Message: fmt.Sprintf("fencer: cannot read lease %s from the apiserver (%v)%s; the write is refused because its token cannot be checked, retry", w.leaseRef, err, stalled(err))}
}

// stalled explains a read that answerDeadline cut short.
func stalled(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return ": no answer before the review's deadline, which comes ahead of the apiserver's webhook timeout"
	}
	return ""
}

func badRequest(format string, args ...any) *Denial {
	return &Denial{Code: http.StatusBadRequest, Reason: ReasonBadRequest, Message: "fencer: " + fmt.Sprintf(format, args...)}
}

// parseWrite extracts a CREATE or UPDATE of the object itself. leaseName
// is "" for writes that involve no fenced object.
func parseWrite(req admission.Request) (w write, leaseName string, obj, old *objectMeta, d *Denial) {
	w = write{user: req.UserInfo}
	if obj, old, d = decodeBoth(req); d != nil {
		return w, "", nil, nil, d
	}
	if obj == nil || (req.Operation == admissionv1.Update && old == nil) {
		return w, "", nil, nil, badRequest("%s needs the object (and, for UPDATE, the old object)", req.Operation)
	}
	newLease, oldLease := labelOf(obj), labelOf(old)
	if newLease != "" && oldLease != "" && newLease != oldLease {
		return w, "", nil, nil, facts{w: w}.deny(fencerv1.DenialLabelChange, "%s cannot change from %q to %q in one write: remove the label (with a token of lease %s), then add the new one",
			fencerv1.LeaseLabel, oldLease, newLease, oldLease)
	}
	// Removing the label is a write under the old lease.
	leaseName = firstOf(newLease, oldLease)
	if leaseName != "" {
		w.leaseRef = req.Namespace + "/" + leaseName
		w.offered = offerOf(obj, old)
		w.recorded, w.hasRecord = recordOf(old, leaseName)
		w.fencing = labelOf(old) != leaseName
	}
	return w, leaseName, obj, old, nil
}

// offerOf is the token the write itself sent. A fencer.io/token that the
// stored object already carried (written while it was unfenced, or before
// fencer kept records) was not sent by this write, whatever a merge patch
// or an apply left in the merged object.
func offerOf(obj, old *objectMeta) string {
	offer := obj.Metadata.Annotations[fencerv1.TokenAnnotation]
	if old != nil && old.Metadata.Annotations[fencerv1.TokenAnnotation] == offer {
		return ""
	}
	return offer
}

// parseTokenless extracts a write that cannot carry a token: a DELETE, or
// a write to a subresource, whose object carries the parent's labels.
func parseTokenless(req admission.Request) (write, string, *Denial) {
	w := write{user: req.UserInfo}
	obj, old, d := decodeBoth(req)
	if d != nil {
		return w, "", d
	}
	var lease string
	switch {
	case req.SubResource != "":
		// The subresource's object (a status write, say) carries the
		// parent's labels; none of its writes can carry a token.
		lease = firstOf(labelOf(old), labelOf(obj))
		w.tokenless = subresourceWrite(req)
		if changesFence(obj, old) {
			// Some status strategies keep metadata changes: a subresource
			// write must never unfence, refence or rewrite the record.
			w.leaseRef = req.Namespace + "/" + lease
			return w, lease, facts{w: w}.deny(fencerv1.DenialLabelChange, "%s may not change the label %s or the annotations %s and %s; write the object itself, with a token",
				w.tokenless, fencerv1.LeaseLabel, fencerv1.TokenAnnotation, fencerv1.WrittenTokenAnnotation)
		}
	case req.Operation == admissionv1.Delete:
		if old == nil {
			return w, "", badRequest("DELETE without the old object")
		}
		lease, w.tokenless = labelOf(old), "a DELETE"
	default:
		return w, "", nil
	}
	if lease != "" {
		w.leaseRef = req.Namespace + "/" + lease
	}
	return w, lease, nil
}

// lifecycleFields are what lifecycle controllers change on objects they do
// not own: the garbage collector's ownerReferences and finalizers.
var lifecycleFields = []string{"ownerReferences", "finalizers", "managedFields", "resourceVersion", "generation"}

// lifecycleOnly says whether an UPDATE changes nothing but lifecycleFields,
// so an exempt identity may make it without a token. Anything else it sends
// (a spec change by a controller manager running under one identity) is
// judged like any write.
func lifecycleOnly(req admission.Request) bool {
	_, _, ok := changesOnly(req, lifecycleFields)
	return ok
}

// gcFinalizers are the garbage collector's own finalizers. Removing one
// decides what happens to the object's dependents (orphan keeps them,
// foregroundDeletion deletes them first), and only the garbage collector,
// an exempt identity, removes them.
var gcFinalizers = map[string]bool{metav1.FinalizerOrphanDependents: true, metav1.FinalizerDeleteDependents: true}

// finalizersReleased says whether an UPDATE of an object that is already
// being deleted only removes finalizers other than the garbage
// collector's: no finalizer added, nothing else changed.
func finalizersReleased(req admission.Request) bool {
	obj, old, ok := changesOnly(req, []string{"finalizers", "managedFields", "resourceVersion"})
	if !ok || old["deletionTimestamp"] == nil {
		return false
	}
	oldF, okOld := stringList(old["finalizers"])
	newF, okNew := stringList(obj["finalizers"])
	if !okOld || !okNew || len(newF) >= len(oldF) {
		return false
	}
	kept := map[string]bool{}
	for _, f := range newF {
		kept[f] = true
	}
	for _, f := range newF {
		if !slices.Contains(oldF, f) {
			return false // added
		}
	}
	for _, f := range oldF {
		if !kept[f] && gcFinalizers[f] {
			return false // the garbage collector's to remove
		}
	}
	return true
}

// stringList reads a JSON list of strings (nil reads as empty); ok is false
// for anything else.
func stringList(v any) ([]string, bool) {
	list, ok := v.([]any)
	if v != nil && !ok {
		return nil, false
	}
	out := make([]string, 0, len(list))
	for _, e := range list {
		s, ok := e.(string)
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// changesOnly says whether an UPDATE changes nothing in the object but the
// metadata fields named (and the offer and record, which are restored from
// the old object either way). It returns the new and old metadata, with
// the named fields still in them.
func changesOnly(req admission.Request, fields []string) (objMeta, oldMeta map[string]any, ok bool) {
	if req.Operation != admissionv1.Update {
		return nil, nil, false
	}
	obj, errNew := decodeExact(req.Object.Raw)
	old, errOld := decodeExact(req.OldObject.Raw)
	if errNew != nil || errOld != nil {
		return nil, nil, false
	}
	objMeta, _ = obj["metadata"].(map[string]any)
	oldMeta, _ = old["metadata"].(map[string]any)
	kept := map[string][2]any{}
	for _, f := range fields {
		kept[f] = [2]any{objMeta[f], oldMeta[f]}
	}
	for _, meta := range []map[string]any{objMeta, oldMeta} {
		for _, f := range fields {
			delete(meta, f)
		}
		if ann, _ := meta["annotations"].(map[string]any); ann != nil {
			delete(ann, fencerv1.TokenAnnotation)
			delete(ann, fencerv1.WrittenTokenAnnotation)
			if len(ann) == 0 {
				delete(meta, "annotations")
			}
		}
	}
	same := reflect.DeepEqual(obj, old)
	for f, v := range kept {
		if objMeta != nil && v[0] != nil {
			objMeta[f] = v[0]
		}
		if oldMeta != nil && v[1] != nil {
			oldMeta[f] = v[1]
		}
	}
	return objMeta, oldMeta, same
}

// decodeExact decodes a JSON object keeping numbers as written, so two
// int64s that round to one float64 never compare equal.
func decodeExact(raw []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	return m, d.Decode(&m)
}

// changesFence says whether a subresource write changes what fencing rests
// on: the lease label, the offer or the record.
func changesFence(obj, old *objectMeta) bool {
	if obj == nil || old == nil {
		return false
	}
	if labelOf(obj) != labelOf(old) {
		return true
	}
	for _, k := range []string{fencerv1.TokenAnnotation, fencerv1.WrittenTokenAnnotation} {
		a, okA := obj.Metadata.Annotations[k]
		b, okB := old.Metadata.Annotations[k]
		if a != b || okA != okB {
			return true
		}
	}
	return false
}

// subresourceWrite names a subresource write in messages, e.g. "a UPDATE
// of the scale subresource".
func subresourceWrite(req admission.Request) string {
	return fmt.Sprintf("a %s of the %s subresource", req.Operation, req.SubResource)
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func decodeBoth(req admission.Request) (obj, old *objectMeta, d *Denial) {
	var err error
	if obj, err = decodeMeta(req.Object.Raw); err != nil {
		return nil, nil, badRequest("cannot read the object: %v", err)
	}
	if old, err = decodeMeta(req.OldObject.Raw); err != nil {
		return nil, nil, badRequest("cannot read the old object: %v", err)
	}
	return obj, old, nil
}

// decodeMeta reads an object's labels and annotations as the apiserver
// reads them: keys match case-sensitively. encoding/json would also take a
// stored top-level "Metadata" (a custom resource that keeps unknown fields
// may hold one) for "metadata", and fencer would judge labels the object
// does not have.
func decodeMeta(raw []byte) (*objectMeta, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	m := &objectMeta{}
	if err := jsonv2.Unmarshal(raw, m, asTheAPIServerReads); err != nil {
		return nil, err
	}
	return m, nil
}

// present records whether a JSON value other than null was there, without
// decoding it.
type present bool

func (p *present) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	kind := dec.PeekKind()
	if err := dec.SkipValue(); err != nil {
		return err
	}
	*p = kind != 'n'
	return nil
}

// beingDeleted says whether m carries a deletionTimestamp (a CREATE has no
// old object, so is not).
func beingDeleted(m *objectMeta) bool {
	return m != nil && bool(m.Metadata.DeletionTimestamp)
}

func labelOf(m *objectMeta) string {
	if m == nil {
		return ""
	}
	return m.Metadata.Labels[fencerv1.LeaseLabel]
}

// recordOf is the token of old's last accepted write under lease: its
// record, or, for an object written before fencer kept records, the token it
// still carries. ok is false when old was not fenced by lease: the record of
// an unfenced object is not trusted (anyone may have written it while the
// webhook was not looking), so a write that fences an object must instead
// send the newest token issued (decide).
func recordOf(old *objectMeta, lease string) (record string, ok bool) {
	if old == nil || labelOf(old) != lease {
		return "", false
	}
	ann := old.Metadata.Annotations
	if r, ok := ann[fencerv1.WrittenTokenAnnotation]; ok {
		return r, true
	}
	r, ok := ann[fencerv1.TokenAnnotation]
	return r, ok
}

// recordPatch makes obj's annotations hold record as the last accepted
// write's token, exactly (an empty or damaged record is kept as it is), or
// no record when keep is false; and no offer.
func recordPatch(obj *objectMeta, record string, keep bool) []jsonpatch.JsonPatchOperation {
	ann := obj.Metadata.Annotations
	ops := make([]jsonpatch.JsonPatchOperation, 0, 2) // at most two: one allocation
	if _, ok := ann[fencerv1.TokenAnnotation]; ok {
		ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "remove", Path: offerPath})
	}
	cur, has := ann[fencerv1.WrittenTokenAnnotation]
	switch {
	case !keep && has:
		ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "remove", Path: recordPath})
	case keep && ann == nil:
		ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/annotations", Value: map[string]string{fencerv1.WrittenTokenAnnotation: record}})
	case keep && (!has || cur != record):
		// "add" replaces an existing member (RFC 6902).
		ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "add", Path: recordPath, Value: record})
	}
	if len(ops) == 0 {
		return nil
	}
	return ops
}

// annotationPath is the JSON pointer of an annotation (RFC 6901 escapes).
func annotationPath(key string) string {
	return "/metadata/annotations/" + pointerEscaper.Replace(key)
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// The paths every accepted write's patch names, escaped once.
var (
	offerPath  = annotationPath(fencerv1.TokenAnnotation)
	recordPath = annotationPath(fencerv1.WrittenTokenAnnotation)
)

var statusReasons = map[int32]metav1.StatusReason{
	http.StatusConflict:           metav1.StatusReasonConflict,
	http.StatusForbidden:          metav1.StatusReasonForbidden,
	http.StatusBadRequest:         metav1.StatusReasonBadRequest,
	http.StatusServiceUnavailable: metav1.StatusReasonServiceUnavailable,
}

// denied is the AdmissionResponse of d: its code, message and one
// StatusCause per fact, which the apiserver passes on to the client.
func denied(d *Denial) admission.Response {
	resp := admission.Denied(d.Message)
	resp.Result.Code = d.Code
	resp.Result.Reason = statusReasons[d.Code]
	causes := make([]metav1.StatusCause, 1, 6) // the reason, and the facts of a lease
	causes[0] = metav1.StatusCause{Type: fencerv1.CauseReason, Message: string(d.Reason)}
	if d.Lease != "" {
		causes = append(causes,
			metav1.StatusCause{Type: fencerv1.CauseLease, Message: d.Lease},
			metav1.StatusCause{Type: fencerv1.CauseOfferedToken, Message: d.Offered},
			metav1.StatusCause{Type: fencerv1.CauseRecordedToken, Message: d.Recorded},
			metav1.StatusCause{Type: fencerv1.CauseCurrentToken, Message: fencerv1.FormatToken(d.Current)},
			metav1.StatusCause{Type: fencerv1.CauseHolder, Message: d.Holder})
	}
	resp.Result.Details = &metav1.StatusDetails{Causes: causes}
	return resp
}
