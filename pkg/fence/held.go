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

// seenHeld is what a read that found the grant live saw: etcd's revision,
// and the grant's TTL.
type seenHeld struct {
	rev int64
	ttl time.Duration
}

// unknownGrantTTL bounds the silence UntilLost allows before any read has
// told it the grant's TTL: the default ttlSeconds of a Lease.
const unknownGrantTTL = 15 * time.Second

func (e EtcdHeld) read(ctx context.Context, t Token) (seenHeld, error) {
	if err := e.misconfigured(); err != nil {
		return seenHeld{}, err
	}
	kv, rev, err := readGrant(ctx, e.Client, e.Prefix, e.Namespace, t.Lease)
	if err != nil {
		return seenHeld{}, err
	}
	if kv == nil || kv.CreateRevision != t.Value {
		return seenHeld{}, fmt.Errorf("lease %s/%s is no longer held under token %d: %w", e.Namespace, t.Lease, t.Value, ErrLeaseLost)
	}
	var g struct {
		HolderUID  types.UID `json:"holderUID"`
		TTLSeconds int64     `json:"ttlSeconds"`
	}
	err = json.Unmarshal(kv.Value, &g)
	if e.PodUID != "" && (err != nil || g.HolderUID != e.PodUID) {
		return seenHeld{}, fmt.Errorf("lease %s/%s is held under token %d by pod uid %q, not by this pod (uid %s): %w", e.Namespace, t.Lease, t.Value, g.HolderUID, e.PodUID, ErrLeaseLost)
	}
	seen := seenHeld{rev: rev, ttl: unknownGrantTTL}
	if g.TTLSeconds > 0 {
		seen.ttl = time.Duration(g.TTLSeconds) * time.Second
	}
	return seen, nil
}

// UntilLost watches the Lease's key until it stops holding t's grant, and
// reads the grant again every third of its TTL: once no read has
// confirmed it for a whole TTL (etcd unreachable, or a watch stalled on a
// connection that drops packets), the grant may have expired in etcd and
// gone to another pod, so it counts as lost, with an error wrapping
// ErrLeaseLost and ErrEtcdUnavailable. A read that fails is tried again
// within half a second, each bounded by a third of the TTL, so one etcd
// member lost, or a leader election, costs no false loss. Until a first
// read answers, the TTL is taken as 15 s, a Lease's default, from the call.
func (e EtcdHeld) UntilLost(ctx context.Context, t Token) error {
	if err := e.misconfigured(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan error, 1)
	watching := false
	lastOK, ttl := time.Now(), unknownGrantTTL
	for wait := time.Duration(0); ; {
		deadline := lastOK.Add(ttl)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-watched:
			return err
		case <-time.After(min(wait, time.Until(deadline))):
		}
		sent := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, min(time.Until(deadline), ttl/3))
		seen, err := e.read(rctx, t)
		rcancel()
		switch {
		case err == nil:
			lastOK, ttl, wait = sent, seen.ttl, seen.ttl/3
			if !watching {
				watching = true
				go func() { watched <- e.watch(ctx, t, seen.rev) }()
			}
			continue
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrMisconfigured):
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("lease %s/%s: no read confirmed the grant of token %d for its TTL (%s): %w: %w (%w)", e.Namespace, t.Lease, t.Value, ttl, ErrLeaseLost, ErrEtcdUnavailable, err)
		}
		wait = min(500*time.Millisecond, ttl/3)
	}
}

// watch is WatchHeld of t's lease key from rev, never returning a
// transient error: one ends only UntilLost's watch, and its reads go on.
func (e EtcdHeld) watch(ctx context.Context, t Token, rev int64) error {
	err := WatchHeld(ctx, e.Client, etcdkeys.LeaseKey(etcdkeys.OrDefault(e.Prefix), e.Namespace, t.Lease), t.Value, rev)
	if errors.Is(err, ErrLeaseLost) {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
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
	_, err := s.read(ctx, t)
	return err
}

// read reads the Lease and returns its TTL while its status names t's
// grant held by this pod.
func (s StatusHeld) read(ctx context.Context, t Token) (time.Duration, error) {
	if err := s.misconfigured(); err != nil {
		return 0, err
	}
	lease := &fencerv1alpha1.Lease{}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: t.Lease}, lease); err != nil {
		return 0, gone(err, ErrLeaseLost, "lease", s.Namespace, t.Lease)
	}
	if lease.Status.Token != t.Value || lease.Status.HolderUID != s.PodUID {
		return 0, fmt.Errorf("lease %s/%s is held by %s (uid %s) under token %d, not by this pod under token %d: %w",
			s.Namespace, t.Lease, lease.Status.Holder, lease.Status.HolderUID, lease.Status.Token, t.Value, ErrLeaseLost)
	}
	return grantTTL(lease), nil
}

// grantTTL is the TTL of the Lease's current grant: its status's
// expireTime less renewTime, which the controller shows from the grant
// itself; spec.ttlSeconds, which an edit applies only to the next grant,
// when the status shows neither; 15 s when neither says.
func grantTTL(l *fencerv1alpha1.Lease) time.Duration {
	if r, x := l.Status.RenewTime, l.Status.ExpireTime; r != nil && x != nil && x.After(r.Time) {
		return x.Sub(r.Time)
	}
	if l.Spec.TTLSeconds > 0 {
		return time.Duration(l.Spec.TTLSeconds) * time.Second
	}
	return unknownGrantTTL
}

// UntilLost polls the Lease until its status stops naming t's grant. Once
// no read has confirmed it for a whole TTL (the apiserver unreachable),
// the grant may have expired in etcd and gone to another pod, so it counts
// as lost, with an error wrapping ErrLeaseLost. The TTL is the grant's, as
// the status shows it (grantTTL); until a first read answers, 15 s, a
// Lease's default, from the call.
func (s StatusHeld) UntilLost(ctx context.Context, t Token) error {
	every := s.Interval
	if every <= 0 {
		every = time.Second
	}
	lastOK, ttl := time.Now(), unknownGrantTTL
	for {
		deadline := lastOK.Add(ttl)
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		got, err := s.read(rctx, t)
		cancel()
		switch {
		case err == nil:
			lastOK, ttl = sent, got
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrMisconfigured):
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		case !time.Now().Before(deadline):
			return fmt.Errorf("lease %s/%s: no read of its status confirmed the grant of token %d for its TTL (%s): %w (%w)", s.Namespace, t.Lease, t.Value, ttl, ErrLeaseLost, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(every, time.Until(lastOK.Add(ttl)))):
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
