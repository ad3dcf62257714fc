package dbfence

// HighestPlaceholder is highestPlaceholder, for the tests that ask a real
// PostgreSQL.
var HighestPlaceholder = highestPlaceholder

// MaxPlaceholder is maxPlaceholder, the number a run of digits too long
// for PostgreSQL reads as.
const MaxPlaceholder = maxPlaceholder

// PlaceholderCase is a statement and the highest parameter it takes.
type PlaceholderCase struct {
	Query string
	Want  int
}

// PlaceholderCases are placeholderCases, for the same tests.
func PlaceholderCases() []PlaceholderCase {
	var cs []PlaceholderCase
	for _, c := range placeholderCases {
		cs = append(cs, PlaceholderCase{c.query, c.want})
	}
	return cs
}
