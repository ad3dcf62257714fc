package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// options are the flags every command shares.
type options struct {
	flags  *genericclioptions.ConfigFlags
	output string
	// out is where print writes: the command's output (os.Stdout unless a
	// test set another).
	out io.Writer
}

func (o *options) client() (client.Client, string, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	if err := fencerv1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", err
	}
	ns, err := o.namespace()
	return c, ns, err
}

// namespace is --namespace, or the kubeconfig context's namespace.
func (o *options) namespace() (string, error) {
	ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace()
	return ns, err
}

// print writes v as JSON or YAML when -o asks, else calls table.
func (o *options) print(v any, table func(w *tabwriter.Writer)) error {
	switch o.output {
	case "json":
		raw, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(o.out, string(raw))
		return err
	case "yaml":
		raw, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = o.out.Write(raw)
		return err
	case "":
		w := tabwriter.NewWriter(o.out, 0, 4, 3, ' ', 0)
		table(w)
		return w.Flush()
	}
	return fmt.Errorf("unknown output format %q: use json or yaml, or leave -o out for a table", o.output)
}

// ago formats how long before now t was, in kubectl's style.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration(now.Sub(t))
}

func duration(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		s = fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		s = fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	if neg {
		return "-" + s
	}
	return s
}
