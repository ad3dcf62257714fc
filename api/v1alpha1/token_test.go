package v1alpha1

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseToken(t *testing.T) {
	for in, want := range map[string]int64{"1": 1, "42": 42, "0": 0, "007": 7, "9223372036854775807": 1<<63 - 1} {
		got, err := ParseToken(in)
		if err != nil || got != want {
			t.Errorf("ParseToken(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"-1":                      `character '-' at offset 0`,
		"+1":                      `character '+' at offset 0`,
		" 1":                      `character ' ' at offset 0`,
		"1e3":                     `character 'e' at offset 1`,
		"0x1f":                    `character 'x' at offset 1`,
		"١":                       `only decimal digits`,
		"9223372036854775808":     "does not fit a 64-bit integer",
		strings.Repeat("9", 5000): "does not fit",
	} {
		_, err := ParseToken(in)
		var m *MalformedTokenError
		if !errors.As(err, &m) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseToken(%q) = %v; want a MalformedTokenError containing %q", in, err, want)
		}
		if len(err.Error()) > 200 {
			t.Errorf("Parse error for a %d-byte input is %d bytes long", len(in), len(err.Error()))
		}
	}
	if _, err := ParseToken(""); !errors.Is(err, ErrMissingToken) {
		t.Errorf("ParseToken(\"\") = %v, want ErrMissing", err)
	}
}

// FuzzParse: any string parses to the int64 it spells in plain digits, or is
// refused with an error; never a panic, never a wrong value.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"1", "", "-1", "9223372036854775808", "00", "1 ", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseToken(s)
		if err != nil {
			return
		}
		if n < 0 || strings.TrimLeft(strconv.FormatInt(n, 10), "0") != strings.TrimLeft(s, "0") {
			t.Fatalf("ParseToken(%q) = %d", s, n)
		}
	})
}
