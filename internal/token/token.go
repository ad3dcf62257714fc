// Package token parses fencing tokens as they travel in annotations.
package token

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrMissing means no token was given.
var ErrMissing = errors.New("missing fencing token")

// MalformedError says why a token string is not a token.
type MalformedError struct {
	Value  string
	Reason string
}

func (e *MalformedError) Error() string {
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

// Parse accepts only plain decimal digits that fit an int64: no sign, no
// spaces, no exponent, no hex. Tokens are etcd revisions, so anything else is
// a mistake or a forgery, and saying which helps the person who made it.
func Parse(s string) (int64, error) {
	if s == "" {
		return 0, ErrMissing
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < '0' || c > '9' {
			return 0, &MalformedError{Value: s, Reason: fmt.Sprintf("character %q at offset %d; only decimal digits are allowed", rune(c), i)}
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, &MalformedError{Value: s, Reason: "does not fit a 64-bit integer"}
	}
	return n, nil
}
