// Command promql-names reads PromQL expressions, one JSON string per line
// on stdin, and prints the metric names they select, one per line, sorted
// and without repeats. An expression that does not parse is an error naming
// it, so a typo in a shipped alert or dashboard fails the test that runs
// this, instead of silently matching nothing in production.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	names, err := read(bufio.NewScanner(os.Stdin))
	if err != nil {
		fmt.Fprintf(os.Stderr, "promql-names: %v\n", err)
		os.Exit(1)
	}
	for _, n := range names {
		fmt.Println(n)
	}
}

func read(sc *bufio.Scanner) ([]string, error) {
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	seen := map[string]bool{}
	for line := 1; sc.Scan(); line++ {
		var expr string
		if err := json.Unmarshal(sc.Bytes(), &expr); err != nil {
			return nil, fmt.Errorf("line %d is not a JSON string: %w", line, err)
		}
		if err := selected(expr, seen); err != nil {
			return nil, fmt.Errorf("line %d: %q: %w", line, expr, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// selected adds the metric names of expr's vector selectors to seen. A
// selector with no fixed name (a regexp on __name__) is an error: nothing
// could check it against what the manager exports.
func selected(expr string, seen map[string]bool) error {
	p := parser.NewParser(parser.Options{})
	node, err := p.ParseExpr(expr)
	if err != nil {
		return err
	}
	var bad error
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			bad = fmt.Errorf("selector %s has no metric name", vs)
			return nil
		}
		seen[name] = true
		return nil
	})
	return bad
}
