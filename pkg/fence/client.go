package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// Stamp marks obj as fenced by t.Lease and sending t.Value: the label
// fencer.io/lease and the annotation fencer.io/token the webhook checks.
func Stamp(obj client.Object, t Token) {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LeaseLabel] = t.Lease
	obj.SetLabels(labels)
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[TokenAnnotation] = fencerv1.FormatToken(t.Value)
	obj.SetAnnotations(ann)
}

// StaleTokenError is fencer's webhook refusing a write: the token sent is
// stale, forged, missing or malformed, the write cannot carry a token, or
// (bindIdentity) it came from the wrong pod. The fields come from the
// denial's structured causes, never from its message. Check with errors.As.
type StaleTokenError struct {
	// Reason says why, e.g. fencerv1.DenialBelowLive.
	Reason fencerv1.DenialReason
	// Lease is <namespace>/<name>.
	Lease string
	// Offered is the token the write sent, 0 if none (or malformed).
	Offered int64
	// Recorded is the token of the object's last accepted write, 0 if none.
	Recorded int64
	// Current is the live token, 0 when the lease has no holder. For a
	// refusal the webhook decided without reading etcd (SupersededToken,
	// BelowObjectToken, MissingToken, MalformedToken) it is the token the
	// Lease's status records, which may lag etcd by a moment.
	Current int64
	// Holder is the live holder pod, "" when none; as Current.
	Holder string
	// Message is the webhook's full denial, for people.
	Message string
	// Err is the apiserver's error, so apierrors.IsConflict still answers.
	Err error
}

func (e *StaleTokenError) Error() string { return e.Message }

// Unwrap returns the apiserver's error.
func (e *StaleTokenError) Unwrap() error { return e.Err }

// AsStaleToken turns a refusal by fencer's webhook (HTTP 409, or 403 for a
// write that cannot carry a token, with fencer's causes) into a
// *StaleTokenError; any other error comes back unchanged: the apiserver's own
// optimistic-lock conflict, and fencer's 503 when it cannot read the live
// token (retry those).
func AsStaleToken(err error) error {
	var status apierrors.APIStatus
	fencerCode := apierrors.IsConflict(err) || apierrors.IsForbidden(err)
	if err == nil || !fencerCode || !errors.As(err, &status) || status.Status().Details == nil {
		return err
	}
	e := &StaleTokenError{Message: err.Error(), Err: err}
	for _, c := range status.Status().Details.Causes {
		switch c.Type {
		case fencerv1.CauseReason:
			e.Reason = fencerv1.DenialReason(c.Message)
		case fencerv1.CauseLease:
			e.Lease = c.Message
		case fencerv1.CauseOfferedToken:
			e.Offered, _ = fencerv1.ParseToken(c.Message)
		case fencerv1.CauseRecordedToken:
			e.Recorded, _ = fencerv1.ParseToken(c.Message)
		case fencerv1.CauseCurrentToken:
			e.Current, _ = fencerv1.ParseToken(c.Message)
		case fencerv1.CauseHolder:
			e.Holder = c.Message
		}
	}
	if e.Reason == "" {
		return err
	}
	return e
}

// ErrTokenless is returned, before anything is sent, for a write that
// cannot carry a fencing token: a DELETE, or a write to a subresource such
// as /status or /scale. The webhook would refuse it; fence.Client refuses
// it first, so no write ever leaves unfenced. Unfence the object first (it
// is then an ordinary object), or, for a bindIdentity Lease, make the write
// with the underlying client from the holder pod's own identity.
var ErrTokenless = errors.New("fence: this write cannot carry a fencing token")

// Client wraps a controller-runtime client so that every write sends the
// token of one tenure: the Token that RunExclusive or a Source handed out,
// fixed for the Client's life, so a read-modify-write begun under one
// tenure can never commit under a later one. Create, Update, Patch (merge,
// strategic merge and apply patches) and Apply carry it; writes that cannot
// carry it (Delete, DeleteAllOf, Status(), SubResource()) fail with
// ErrTokenless. Denials come back as *StaleTokenError. Make a new Client
// for each tenure.
type Client struct {
	client.Client
	Token Token
}

// NewClient wraps c to write with t.
func NewClient(c client.Client, t Token) *Client { return &Client{Client: c, Token: t} }

// wraps refuses a Client that wraps no client: every write would panic.
func (c *Client) wraps() error {
	if c.Client == nil {
		return fmt.Errorf("%w: fence.Client wraps no Kubernetes client (NewClient was given nil)", ErrMisconfigured)
	}
	return nil
}

// Create stamps obj and creates it.
func (c *Client) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.wraps(); err != nil {
		return err
	}
	Stamp(obj, c.Token)
	return AsStaleToken(c.Client.Create(ctx, obj, opts...))
}

// Update stamps obj and updates it.
func (c *Client) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.wraps(); err != nil {
		return err
	}
	Stamp(obj, c.Token)
	return AsStaleToken(c.Client.Update(ctx, obj, opts...))
}

// Patch stamps obj and sends patch with the label and token set in its
// body, whatever the patch computed: client.MergeFrom(orig) leaves out a
// token that orig already had, and a raw patch has none. A JSON patch
// (RFC 6902) is refused: it cannot set an annotation without knowing
// whether the object has any.
func (c *Client) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := c.wraps(); err != nil {
		return err
	}
	Stamp(obj, c.Token)
	if patch.Type() == types.JSONPatchType {
		return fmt.Errorf("fence: a JSON patch cannot carry the fencing token reliably; use client.MergeFrom, client.StrategicMergeFrom or an apply patch: %w", ErrTokenless)
	}
	return AsStaleToken(c.Client.Patch(ctx, obj, stampedPatch{Patch: patch, tok: c.Token}, opts...))
}

// Apply sends a server-side apply with the label and token set.
func (c *Client) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	if err := c.wraps(); err != nil {
		return err
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		return fmt.Errorf("fence: encoding the apply configuration: %w", err)
	}
	stamped, err := stampJSON(raw, c.Token)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(stamped); err != nil {
		return fmt.Errorf("fence: the apply configuration is not an object: %w", err)
	}
	return AsStaleToken(c.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...))
}

// Unfence removes the label fencer.io/lease from obj in a write that sends
// the token, so it passes the webhook; obj is an ordinary object afterwards,
// and then Delete and subresource writes reach it through the underlying
// client.
func (c *Client) Unfence(ctx context.Context, obj client.Object) error {
	if err := c.wraps(); err != nil {
		return err
	}
	body := fmt.Appendf(nil, `{"metadata":{"labels":{%q:null},"annotations":{%q:%q}}}`,
		LeaseLabel, TokenAnnotation, fencerv1.FormatToken(c.Token.Value))
	return AsStaleToken(c.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, body)))
}

// Delete refuses: a DELETE cannot carry a token. See ErrTokenless.
func (c *Client) Delete(context.Context, client.Object, ...client.DeleteOption) error {
	return fmt.Errorf("fence: a DELETE cannot carry a fencing token; call Unfence first, then delete with the underlying client: %w", ErrTokenless)
}

// DeleteAllOf refuses: see Delete.
func (c *Client) DeleteAllOf(context.Context, client.Object, ...client.DeleteAllOfOption) error {
	return fmt.Errorf("fence: a DELETE cannot carry a fencing token; unfence the objects first, then delete with the underlying client: %w", ErrTokenless)
}

// Status returns a writer that refuses every write: see ErrTokenless.
func (c *Client) Status() client.SubResourceWriter { return tokenless{client: c.Client, sub: "status"} }

// SubResource returns a client whose reads pass and whose writes refuse.
func (c *Client) SubResource(sub string) client.SubResourceClient {
	return tokenless{client: c.Client, sub: sub}
}

// tokenless is a subresource client whose writes cannot carry a token.
type tokenless struct {
	client client.Client
	sub    string
}

func (t tokenless) refuse() error {
	return fmt.Errorf("fence: a write to the %s subresource cannot carry a fencing token; unfence the object first, or write it from the holder pod's identity under bindIdentity: %w", t.sub, ErrTokenless)
}

func (t tokenless) Get(ctx context.Context, obj, subResource client.Object, opts ...client.SubResourceGetOption) error {
	return t.client.SubResource(t.sub).Get(ctx, obj, subResource, opts...)
}
func (t tokenless) Create(context.Context, client.Object, client.Object, ...client.SubResourceCreateOption) error {
	return t.refuse()
}
func (t tokenless) Update(context.Context, client.Object, ...client.SubResourceUpdateOption) error {
	return t.refuse()
}
func (t tokenless) Patch(context.Context, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
	return t.refuse()
}
func (t tokenless) Apply(context.Context, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
	return t.refuse()
}

// stampedPatch sets the label and token in the body of a merge, strategic
// merge or apply patch.
type stampedPatch struct {
	client.Patch
	tok Token
}

func (p stampedPatch) Data(obj client.Object) ([]byte, error) {
	raw, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	return stampJSON(raw, p.tok)
}

// stampJSON sets metadata.labels[fencer.io/lease] and
// metadata.annotations[fencer.io/token] in a JSON object.
func stampJSON(raw []byte, t Token) ([]byte, error) {
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil || body == nil {
		return nil, fmt.Errorf("fence: the patch is not a JSON object, so it cannot carry the fencing token: %w", ErrTokenless)
	}
	meta, _ := body["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	for field, kv := range map[string][2]string{
		"labels":      {LeaseLabel, t.Lease},
		"annotations": {TokenAnnotation, strconv.FormatInt(t.Value, 10)},
	} {
		m, _ := meta[field].(map[string]any)
		if m == nil {
			m = map[string]any{}
		}
		m[kv[0]] = kv[1]
		meta[field] = m
	}
	body["metadata"] = meta
	return json.Marshal(body)
}
