package v1alpha1

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrMissingToken means no token was given.
var ErrMissingToken = errors.New("missing fencing token")

// MalformedTokenError says why a token string is not a token.
// +kubebuilder:object:generate=false
type MalformedTokenError struct {
	Value  string
	Reason string
}

func (e *MalformedTokenError) Error() string {
	return fmt.Sprintf("malformed fencing token %q: %s", truncate(e.Value), e.Reason)
}

// maxShown bounds how much of a bad value an error repeats back.
const maxShown = 40

func truncate(s string) string {
	if len(s) <= maxShown {
		return s
	}
	return s[:maxShown] + "…"
}

// ParseToken accepts only plain decimal digits that fit an int64: no sign, no
// spaces, no exponent, no hex. Tokens are etcd revisions, so anything else is
// a mistake or a forgery, and saying which helps the person who made it.
func ParseToken(s string) (int64, error) {
	if s == "" {
		return 0, ErrMissingToken
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < '0' || c > '9' {
			return 0, &MalformedTokenError{Value: s, Reason: fmt.Sprintf("character %q at offset %d; only decimal digits are allowed", rune(c), i)}
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, &MalformedTokenError{Value: s, Reason: "does not fit a 64-bit integer"}
	}
	return n, nil
}

// FormatToken is the annotation value of token t: plain decimal digits, the
// only form ParseToken accepts.
func FormatToken(t int64) string { return strconv.FormatInt(t, 10) }
