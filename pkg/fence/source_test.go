package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestParseAnnotationsGolden parses files the kubelet's own formatter wrote
// (hack/tools/cmd/downward-golden), escapes and all.
func TestParseAnnotationsGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.annotations")
	if err != nil || len(files) < 4 {
		t.Fatalf("golden files: %v %v", files, err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		wantRaw, err := os.ReadFile(strings.TrimSuffix(f, ".annotations") + ".json")
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		if err := json.Unmarshal(wantRaw, &want); err != nil {
			t.Fatal(err)
		}
		got, err := ParseAnnotations(raw)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\n got %q\nwant %q", f, got, want)
		}
	}
}

func TestParseAnnotationsRefusals(t *testing.T) {
	for in, want := range map[string]string{
		"no-equals":            `line 1: want key="value"`,
		"=\"v\"":               `line 1: want key="value"`,
		"k=v":                  `line 1: the value of k is not a double-quoted string`,
		"k=\"unterminated":     "not a double-quoted string",
		"a=\"1\"\nb=`raw`":     "line 2: the value of b",
		"k=\"bad \\q escape\"": "not a double-quoted string",
	} {
		if _, err := ParseAnnotations([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseAnnotations(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

func TestFileSource(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "annotations")
	src := FileSource{Path: path, Lease: "report"}
	if err := os.WriteFile(path, mustRead(t, "testdata/simple.annotations"), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := src.Token(ctx)
	if err != nil || tok != (Token{Lease: "report", Value: 354, LeaseID: 7587890612345678901}) {
		t.Fatalf("Token = %+v, %v", tok, err)
	}
	if err := os.WriteFile(path, mustRead(t, "testdata/other.annotations"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Token(ctx); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("without the annotation: %v, want ErrNotHolder", err)
	}
	if err := os.WriteFile(path, []byte(`lease.fencer.io/report="-3"`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Token(ctx); !errors.Is(err, ErrMalformedToken) || !strings.Contains(err.Error(), `annotation lease.fencer.io/report is "-3"`) {
		t.Fatalf("negative token: %v, want ErrMalformedToken naming the value", err)
	}
}

// A path resolved across the kubelet's swap of the volume's ..data
// directory can find the file missing for an instant: FileSource looks
// again once before it calls a missing file a misconfiguration (which ends
// RunExclusive), and a file still missing then is one.
func TestFileSourceLooksAgainForAMissingFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "annotations")
	src := FileSource{Path: path, Lease: "report"}
	done := make(chan error, 1)
	time.AfterFunc(swapGrace/5, func() { done <- os.WriteFile(path, mustRead(t, "testdata/simple.annotations"), 0o644) })
	tok, err := src.Token(ctx)
	if werr := <-done; werr != nil {
		t.Fatal(werr)
	}
	if err != nil || tok.Value != 354 {
		t.Fatalf("a file that appeared within %s: %+v, %v; want token 354", swapGrace, tok, err)
	}
	missing := FileSource{Path: path + ".none", Lease: "report"}
	if _, err := missing.Token(ctx); !errors.Is(err, ErrMisconfigured) {
		t.Fatalf("a file that stays missing: %v, want ErrMisconfigured", err)
	}
}

// A token annotation patched by hand into something that is no token
// ("12x") reads as not holding: RunExclusive waits for the controller to
// put it right, and, if its ctx ends first, says why it never started
// instead of a bare deadline. Patched so mid-tenure, it ends the work as
// a loss: no token can be trusted from it.
func TestRunExclusiveAndAMalformedTokenAnnotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "annotations")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src := FileSource{Path: path, Lease: "report"}
	ran := false
	write(`lease.fencer.io/report="12x"` + "\n")
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	err := RunExclusive(short, src, "report", 10*time.Millisecond, func(context.Context, Token) error { ran = true; return nil })
	if !errors.Is(err, ErrMalformedToken) || !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Fatalf("RunExclusive on a malformed annotation: ran %v, %v; want the deadline, naming ErrMalformedToken", ran, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The controller puts it right: the work starts under the token.
	go func() { time.Sleep(100 * time.Millisecond); write(`lease.fencer.io/report="12"` + "\n") }()
	err = RunExclusive(ctx, src, "report", 10*time.Millisecond, func(_ context.Context, tok Token) error {
		if tok.Value != 12 {
			return fmt.Errorf("ran under %+v", tok)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("RunExclusive once the annotation was put right: %v", err)
	}
	err = RunExclusive(ctx, src, "report", 10*time.Millisecond, func(ctx context.Context, tok Token) error {
		write(`lease.fencer.io/report="12x"` + "\n")
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("RunExclusive whose annotation became malformed: %v, want ErrLeaseLost", err)
	}
}

func TestWatchSeesChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := filepath.Join(t.TempDir(), "annotations")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`lease.fencer.io/report="5"`)
	ch := Watch(ctx, FileSource{Path: path, Lease: "report"}, "report", 10*time.Millisecond)
	if got := <-ch; got.Value != 5 {
		t.Fatalf("first: %+v", got)
	}
	write(`example.com/x="y"`)
	if got := <-ch; got != (Token{Lease: "report"}) {
		t.Fatalf("after losing the lease: %+v", got)
	}
	write(`lease.fencer.io/report="9"`)
	if got := <-ch; got.Value != 9 {
		t.Fatalf("after a new grant: %+v", got)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzParseAnnotations: whatever the file holds, parsing returns a map or an
// error, never a panic; and a map it returns survives formatting and parsing
// again unchanged.
func FuzzParseAnnotations(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.annotations")
	for _, file := range files {
		b, _ := os.ReadFile(file)
		f.Add(b)
	}
	f.Add([]byte("k=\"\\u00\""))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseAnnotations(data)
		if err != nil {
			return
		}
		again, err := ParseAnnotations([]byte(format(m)))
		if err != nil || !reflect.DeepEqual(m, again) {
			t.Fatalf("round trip of %q: %q, %v", data, again, err)
		}
	})
}

// format writes annotations the way the kubelet does (sorted key="quoted").
func format(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k + "=" + strconv.Quote(m[k]))
	}
	return b.String()
}

func TestRunExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "annotations")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`example.com/x="y"`) // not the holder yet
	src := FileSource{Path: path, Lease: "report"}
	started := make(chan Token, 1)
	done := make(chan error, 1)
	go func() {
		done <- RunExclusive(context.Background(), src, "report", 10*time.Millisecond, func(ctx context.Context, tok Token) error {
			started <- tok
			<-ctx.Done() // a long job, stopped only by losing the lease
			return ctx.Err()
		})
	}()
	select {
	case <-started:
		t.Fatal("ran before holding the lease")
	case <-time.After(100 * time.Millisecond):
	}
	write(`lease.fencer.io/report="11"`)
	if tok := <-started; tok.Value != 11 {
		t.Fatalf("ran with %+v", tok)
	}
	write(`lease.fencer.io/report="12"`) // failed over and back: a new tenure
	if err := <-done; !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("RunExclusive = %v, want ErrLeaseLost", err)
	}
}
