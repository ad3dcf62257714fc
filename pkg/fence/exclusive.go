package fence

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// RunExclusive is the scheduled-job pattern: it waits until src says this
// pod holds lease, then runs fn once with the token and a context that is
// cancelled the moment the token changes or disappears. With a Verified
// src it is also cancelled the moment the grant ends, whatever the
// annotation says. It returns fn's
// error, or an error wrapping ErrLeaseLost if the lease was lost while fn
// ran. Pass every write fn makes through the token (Stamp, Client, NewTxn),
// since cancellation alone cannot stop a write already on the wire.
func RunExclusive(ctx context.Context, src Source, lease string, poll time.Duration, fn func(context.Context, Token) error) error {
	if src == nil || fn == nil {
		return fmt.Errorf("%w: RunExclusive needs a Source (AnnotationSource, FileSource, PodSource, LeaseSource or Verified) and a function to run", ErrMisconfigured)
	}
	if c, ok := src.(interface{ misconfigured() error }); ok {
		if err := c.misconfigured(); err != nil {
			return err // a Verified source's check, which a pod not yet holding never reaches
		}
	}
	if _, err := src.Token(ctx); errors.Is(err, ErrMisconfigured) {
		return err // Watch would retry it forever
	}
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tokens := Watch(ctx, src, lease, poll)
	var held Token
	for held.Value == 0 {
		t, ok := <-tokens
		if !ok {
			return notStarted(outer, src)
		}
		held = t
	}
	run, lose := context.WithCancelCause(ctx)
	defer lose(nil)
	go func() {
		for t := range tokens {
			if t != held {
				lose(fmt.Errorf("token of lease %s changed from %d to %d: %w", lease, held.Value, t.Value, ErrLeaseLost))
				return
			}
		}
	}()
	if v, ok := src.(interface {
		untilLost(context.Context, Token) error
	}); ok {
		// Verified (or *Verified): the grant itself, not only the
		// annotation, the moment it ends.
		go func() {
			if err := v.untilLost(run, held); errors.Is(err, ErrLeaseLost) {
				lose(err)
			}
		}()
	}
	err := fn(run, held)
	if cause := context.Cause(run); cause != nil && run.Err() != nil && ctx.Err() == nil {
		return cause
	}
	return err
}

// notStarted is the error of a RunExclusive whose ctx ended before the pod
// held the lease: ctx's, and, when the source's last read was a token
// annotation patched by hand into no token (which the controller repairs,
// so RunExclusive waited), that too.
func notStarted(ctx context.Context, src Source) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := src.Token(rctx); errors.Is(err, ErrMalformedToken) {
		return fmt.Errorf("%w; the lease was never held: %w", ctx.Err(), err)
	}
	return ctx.Err()
}
