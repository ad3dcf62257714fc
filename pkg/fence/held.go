package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1alpha1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// A HeldCheck tells whether a token's grant is still live, from the grant
// itself rather than from the pod's annotations. The annotation follows
// the grant only as fast as the controller patches the pod and the
// kubelet rewrites the Downward API file, and it never changes on a pod
// whose kubelet has stopped. Wrap a Source in Verified to have Watch and
// RunExclusive follow the grant.
type HeldCheck interface {
	// Held returns nil while t's grant is live, and an error wrapping
	// ErrLeaseLost once it has ended.
	Held(ctx context.Context, t Token) error
	// UntilLost blocks until t's grant ends, and returns an error wrapping
	// ErrLeaseLost; or until ctx ends, and returns ctx's error.
	UntilLost(ctx context.Context, t Token) error
}

// EtcdHeld checks grants in fencer's etcd, with the namespace's identity
// (LoadEtcdAccess): a grant is live while the Lease's key has the token as
// its CreateRevision, was issued by the controller (its grant marker
// written with it, the key never rewritten), and, with PodUID set, names
// this pod as its holder.
// UntilLost watches the key (WatchHeld), so a lost grant is seen the
// moment etcd deletes the key.
type EtcdHeld struct {
	Client *clientv3.Client
	// Prefix is fencer's etcd prefix ("" means the default, /fencer).
	Prefix    string
	Namespace string
	// PodUID is this pod's UID (the Downward API's metadata.uid). Set, a
	// live grant held by another pod reads as lost: a token annotation
	// copied onto this pod, whose kubelet then stopped, is not confirmed.
	// Empty, only the token's liveness is checked.
	PodUID types.UID
}

// misconfigured says what no retry of e will fix, before any I/O.
func (e EtcdHeld) misconfigured() error {
	if e.Client == nil {
		return errNoClient
	}
	if e.Namespace == "" {
		// The Lease's key would be read in no namespace: never there, so
		// every token would read as lost, and RunExclusive wait for ever.
		return fmt.Errorf("%w: EtcdHeld needs Namespace, the Lease's namespace", ErrMisconfigured)
	}
	return nil
}

// Held reads the Lease's key now.
func (e EtcdHeld) Held(ctx context.Context, t Token) error {
	_, err := e.read(ctx, t)
	return err
}

func (e EtcdHeld) read(ctx context.Context, t Token) (rev int64, err error) {
	if err := e.misconfigured(); err != nil {
		return 0, err
	}
	kv, rev, err := readGrant(ctx, e.Client, e.Prefix, e.Namespace, t.Lease)
	if err != nil {
		return 0, err
	}
	if kv == nil || kv.CreateRevision != t.Value {
		return 0, fmt.Errorf("lease %s/%s is no longer held under token %d: %w", e.Namespace, t.Lease, t.Value, ErrLeaseLost)
	}
	if e.PodUID != "" {
		var g struct {
			HolderUID types.UID `json:"holderUID"`
		}
		if err := json.Unmarshal(kv.Value, &g); err != nil || g.HolderUID != e.PodUID {
			return 0, fmt.Errorf("lease %s/%s is held under token %d by pod uid %q, not by this pod (uid %s): %w", e.Namespace, t.Lease, t.Value, g.HolderUID, e.PodUID, ErrLeaseLost)
		}
	}
	return rev, nil
}

// UntilLost watches the Lease's key until it stops holding t's grant.
func (e EtcdHeld) UntilLost(ctx context.Context, t Token) error {
	rev, err := e.read(ctx, t)
	for err != nil && !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrMisconfigured) {
		// etcd is away: keep trying until it answers or ctx ends.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		rev, err = e.read(ctx, t)
	}
	if err != nil {
		return err
	}
	return WatchHeld(ctx, e.Client, etcdkeys.LeaseKey(etcdkeys.OrDefault(e.Prefix), e.Namespace, t.Lease), t.Value, rev)
}

// StatusHeld checks grants in the Lease's status, for a pod without etcd
// access: a grant is live while status.token is the token and
// status.holderUID is this pod's UID. The status follows etcd a little
// after each change, so UntilLost polls it every Interval (default 1 s).
type StatusHeld struct {
	Client    client.Reader
	Namespace string
	// PodUID is this pod's UID (the Downward API's metadata.uid).
	PodUID   types.UID
	Interval time.Duration
}

// misconfigured says what no retry of s will fix, before any I/O.
func (s StatusHeld) misconfigured() error {
	if s.PodUID == "" {
		return fmt.Errorf("%w: StatusHeld needs PodUID, this pod's UID (the Downward API's metadata.uid)", ErrMisconfigured)
	}
	if s.Client == nil {
		return errNoAPIClient("StatusHeld")
	}
	if s.Namespace == "" {
		return fmt.Errorf("%w: StatusHeld needs Namespace, the Lease's namespace", ErrMisconfigured)
	}
	return nil
}

// Held reads the Lease now.
func (s StatusHeld) Held(ctx context.Context, t Token) error {
	if err := s.misconfigured(); err != nil {
		return err
	}
	lease := &fencerv1alpha1.Lease{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: t.Lease}, lease); err != nil {
		return err
	}
	if lease.Status.Token != t.Value || lease.Status.HolderUID != s.PodUID {
		return fmt.Errorf("lease %s/%s is held by %s (uid %s) under token %d, not by this pod under token %d: %w",
			s.Namespace, t.Lease, lease.Status.Holder, lease.Status.HolderUID, lease.Status.Token, t.Value, ErrLeaseLost)
	}
	return nil
}

// UntilLost polls the Lease until its status stops naming t's grant.
func (s StatusHeld) UntilLost(ctx context.Context, t Token) error {
	every := s.Interval
	if every <= 0 {
		every = time.Second
	}
	for {
		if err := s.Held(ctx, t); errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrMisconfigured) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

// Verified is a Source whose tokens Check confirms held: a token the
// annotations still show but whose grant has ended reads as ErrNotHolder.
// Watch then reports the loss, and RunExclusive cancels its work the
// moment Check.UntilLost returns, whatever happens to the annotation.
type Verified struct {
	Source Source
	Check  HeldCheck
}

func (v Verified) untilLost(ctx context.Context, t Token) error { return v.Check.UntilLost(ctx, t) }

// misconfigured says what no retry of v's check will fix, before any I/O:
// a pod that does not hold the lease yet reads no token to check, so
// RunExclusive asks this up front instead of waiting for the grant.
func (v Verified) misconfigured() error {
	if v.Source == nil || v.Check == nil {
		return fmt.Errorf("%w: Verified needs both Source and Check", ErrMisconfigured)
	}
	for _, part := range []any{v.Source, v.Check} { // a Verified may wrap another
		if c, ok := part.(interface{ misconfigured() error }); ok {
			if err := c.misconfigured(); err != nil {
				return err
			}
		}
	}
	return nil
}

// Token reads Source, then confirms the grant with Check.
func (v Verified) Token(ctx context.Context) (Token, error) {
	if v.Source == nil || v.Check == nil {
		return Token{}, v.misconfigured()
	}
	t, err := v.Source.Token(ctx)
	if err != nil {
		return Token{}, err
	}
	if err := v.Check.Held(ctx, t); errors.Is(err, ErrLeaseLost) {
		return Token{}, fmt.Errorf("%w: %w", ErrNotHolder, err)
	} else if err != nil {
		return Token{}, err
	}
	return t, nil
}
