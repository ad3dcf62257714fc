package webhook

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// maxAnswerMargin bounds the time a review keeps back, out of the
// apiserver's timeout, to carry its answer back.
const maxAnswerMargin = time.Second

// answerDeadline is the context a review is judged in: r's, ending ahead
// of the apiserver's own deadline.
//
// The apiserver tells a webhook how long it will wait, in the request's
// timeout query parameter (what is left of the webhook's timeoutSeconds).
// A review still running then is answered by nobody: the apiserver gives
// up, applies failurePolicy Fail, and the user reads "context deadline
// exceeded" with no reason. So a read that stalls (a blackholed link to
// the apiserver or to etcd) is cut a fifth of that timeout early, at most
// maxAnswerMargin, and the write is refused with fencer's own message,
// naming what could not be read. A request without a timeout (not sent by
// an apiserver) keeps r's context.
func answerDeadline(r *http.Request) (context.Context, context.CancelFunc) {
	t, ok := requestTimeout(r.URL.RawQuery)
	if !ok {
		return r.Context(), func() {}
	}
	return context.WithTimeout(r.Context(), t-min(t/5, maxAnswerMargin))
}

// requestTimeout reads the timeout parameter of a raw query, without
// url.ParseQuery's map: this runs on every review.
func requestTimeout(rawQuery string) (time.Duration, bool) {
	for rawQuery != "" {
		var param string
		param, rawQuery, _ = strings.Cut(rawQuery, "&")
		v, found := strings.CutPrefix(param, "timeout=")
		if !found {
			continue
		}
		// Durations under a millisecond are written in µs, escaped.
		if s, err := url.QueryUnescape(v); err == nil {
			v = s
		}
		t, err := time.ParseDuration(v)
		if err != nil || t <= 0 {
			return 0, false
		}
		return t, true
	}
	return 0, false
}
