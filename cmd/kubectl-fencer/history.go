package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// tenure is one row of `history`.
type tenure struct {
	Holder string     `json:"holder"`
	Token  int64      `json:"token"`
	Start  time.Time  `json:"start"`
	End    *time.Time `json:"end,omitempty"`
	Cause  string     `json:"cause,omitempty"`
}

func historyCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "history LEASE",
		Short: "The Lease's last tenures, newest first: holder, token, start, end and what ended it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := o.client()
			if err != nil {
				return err
			}
			var l fencerv1.Lease
			if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: ns, Name: args[0]}, &l); err != nil {
				return fmt.Errorf("lease %s/%s: %w", ns, args[0], err)
			}
			rows := []tenure{}
			for _, t := range l.Status.History {
				r := tenure{Holder: t.Holder, Token: t.Token, Cause: string(t.EndReason), Start: t.Start.Time}
				if t.End != nil {
					end := t.End.Time
					r.End = &end
				}
				rows = append(rows, r)
			}
			return o.print(rows, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "HOLDER\tTOKEN\tSTART\tEND\tHELD\tCAUSE")
				for _, r := range rows {
					end, held, cause := "-", ago(time.Now(), r.Start), orDash(r.Cause)
					if r.End != nil {
						end, held = r.End.UTC().Format(time.RFC3339), duration(r.End.Sub(r.Start))
					} else {
						cause = "(holding)"
					}
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\n", r.Holder, r.Token, r.Start.UTC().Format(time.RFC3339), end, held, cause)
				}
			})
		},
	}
}
