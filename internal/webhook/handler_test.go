package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

type fakeLive struct {
	live etcdstore.Live
	err  error
}

func (f fakeLive) Lookup(context.Context, string, string) (etcdstore.Live, error) {
	return f.live, f.err
}

func newChecker(t testing.TB, live LiveLookup) *Checker {
	t.Helper()
	s := runtime.NewScheme()
	utilruntime.Must(fencerv1.AddToScheme(s))
	return &Checker{Leases: leaseClient(testLease(fencerv1.PolicyCurrent, false)), Live: live, Exempt: NewExempt(DefaultExemptUsers, nil)}
}

// obj is a ConfigMap as a write sends it: labeled by lease, offering tok.
func obj(lease, tok string) []byte { return stored(lease, tok, "") }

// stored is a ConfigMap with an offer and a record of the last write.
func stored(lease, offer, record string) []byte {
	m := metav1.ObjectMeta{Name: "cm", Namespace: "default", Labels: map[string]string{}, Annotations: map[string]string{}}
	if lease != "" {
		m.Labels[fencerv1.LeaseLabel] = lease
	}
	if offer != "" {
		m.Annotations[fencerv1.TokenAnnotation] = offer
	}
	if record != "" {
		m.Annotations[fencerv1.WrittenTokenAnnotation] = record
	}
	raw, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": m})
	return raw
}

func emptyLabel() []byte {
	return []byte(`{"metadata":{"name":"cm","namespace":"default","labels":{"fencer.io/lease":""}}}`)
}

func request(op admissionv1.Operation, object, old []byte) admission.Request {
	r := admission.Request{}
	r.UID = "1"
	r.Operation = op
	r.Namespace = "default"
	r.Name = "cm"
	r.Kind = metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	r.Object.Raw = object
	r.OldObject.Raw = old
	return r
}

func TestRecord(t *testing.T) {
	f := newChecker(t, fakeLive{live: held(42, 50)})
	record := func(v string) []jsonpatch.JsonPatchOperation {
		return []jsonpatch.JsonPatchOperation{
			{Operation: "remove", Path: "/metadata/annotations/fencer.io~1token"},
			{Operation: "add", Path: "/metadata/annotations/fencer.io~1written-token", Value: v},
		}
	}
	cases := []struct {
		name  string
		req   admission.Request
		code  int32 // 0: allowed
		msg   string
		patch []jsonpatch.JsonPatchOperation
	}{
		{"create with the live token", request(admissionv1.Create, obj("report", "42"), nil), 0, "", record("42")},
		{"create with a stale token", request(admissionv1.Create, obj("report", "41"), nil), 409, "stale token 41 for lease default/report: current token is 42 (holder reporter-b)", nil},
		{"create unfenced", request(admissionv1.Create, obj("", ""), nil), 0, "", nil},
		{"an empty lease label names no lease (the helm test probe)", request(admissionv1.Create, emptyLabel(), nil), 0, "", nil},
		{"setting the lease label empty is removing it", request(admissionv1.Update, emptyLabel(), stored("report", "", "42")), 409, "this write sends no fencing token for lease default/report", nil},
		{"create sending only a record", request(admissionv1.Create, stored("report", "", "42"), nil), 409, "this write sends no fencing token", nil},
		{"update lowering the object's token", request(admissionv1.Update, obj("report", "41"), stored("report", "", "42")), 409, "the object was last written under token 42", nil},
		{"update with the live token", request(admissionv1.Update, stored("report", "42", "41"), stored("report", "", "41")), 0, "", record("42")},
		{"merge patch without a token: the record does not count", request(admissionv1.Update, stored("report", "", "42"), stored("report", "", "42")), 409, "this write sends no fencing token", nil},
		{"a token the stored object already carried was not sent", request(admissionv1.Update, obj("report", "42"), obj("report", "42")), 409, "this write sends no fencing token", nil},
		{"label removal with a stale token", request(admissionv1.Update, stored("", "41", "42"), stored("report", "", "42")), 409, "stale token 41 for lease default/report", nil},
		{"label removal under Monotonic is still checked against the record", request(admissionv1.Update, stored("", "40", "42"), stored("report", "", "42")), 409, "last written under token 42", nil},
		{"label removal without a token", request(admissionv1.Update, stored("", "", "42"), stored("report", "", "42")), 409, "this write sends no fencing token for lease default/report", nil},
		{"label removal with the live token", request(admissionv1.Update, stored("", "42", "42"), stored("report", "", "42")), 0, "", record("42")[:1]},
		{"label change", request(admissionv1.Update, obj("other", "42"), stored("report", "", "42")), 409, `fencer.io/lease cannot change from "report" to "other"`, nil},
		{"label added: an unfenced object's record is not trusted; the newest token fences it", request(admissionv1.Update, stored("report", "42", "99"), stored("", "", "99")), 0, "", record("42")},
		{"label added to an object with no record", request(admissionv1.Update, stored("report", "42", ""), stored("", "", "")), 0, "", record("42")},
		{"token 0", request(admissionv1.Create, obj("report", "0"), nil), 409, "a fencing token is positive", nil},
		{"unknown lease", request(admissionv1.Create, obj("ghost", "42"), nil), 409, "lease default/ghost does not exist", nil},
		{"malformed object JSON", request(admissionv1.Create, []byte("{not json"), nil), 400, "fencer: cannot read the object", nil},
		{"update without the old object", request(admissionv1.Update, obj("report", "42"), nil), 400, "UPDATE needs the object", nil},
		{"exempt identity changing more than lifecycle fields is judged", as(request(admissionv1.Update, []byte(`{"metadata":{"name":"cm","labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/written-token":"42"}},"data":{"v":"new"}}`),
			stored("report", "", "42")), "system:kube-controller-manager"), 409, "this write sends no fencing token", nil},
		{"exempt identity keeps even a damaged record", as(request(admissionv1.Update, []byte(`{"metadata":{"name":"cm","labels":{"fencer.io/lease":"report"}}}`), []byte(`{"metadata":{"name":"cm","labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/written-token":""}}}`)), "system:serviceaccount:kube-system:generic-garbage-collector"), 0, "",
			[]jsonpatch.JsonPatchOperation{{Operation: "add", Path: "/metadata/annotations", Value: map[string]string{"fencer.io/written-token": ""}}}},
		{"exempt identity removing the lease label is judged: labels are no lifecycle field", as(request(admissionv1.Update, stored("", "", "42"), stored("report", "", "42")),
			"system:serviceaccount:kube-system:generic-garbage-collector"), 409, "this write sends no fencing token for lease default/report", nil},
		{"exempt identity adding a label is judged", as(request(admissionv1.Update,
			[]byte(`{"metadata":{"name":"cm","labels":{"fencer.io/lease":"report","team":"a"},"annotations":{"fencer.io/written-token":"42"}}}`), stored("report", "", "42")),
			"system:kube-controller-manager"), 409, "this write sends no fencing token", nil},
		{"an object written before fencer kept records: the token it carries is its record", request(admissionv1.Update, obj("report", "41"), obj("report", "42")), 409, "the object was last written under token 42", nil},
		{"exempt identity changing a big integer is judged", as(request(admissionv1.Update,
			[]byte(`{"metadata":{"name":"cm","labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/written-token":"42"}},"spec":{"n":9007199254740993}}`),
			[]byte(`{"metadata":{"name":"cm","labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/written-token":"42"}},"spec":{"n":9007199254740992}}`)), "system:kube-controller-manager"), 409, "this write sends no fencing token", nil},
		{"any identity removes a finalizer from an object being deleted, and the record stays", as(request(admissionv1.Update,
			deleting(`["a"]`, ""), deleting(`["a","kubernetes.io/pvc-protection"]`, "")), "system:serviceaccount:kube-system:pvc-protection-controller"), 0, "", nil},
		{"removing the last finalizer", request(admissionv1.Update, deleting(`[]`, ""), deleting(`["x"]`, "")), 0, "", nil},
		{"the garbage collector's orphan finalizer is its own to remove", request(admissionv1.Update, deleting(`["a"]`, ""), deleting(`["a","orphan"]`, "")), 409, "this write sends no fencing token", nil},
		{"the garbage collector's foregroundDeletion finalizer is its own to remove", request(admissionv1.Update, deleting(`[]`, ""), deleting(`["foregroundDeletion"]`, "")), 409, "this write sends no fencing token", nil},
		{"a finalizer that is no string is judged, never a panic", request(admissionv1.Update, deleting(`[]`, ""), deleting(`[{"a":1}]`, "")), 409, "this write sends no fencing token", nil},
		{"a finalizer removed from an object not being deleted is judged", request(admissionv1.Update,
			[]byte(`{"metadata":{"name":"cm","labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/written-token":"42"},"finalizers":["a"]}}`),
			[]byte(`{"metadata":{"name":"cm","labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/written-token":"42"},"finalizers":["a","b"]}}`)), 409, "this write sends no fencing token", nil},
		{"a finalizer added to an object being deleted is judged", request(admissionv1.Update, deleting(`["a","b"]`, ""), deleting(`["a"]`, "")), 409, "this write sends no fencing token", nil},
		{"a finalizer swapped on an object being deleted is judged", request(admissionv1.Update, deleting(`["b"]`, ""), deleting(`["a","c"]`, "")), 409, "this write sends no fencing token", nil},
		{"a finalizer removed with a data change is judged", request(admissionv1.Update, deleting(`["a"]`, `,"data":{"v":"new"}`), deleting(`["a","b"]`, "")), 409, "this write sends no fencing token", nil},
		{"a finalizer removed with the label removed is judged", request(admissionv1.Update,
			[]byte(`{"metadata":{"name":"cm","deletionTimestamp":"2026-01-01T00:00:00Z","annotations":{"fencer.io/written-token":"42"},"finalizers":[]}}`), deleting(`["a"]`, "")), 409, "this write sends no fencing token", nil},
		{"exempt identity keeps the record", as(request(admissionv1.Update, stored("report", "", ""), stored("report", "", "42")), "system:serviceaccount:kube-system:generic-garbage-collector"), 0, "",
			[]jsonpatch.JsonPatchOperation{{Operation: "add", Path: "/metadata/annotations", Value: map[string]string{"fencer.io/written-token": "42"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := f.Record(context.Background(), tc.req)
			check(t, resp, tc.code, tc.msg)
			if tc.code == 0 && !reflect.DeepEqual(resp.Patches, tc.patch) {
				t.Fatalf("patch %+v, want %+v", resp.Patches, tc.patch)
			}
		})
	}
	// Monotonic with no holder: only the newest issued token may fence an
	// object again, whatever record (forged, stripped) it carries.
	for _, old := range [][]byte{stored("", "", ""), stored("", "", "1"), stored("", "", "41")} {
		mono := newChecker(t, fakeLive{live: unheld})
		mono.Leases = leaseClient(leaseIssued(fencerv1.PolicyMonotonic, 42))
		check(t, mono.Record(context.Background(), request(admissionv1.Update, obj("report", "40"), old)), 409, "must send the newest token issued for the lease, 42")
		check(t, mono.Record(context.Background(), request(admissionv1.Update, obj("report", "42"), old)), 0, "")
	}
	// The Monotonic case above must fail on the record, not the policy.
	mono := newChecker(t, fakeLive{live: unheld})
	mono.Leases = leaseClient(leaseIssued(fencerv1.PolicyMonotonic, 42))
	resp := mono.Record(context.Background(), request(admissionv1.Update, stored("", "40", "42"), stored("report", "", "42")))
	check(t, resp, 409, "last written under token 42")
}

// Under Monotonic, with nobody holding the Lease, what stops an older token
// is the newest token the status records as issued, and the Lease's
// existence. A webhook whose cache is behind on either (the Lease granted
// to B, written under, and released since; or deleted) must not accept
// the old holder's write: it reads the Lease afresh.
func TestMonotonicWithoutHolderReadsTheLeaseAfresh(t *testing.T) {
	ctx := context.Background()
	reader := func(objs ...*fencerv1.Lease) client.Reader {
		s := runtime.NewScheme()
		utilruntime.Must(fencerv1.AddToScheme(s))
		b := fake.NewClientBuilder().WithScheme(s)
		for _, o := range objs {
			b = b.WithObjects(o)
		}
		return b.Build()
	}
	f := newChecker(t, fakeLive{live: unheld})
	f.Leases = leaseClient(leaseIssued(fencerv1.PolicyMonotonic, 42)) // the cache, behind
	// B unfenced the object under 50; A, holding 42, fences it again.
	f.APIReader = reader(leaseIssued(fencerv1.PolicyMonotonic, 50))
	check(t, f.Record(ctx, request(admissionv1.Update, obj("report", "42"), stored("", "", "50"))), 409, "must send the newest token issued for the lease, 50")
	check(t, f.Record(ctx, request(admissionv1.Create, obj("report", "42"), nil)), 409, "must send the newest token issued for the lease, 50")
	// The Lease was deleted; the cache still shows it.
	f.APIReader = reader()
	check(t, f.Record(ctx, request(admissionv1.Update, obj("report", "42"), stored("report", "", "42"))), 409, "lease default/report does not exist")
	// A cache that is current changes nothing.
	f.APIReader = reader(leaseIssued(fencerv1.PolicyMonotonic, 42))
	check(t, f.Record(ctx, request(admissionv1.Update, obj("report", "42"), stored("report", "", "42"))), 0, "")
	// A token the cached status already shows as issued, 43 here, is
	// forged only to a view behind it.
	f.APIReader = reader(leaseIssued(fencerv1.PolicyMonotonic, 43))
	check(t, f.Record(ctx, request(admissionv1.Update, obj("report", "43"), stored("report", "", "42"))), 0, "")

	// Refusals that a fresher Lease cannot turn into acceptances cost no
	// read of it: a write that cannot carry a token, and one below the
	// newest token the cache already shows.
	reads := &countingReader{Reader: reader(leaseIssued(fencerv1.PolicyMonotonic, 42))}
	f.APIReader = reads
	check(t, f.Record(ctx, request(admissionv1.Update, obj("report", "41"), stored("", "", ""))), 409, "must send the newest token issued for the lease, 42")
	check(t, f.Validate(ctx, request(admissionv1.Delete, nil, stored("report", "", "42"))), 403, "a DELETE cannot carry a fencing token")
	if reads.n != 0 {
		t.Fatalf("%d reads of the Lease for refusals the cache decides", reads.n)
	}
}

// The Lease read afresh comes after the etcd read, so its status may
// record a grant made between the two: a token above that read's revision
// is then news, not a restore's sign. The write is judged against etcd
// read again (the new holder's live token refuses the old one), not
// refused as EtcdRevisionRegressed, a false alarm in the Event and the
// metric. Only a status above a read made after it is a regression.
func TestAGrantBetweenTheEtcdReadAndTheFreshLeaseIsReadAgain(t *testing.T) {
	s := runtime.NewScheme()
	utilruntime.Must(fencerv1.AddToScheme(s))
	fresh := leaseIssued(fencerv1.PolicyMonotonic, 42)
	fresh.Status.Holder, fresh.Status.HolderUID, fresh.Status.Token = "reporter-b", "uid-b", 50
	fresh.Status.History = append([]fencerv1.Tenure{{Holder: "reporter-b", HolderUID: "uid-b", Token: 50}}, fresh.Status.History...)
	for _, tc := range []struct {
		name  string
		again etcdstore.Live
		code  int32
		msg   string
	}{
		{"granted since the read", held(50, 50), 409, "current token is 50 (holder reporter-b)"},
		{"a status above a read made after it", etcdstore.Live{Revision: 45}, 409, "above etcd's revision 45"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := &liveSequence{lives: []etcdstore.Live{{Revision: 45}, tc.again}}
			f := newChecker(t, live)
			f.Leases = leaseClient(leaseIssued(fencerv1.PolicyMonotonic, 42)) // the cache: 42 last issued, nobody holding
			f.APIReader = fake.NewClientBuilder().WithScheme(s).WithObjects(fresh.DeepCopy()).Build()
			check(t, f.Record(context.Background(), request(admissionv1.Update, obj("report", "42"), stored("report", "", "42"))), tc.code, tc.msg)
			if live.n != 2 {
				t.Fatalf("%d etcd reads, want 2", live.n)
			}
		})
	}
}

// liveSequence answers each Lookup with the next of lives.
type liveSequence struct {
	lives []etcdstore.Live
	n     int
}

func (l *liveSequence) Lookup(context.Context, string, string) (etcdstore.Live, error) {
	live := l.lives[min(l.n, len(l.lives)-1)]
	l.n++
	return live, nil
}

// countingReader counts the Gets it serves.
type countingReader struct {
	client.Reader
	n int
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.n++
	return c.Reader.Get(ctx, key, obj, opts...)
}

func TestValidateTokenless(t *testing.T) {
	f := newChecker(t, fakeLive{live: held(42, 50)})
	status := request(admissionv1.Update, stored("report", "", "42"), stored("report", "", "42"))
	status.SubResource = "status"
	cases := []struct {
		name string
		req  admission.Request
		code int32
		msg  string
	}{
		{"delete of an object last written under the live token", request(admissionv1.Delete, nil, stored("report", "", "42")), 403, "a DELETE cannot carry a fencing token"},
		{"delete by the namespace controller", as(request(admissionv1.Delete, nil, stored("report", "", "42")), "system:serviceaccount:kube-system:namespace-controller"), 0, ""},
		{"delete of an unfenced object", request(admissionv1.Delete, nil, stored("", "", "42")), 0, ""},
		{"status write", status, 403, "a UPDATE of the status subresource cannot carry a fencing token"},
		{"status write by an exempt identity that removes the label", as(relabelStatus(), "system:serviceaccount:kube-system:generic-garbage-collector"), 409, "may not change the label fencer.io/lease"},
		{"status write by an exempt identity that lowers the record", as(statusWrite(stored("report", "", "41"), stored("report", "", "42")), "system:serviceaccount:kube-system:generic-garbage-collector"), 409, "or the annotations fencer.io/token and fencer.io/written-token"},
		{"status write by an exempt identity that removes the record", as(statusWrite(stored("report", "", ""), stored("report", "", "42")), "system:serviceaccount:kube-system:generic-garbage-collector"), 409, "or the annotations fencer.io/token and fencer.io/written-token"},
		{"status write by an exempt identity that adds an offer", as(statusWrite(stored("report", "43", "42"), stored("report", "", "42")), "system:serviceaccount:kube-system:generic-garbage-collector"), 409, "or the annotations fencer.io/token and fencer.io/written-token"},
		{"delete without the old object", request(admissionv1.Delete, nil, nil), 400, "DELETE without the old object"},
		{"connect is not checked", request(admissionv1.Connect, nil, nil), 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check(t, f.Validate(context.Background(), tc.req), tc.code, tc.msg)
		})
	}
}

func TestExemptDeleteNeedsNoLease(t *testing.T) {
	f := newChecker(t, fakeLive{err: errors.New("etcd down")})
	req := as(request(admissionv1.Delete, nil, stored("ghost", "", "42")), "system:serviceaccount:kube-system:namespace-controller")
	check(t, f.Validate(context.Background(), req), 0, "")
}

func TestDenialCauses(t *testing.T) {
	f := newChecker(t, fakeLive{live: held(42, 50)})
	resp := f.Record(context.Background(), request(admissionv1.Update, obj("report", "41"), stored("report", "", "40")))
	want := []metav1.StatusCause{
		{Type: fencerv1.CauseReason, Message: "BelowLiveToken"},
		{Type: fencerv1.CauseLease, Message: "default/report"},
		{Type: fencerv1.CauseOfferedToken, Message: "41"},
		{Type: fencerv1.CauseRecordedToken, Message: "40"},
		{Type: fencerv1.CauseCurrentToken, Message: "42"},
		{Type: fencerv1.CauseHolder, Message: "reporter-b"},
	}
	if resp.Result.Details == nil || !reflect.DeepEqual(resp.Result.Details.Causes, want) {
		t.Fatalf("causes %+v\nwant %+v", resp.Result.Details, want)
	}
}

// relabelStatus is a /status write whose object drops the lease label.
// deleting is a fenced ConfigMap being deleted, with the record 42, the
// finalizers given (a JSON list) and extra top-level JSON fields.
func deleting(finalizers, extra string) []byte {
	return []byte(`{"metadata":{"name":"cm","deletionTimestamp":"2026-01-01T00:00:00Z","labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/written-token":"42"},"finalizers":` + finalizers + `}` + extra + `}`)
}

// statusWrite is an UPDATE of the status subresource from old to object.
func statusWrite(object, old []byte) admission.Request {
	r := request(admissionv1.Update, object, old)
	r.SubResource = "status"
	return r
}

func relabelStatus() admission.Request {
	r := request(admissionv1.Update, stored("", "", "42"), stored("report", "", "42"))
	r.SubResource = "status"
	return r
}

func as(r admission.Request, user string) admission.Request {
	r.UserInfo.Username = user
	return r
}

func leaseClient(l *fencerv1.Lease) LeaseReader {
	s := runtime.NewScheme()
	utilruntime.Must(fencerv1.AddToScheme(s))
	return ReaderLeases{fake.NewClientBuilder().WithScheme(s).WithObjects(l).Build()}
}

// check asserts resp is allowed (code 0) or refused with code and msg.
func check(t *testing.T, resp admission.Response, code int32, msg string) {
	t.Helper()
	if code == 0 {
		if !resp.Allowed {
			t.Fatalf("refused: %+v", resp.Result)
		}
		return
	}
	if resp.Allowed || resp.Result.Code != code || !strings.Contains(resp.Result.Message, msg) {
		t.Fatalf("got allowed=%v %+v\nwant %d containing %q", resp.Allowed, resp.Result, code, msg)
	}
}

func TestLookupFailureRefusesWith503(t *testing.T) {
	f := newChecker(t, fakeLive{err: errors.New("context deadline exceeded")})
	resp := f.Record(context.Background(), request(admissionv1.Create, obj("report", "42"), nil))
	if resp.Allowed || resp.Result.Code != 503 || !strings.Contains(resp.Result.Message, "cannot read the live token of lease default/report from etcd (context deadline exceeded)") {
		t.Fatalf("got %+v", resp.Result)
	}
}

// serve posts body to the webhook over HTTP, as the apiserver would.
func serve(t testing.TB, f *Checker, body []byte) *httptest.ResponseRecorder {
	wh := &Review{Handler: admission.HandlerFunc(f.Record)}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	wh.ServeHTTP(rec, req)
	return rec
}

func TestServeHTTPAnswersEveryBody(t *testing.T) {
	f := newChecker(t, fakeLive{live: held(42, 50)})
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}}
	r := request(admissionv1.Create, obj("report", "41"), nil)
	review.Request = &r.AdmissionRequest
	raw, _ := json.Marshal(review)
	rec := serve(t, f, raw)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("no AdmissionReview back: %v %s", err, rec.Body.String())
	}
	if out.Response.Allowed || out.Response.Result.Code != 409 || out.Response.UID != "1" {
		t.Fatalf("response %+v", out.Response)
	}
}

// FuzzServeHTTP: any request body gets an HTTP answer (an AdmissionReview or
// an error status), never a panic.
func FuzzServeHTTP(f *testing.F) {
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}}
	r := request(admissionv1.Update, obj("report", "42"), obj("report", "43"))
	review.Request = &r.AdmissionRequest
	good, _ := json.Marshal(review)
	f.Add(good)
	f.Add([]byte(`{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"x","operation":"DELETE"}}`))
	f.Add([]byte(`{"kind":"Pod"}`))
	f.Add([]byte(`{`))
	f.Add(bytes.Repeat([]byte(`[`), 100000))
	fence := &Checker{Live: fakeLive{live: held(42, 50)}}
	s := runtime.NewScheme()
	utilruntime.Must(fencerv1.AddToScheme(s))
	fence.Leases = ReaderLeases{fake.NewClientBuilder().WithScheme(s).WithObjects(testLease(fencerv1.PolicyCurrent, false)).Build()}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(t, fence, body)
		if rec.Code == 0 {
			t.Fatal("no status code")
		}
	})
}

// countingLive counts the live-token lookups, which are etcd reads.
type countingLive struct {
	fakeLive
	n *int
}

func (c countingLive) Lookup(ctx context.Context, ns, name string) (etcdstore.Live, error) {
	*c.n++
	return c.fakeLive.Lookup(ctx, ns, name)
}

// A refusal costs no etcd read when the review alone, the object's record
// or the Lease's status proves the token stale; a write that may pass is
// always checked against etcd.
func TestRefusalsWithoutAnEtcdRead(t *testing.T) {
	l := leaseIssued(fencerv1.PolicyCurrent, 42)
	l.Status.Token, l.Status.Holder = 42, "reporter-b"
	cases := []struct {
		name  string
		req   admission.Request
		reads int
		msg   string // "" means allowed
	}{
		{"below the status's token", request(admissionv1.Update, obj("report", "41"), stored("report", "", "41")), 0, "token 42 has been issued since"},
		{"below the object's record", request(admissionv1.Update, obj("report", "40"), stored("report", "", "41")), 0, "last written under token 41"},
		{"no token", request(admissionv1.Update, stored("report", "", "41"), stored("report", "", "41")), 0, "sends no fencing token"},
		{"malformed", request(admissionv1.Create, obj("report", "4x"), nil), 0, "malformed fencing token"},
		{"the status's token: etcd decides", request(admissionv1.Update, obj("report", "42"), stored("report", "", "41")), 1, ""},
		{"above the status's token: etcd decides (a forgery, or a grant the cache has not seen)", request(admissionv1.Update, obj("report", "43"), stored("report", "", "41")), 1, "forged token 43"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reads := 0
			f := &Checker{Leases: leaseClient(l), Live: countingLive{fakeLive{live: held(42, 50)}, &reads}, Exempt: NewExempt(DefaultExemptUsers, nil)}
			resp := f.Record(context.Background(), tc.req)
			if tc.msg == "" {
				check(t, resp, 0, "")
			} else if resp.Allowed || !strings.Contains(resp.Result.Message, tc.msg) {
				t.Fatalf("got allowed=%v %+v, want a refusal containing %q", resp.Allowed, resp.Result, tc.msg)
			}
			if reads != tc.reads {
				t.Fatalf("%d etcd reads, want %d", reads, tc.reads)
			}
		})
	}
}
