package fence

import (
	"context"
	"fmt"
	"regexp"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Stamp marks obj as fenced by t.Lease and carrying t.Value: the label
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
	ann[TokenAnnotation] = strconv.FormatInt(t.Value, 10)
	obj.SetAnnotations(ann)
}

// StaleTokenError is fencer's webhook refusing a write: the token offered is
// stale, forged, missing or malformed, or (bindIdentity) offered by the wrong
// pod. Message says which. Check with errors.As.
type StaleTokenError struct {
	Lease   string
	Offered int64
	// Current is the live token, 0 when the message did not name one (e.g.
	// the lease has no holder).
	Current int64
	// Message is the webhook's full denial.
	Message string
}

func (e *StaleTokenError) Error() string { return e.Message }

// Parts of fencer's denial messages (docs/webhook.md lists them all).
var (
	deniedLease  = regexp.MustCompile(`fencer: .*?lease ([^\s:;]+)`)
	offeredToken = regexp.MustCompile(`token (\d+)`)
	currentToken = regexp.MustCompile(`current token is (\d+)`)
)

// AsStaleToken turns a refusal by fencer's webhook (HTTP 409, a message
// starting "fencer: ") into a *StaleTokenError; any other error comes back
// unchanged.
func AsStaleToken(err error) error {
	if err == nil || !apierrors.IsConflict(err) {
		return err
	}
	msg := err.Error()
	m := deniedLease.FindStringSubmatch(msg)
	if m == nil {
		return err // the apiserver's own optimistic-lock conflict
	}
	e := &StaleTokenError{Lease: m[1], Message: msg}
	if o := offeredToken.FindStringSubmatch(msg); o != nil {
		e.Offered, _ = strconv.ParseInt(o[1], 10, 64)
	}
	if c := currentToken.FindStringSubmatch(msg); c != nil {
		e.Current, _ = strconv.ParseInt(c[1], 10, 64)
	}
	return e
}

// Client wraps a controller-runtime client so that every Create, Update and
// Patch is stamped with the current token from Source, and fencer's denials
// come back as *StaleTokenError. Reads and deletes pass through (a delete is
// judged by the token of the object's last write).
type Client struct {
	client.Client
	Source Source
}

// NewClient wraps c.
func NewClient(c client.Client, src Source) *Client { return &Client{Client: c, Source: src} }

func (c *Client) stamp(ctx context.Context, obj client.Object) error {
	t, err := c.Source.Token(ctx)
	if err != nil {
		return fmt.Errorf("fence: no token to write %s with: %w", obj.GetName(), err)
	}
	Stamp(obj, t)
	return nil
}

// Create stamps obj and creates it.
func (c *Client) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.stamp(ctx, obj); err != nil {
		return err
	}
	return AsStaleToken(c.Client.Create(ctx, obj, opts...))
}

// Update stamps obj and updates it.
func (c *Client) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.stamp(ctx, obj); err != nil {
		return err
	}
	return AsStaleToken(c.Client.Update(ctx, obj, opts...))
}

// Patch stamps obj and patches it. With client.MergeFrom the stamp becomes
// part of the patch, since it differs from the original.
func (c *Client) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := c.stamp(ctx, obj); err != nil {
		return err
	}
	return AsStaleToken(c.Client.Patch(ctx, obj, patch, opts...))
}
