// Command downward-golden writes pkg/fence's Downward API golden files with
// the kubelet's own formatter (k8s.io/kubernetes/pkg/fieldpath.FormatMap),
// so the SDK's parser is tested against exactly what a kubelet writes.
//
//	cd hack/tools && go run ./cmd/downward-golden ../../pkg/fence/testdata
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/kubernetes/pkg/fieldpath"
)

var cases = map[string]map[string]string{
	"simple": {"lease.fencer.io/report": "354", "leaseid.fencer.io/report": "7587890612345678901"},
	"escapes": {
		"lease.fencer.io/report":                           "42",
		"kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\n\"metadata\":{\"name\":\"a\\\\b\"}}\n",
		"example.com/tabs":                                 "a\tb\r\nc",
		"example.com/unicode":                              "naïve ☃ \u2028 \x00 end",
		"example.com/equals":                               "a=b=\"c\"",
		"example.com/empty":                                "",
	},
	"none":  {},
	"other": {"example.com/x": "y", "idrange.fencer.io/ids": "block=1-1000"},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: downward-golden <testdata-dir>")
		os.Exit(2)
	}
	for name, m := range cases {
		if err := os.WriteFile(filepath.Join(os.Args[1], name+".annotations"), []byte(fieldpath.FormatMap(m)), 0o644); err != nil {
			panic(err)
		}
		want, _ := json.MarshalIndent(m, "", "  ")
		if err := os.WriteFile(filepath.Join(os.Args[1], name+".json"), append(want, '\n'), 0o644); err != nil {
			panic(err)
		}
	}
}
