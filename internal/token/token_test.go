package token

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{"1": 1, "42": 42, "0": 0, "007": 7, "9223372036854775807": 1<<63 - 1} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
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
		_, err := Parse(in)
		var m *MalformedError
		if !errors.As(err, &m) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v; want a MalformedError containing %q", in, err, want)
		}
		if len(err.Error()) > 200 {
			t.Errorf("Parse error for a %d-byte input is %d bytes long", len(in), len(err.Error()))
		}
	}
	if _, err := Parse(""); !errors.Is(err, ErrMissing) {
		t.Errorf("Parse(\"\") = %v, want ErrMissing", err)
	}
}

// FuzzParse: any string parses to the int64 it spells in plain digits, or is
// refused with an error; never a panic, never a wrong value.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"1", "", "-1", "9223372036854775808", "00", "1 ", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if n < 0 || strings.TrimLeft(strconv.FormatInt(n, 10), "0") != strings.TrimLeft(s, "0") {
			t.Fatalf("Parse(%q) = %d", s, n)
		}
	})
}
