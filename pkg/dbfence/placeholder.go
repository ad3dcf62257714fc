package dbfence

// highestPlaceholder is the highest parameter $n that PostgreSQL would read
// in query, 0 for none. Exec numbers the guard's parameters after the
// caller's, so a statement that refers to one parameter more than it was
// given arguments would bind the guard's resource or token in its place,
// where the driver would otherwise refuse it: Exec checks with this first.
//
// It passes over what PostgreSQL does not read as a parameter: string
// literals ('…', and E'…' with its backslash escapes), dollar-quoted
// strings ($$…$$, $tag$…$tag$), quoted identifiers ("…"), comments (-- to
// the end of the line, a \n or a \r, and /* */, which nest), and a $
// inside a name (a$1 is one identifier). It assumes standard_conforming_strings, PostgreSQL's
// default since 9.1. A query it misreads is one PostgreSQL refuses too.
func highestPlaceholder(query string) int {
	s := placeholderScan{q: query}
	for s.i < len(s.q) {
		s.step()
	}
	return s.highest
}

// leadingVerb is the first word of query that PostgreSQL reads: after
// whitespace and comments (-- to the end of the line, and /* */, which
// nest), so that Exec takes a statement that opens with a comment, as
// tools and ORMs write them, and still sees a WITH behind one.
func leadingVerb(query string) string {
	s := placeholderScan{q: query}
	for s.i < len(s.q) {
		switch c := s.q[s.i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			s.i++
		case c == '-' && s.at(s.i+1) == '-':
			s.lineComment()
		case c == '/' && s.at(s.i+1) == '*':
			s.blockComment()
		default:
			start := s.i
			for s.i < len(s.q) && identPart(s.q[s.i]) {
				s.i++
			}
			if s.i == start {
				s.i++ // not a word: name the one character
			}
			return s.q[start:s.i]
		}
	}
	return ""
}

// maxPlaceholder caps what a long run of digits reads as: PostgreSQL
// allows at most 65,535 parameters, so any $n above that is too many.
const maxPlaceholder = 1 << 20

type placeholderScan struct {
	q       string
	i       int
	highest int
}

// step reads one token at s.i: skipped whole, or, for a parameter, its
// number kept.
func (s *placeholderScan) step() {
	c := s.q[s.i]
	switch {
	case c == '\'':
		s.quoted('\'', false)
	case c == '"':
		s.quoted('"', false)
	case c == '-' && s.at(s.i+1) == '-':
		s.lineComment()
	case c == '/' && s.at(s.i+1) == '*':
		s.blockComment()
	case c == '$':
		s.dollar()
	case identStart(c):
		start := s.i
		for s.i < len(s.q) && identPart(s.q[s.i]) {
			s.i++
		}
		// E'…' (or e'…') is the one literal whose backslash escapes a quote.
		if s.i-start == 1 && (c == 'E' || c == 'e') && s.at(s.i) == '\'' {
			s.quoted('\'', true)
		}
	default:
		s.i++
	}
}

// at is the byte at i, 0 past the end.
func (s *placeholderScan) at(i int) byte {
	if i < len(s.q) {
		return s.q[i]
	}
	return 0
}

// quoted skips a literal or quoted identifier that opens at s.i with q; a
// doubled q is one q inside it, and with backslashes, so is \q.
func (s *placeholderScan) quoted(q byte, backslashes bool) {
	s.i++
	for s.i < len(s.q) {
		switch c := s.q[s.i]; {
		case backslashes && c == '\\':
			s.i += 2
		case c == q && s.at(s.i+1) == q:
			s.i += 2
		case c == q:
			s.i++
			return
		default:
			s.i++
		}
	}
}

// lineComment skips a -- comment: to the end of its line, which for
// PostgreSQL's lexer is a \n or a \r alone too.
func (s *placeholderScan) lineComment() {
	for s.i < len(s.q) && s.q[s.i] != '\n' && s.q[s.i] != '\r' {
		s.i++
	}
}

func (s *placeholderScan) blockComment() {
	depth := 0
	for s.i < len(s.q) {
		switch {
		case s.q[s.i] == '/' && s.at(s.i+1) == '*':
			depth++
			s.i += 2
		case s.q[s.i] == '*' && s.at(s.i+1) == '/':
			depth--
			s.i += 2
			if depth == 0 {
				return
			}
		default:
			s.i++
		}
	}
}

// dollar reads what starts with a $ outside a name: a parameter ($1), or
// the opening delimiter of a dollar-quoted string ($$ or $tag$), which it
// skips to its closing delimiter.
func (s *placeholderScan) dollar() {
	j := s.i + 1
	if isDigit(s.at(j)) {
		n := 0
		for ; isDigit(s.at(j)); j++ {
			n = min(n*10+int(s.q[j]-'0'), maxPlaceholder)
		}
		s.highest = max(s.highest, n)
		s.i = j
		return
	}
	for identStart(s.at(j)) || (j > s.i+1 && isDigit(s.at(j))) {
		j++
	}
	if s.at(j) != '$' {
		s.i++ // a lone $: not PostgreSQL's, let the server say so
		return
	}
	delim := s.q[s.i : j+1]
	s.i = j + 1
	for s.i < len(s.q) {
		if s.q[s.i] == '$' && len(s.q)-s.i >= len(delim) && s.q[s.i:s.i+len(delim)] == delim {
			s.i += len(delim)
			return
		}
		s.i++
	}
}

// identStart is a byte that may begin a name: a letter, _, or any byte of
// a multibyte UTF-8 character, as PostgreSQL's lexer reads them.
func identStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

// identPart is a byte that may continue a name: digits and $ too.
func identPart(c byte) bool { return identStart(c) || isDigit(c) || c == '$' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
