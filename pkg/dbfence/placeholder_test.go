package dbfence

import (
	"strconv"
	"strings"
	"testing"
)

// placeholderCases are statements with what PostgreSQL reads as their
// highest parameter. TestHighestPlaceholderAgreesWithPostgreSQL asks a
// real server about the SELECTs among them.
var placeholderCases = []struct {
	query string
	want  int
}{
	{`INSERT INTO t VALUES ($1, $2)`, 2},
	{`UPDATE t SET a = $12 WHERE b = $3`, 12},
	{`SELECT 1`, 0},
	{`SELECT $1::int, '$5'`, 1},
	{`SELECT $1::int AS "$7"`, 1},
	{`SELECT $1::int AS "a""$7"`, 1},
	{`SELECT 'it''s $4', $1::int`, 1},
	{`SELECT E'\'$8', $1::int`, 1},
	{`SELECT e'x\\', $1::int`, 1},
	{`SELECT 'x\', $1::int`, 1},
	{`SELECT U&'$5', $1::int`, 1},
	{`SELECT $$ $9 $$, $1::int`, 1},
	{`SELECT $a$ $9 $$ $a $a$, $1::int, $2::int`, 2},
	{`SELECT $a1$ $9 $a1$, $1::int`, 1},
	{"SELECT $1::int -- $10\n, $2::int", 2},
	{"SELECT $1::int -- $10\r, $2::int", 2},
	{`SELECT /* $6 /* $4 */ $3 */ $1::int`, 1},
	{`SELECT 1 AS a$1`, 0},
	{`SELECT 1 AS é$1`, 0},
	{`SELECT $1::int, $2::text, $3::bigint`, 3},
	{`SELECT $1::int+$2::int`, 2},
	{`SELECT (ARRAY[$1::int])[1]`, 1},
	{`SELECT $99999999999999999999::int`, maxPlaceholder},
	{`$`, 0},
	{`'unterminated $3`, 0},
	{`/* unterminated $3`, 0},
	{`$$ unterminated $3`, 0},
}

func TestHighestPlaceholder(t *testing.T) {
	for _, c := range placeholderCases {
		if got := highestPlaceholder(c.query); got != c.want {
			t.Errorf("highestPlaceholder(%q) = %d, want %d", c.query, got, c.want)
		}
	}
}

// FuzzHighestPlaceholder: any bytes are read without a panic, and what a
// literal, a comment or a dollar-quoted string holds is no parameter.
func FuzzHighestPlaceholder(f *testing.F) {
	for _, c := range placeholderCases {
		f.Add(c.query)
	}
	f.Fuzz(func(t *testing.T, q string) {
		n := highestPlaceholder(q)
		if n < 0 || n > maxPlaceholder {
			t.Fatalf("highestPlaceholder(%q) = %d", q, n)
		}
		if got := highestPlaceholder("$3 " + q); got < 3 {
			t.Fatalf("%q after $3: %d", q, got)
		}
		inert := map[string]bool{}
		if !strings.Contains(q, "'") {
			inert["'"+q+"'"] = true
		}
		if !strings.Contains(q, `"`) {
			inert[`"`+q+`"`] = true
		}
		if !strings.ContainsAny(q, "\n\r") {
			inert["-- "+q+"\n"] = true
		}
		if !strings.Contains(q, "$x$") {
			inert["$x$"+q+"$x$"] = true
		}
		if !strings.ContainsAny(q, "/*") {
			inert["/*"+q+"*/"] = true
		}
		for s := range inert {
			if got := highestPlaceholder(s + " $1"); got != 1 {
				t.Fatalf("highestPlaceholder(%q) = %d, want 1: the wrapped %q holds no parameter", s+" $1", got, q)
			}
		}
	})
}

// A parameter number is read whole, however long.
func TestHighestPlaceholderReadsLongNumbers(t *testing.T) {
	for _, n := range []int{9, 10, 65535, 65536} {
		if got := highestPlaceholder("SELECT $" + strconv.Itoa(n)); got != n {
			t.Errorf("$%d read as %d", n, got)
		}
	}
}

// The verb Exec checks is the statement's first word past whitespace and
// comments, as PostgreSQL reads it: a leading comment (tools and ORMs
// write them) no longer hides an UPDATE, and cannot hide a WITH.
func TestLeadingVerb(t *testing.T) {
	for query, want := range map[string]string{
		"UPDATE t SET a = 1":                             "UPDATE",
		"  \n\tdelete from t":                            "delete",
		"-- the nightly job\nUPDATE t SET a = 1":         "UPDATE",
		"-- ends at a carriage return\rUPDATE t":         "UPDATE",
		"/* app=orders */ INSERT INTO t VALUES (1)":      "INSERT",
		"/* outer /* nested */ still a comment */UPDATE": "UPDATE",
		"/* hides */ WITH x AS (SELECT 1) UPDATE t":      "WITH",
		"-- only a comment":                              "",
		"/* never closed UPDATE t":                       "",
		"UPDATE\"t\" SET a = 1":                          "UPDATE",
		"(SELECT 1)":                                     "(",
		"":                                               "",
	} {
		if got := leadingVerb(query); got != want {
			t.Errorf("leadingVerb(%q) = %q, want %q", query, got, want)
		}
	}
}

// FuzzLeadingVerb: whatever the statement, the verb is a piece of it, and
// a comment put in front of a statement does not change its verb.
func FuzzLeadingVerb(f *testing.F) {
	for _, q := range []string{"UPDATE t SET a = 1", "-- c\nDELETE FROM t", "/* /* */ */WITH x", "/*", "--", "\xff", ""} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		v := leadingVerb(q)
		if !strings.Contains(q, v) {
			t.Fatalf("leadingVerb(%q) = %q, not part of it", q, v)
		}
		if got := leadingVerb("/* a comment */ " + q); got != v {
			t.Fatalf("a comment in front of %q changed its verb from %q to %q", q, v, got)
		}
	})
}
