package controllers

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// outcome is what an inner reconcile decided beyond the status it set.
type outcome struct {
	result ctrl.Result
	events []recordedEvent
	// afterStatus runs once the status is written, or needed no write:
	// what must never get ahead of the status, such as a token reaching a
	// pod before the status records it as issued.
	afterStatus func(context.Context) error
	// statusRefused runs, best effort, when the status write fails: what
	// may go ahead without it, such as taking a released token away, so a
	// status write refused again and again holds none of it back.
	statusRefused func(context.Context)
	// cacheBehind: the pass found the cache's copy of its object older
	// than the API's (staleCopies) and decided nothing; it writes nothing
	// and runs again once the cache has caught up.
	cacheBehind bool
}

// waitForCache is the outcome of a pass whose cache is behind.
func waitForCache() outcome {
	return outcome{result: ctrl.Result{RequeueAfter: staleRetry}, cacheBehind: true}
}

type recordedEvent struct{ kind, reason, note string }

func (o *outcome) event(kind, reason, format string, args ...any) {
	o.events = append(o.events, recordedEvent{kind, reason, fmt.Sprintf(format, args...)})
}

// requeueAt asks to run again at t, keeping the earliest of several asks.
func (o *outcome) requeueAt(now, t time.Time) {
	d := max(t.Sub(now), time.Millisecond)
	if o.result.RequeueAfter == 0 || d < o.result.RequeueAfter {
		o.result.RequeueAfter = d
	}
}
