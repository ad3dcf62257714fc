package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseClockOffset(t *testing.T) {
	for _, c := range []struct {
		env     string
		want    time.Duration
		wantErr string
	}{
		{"", 0, ""},
		{"-500ms", -500 * time.Millisecond, ""},
		{"2s", 2 * time.Second, ""},
		{"500", 0, `CLOCK_OFFSET="500": want a Go duration such as -500ms`},
		{"half a second", 0, `CLOCK_OFFSET="half a second"`},
	} {
		t.Setenv("CLOCK_OFFSET", c.env)
		got, err := parseClockOffset()
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("CLOCK_OFFSET=%q: got error %v, want one containing %q", c.env, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("CLOCK_OFFSET=%q: got %v, %v; want %v", c.env, got, err, c.want)
		}
	}
}
