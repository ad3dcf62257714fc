// Command kubectl-fencer is fencer's kubectl plugin. Installed on PATH (or
// with krew), it answers an operator's questions from the cluster:
//
//	kubectl fencer status [LEASE]          who holds it, since when, until when, and the candidates
//	kubectl fencer history LEASE           the tenures: holder, token, start, end, cause
//	kubectl fencer check OBJECT [--token N] what the webhook decides for a write now (a server-side dry run)
//	kubectl fencer ids IDRANGE             the blocks and slots, and which pod holds each
//	kubectl fencer locks [KEY-PREFIX]      the keyed locks held: key, token, holder, since, waiting
//
// It takes kubectl's usual flags (--namespace, --context, --kubeconfig,
// --as) and -o json|yaml.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

func main() {
	if err := root().Execute(); err != nil {
		if !errors.Is(err, errRefused) {
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		os.Exit(1)
	}
}

func root() *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	o := &options{flags: flags}
	cmd := &cobra.Command{
		Use:           "fencer",
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl fencer"},
		Short:         "Inspect fencer's Leases, IDRanges, keyed locks and fenced writes",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, _ []string) {
			o.out = cmd.OutOrStdout()
		},
	}
	flags.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVarP(&o.output, "output", "o", "", "Output format: json or yaml (a table when empty)")
	cmd.AddCommand(statusCmd(o), historyCmd(o), checkCmd(o), idsCmd(o), locksCmd(o))
	return cmd
}
