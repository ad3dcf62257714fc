package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// idsView is an IDRange as `ids` shows it.
type idsView struct {
	Namespace  string    `json:"namespace"`
	Name       string    `json:"name"`
	Mode       string    `json:"mode"`
	Min        int64     `json:"min"`
	Max        int64     `json:"max"`
	Next       int64     `json:"next,omitempty"`
	SlotsInUse int32     `json:"slotsInUse,omitempty"`
	Remaining  int64     `json:"remaining"`
	Holders    []idsHeld `json:"holders"`
}

// idsHeld is what one pod holds: a block, or a slot under a token.
type idsHeld struct {
	Pod   string `json:"pod"`
	Ready bool   `json:"ready"`
	Block string `json:"block,omitempty"`
	Slot  string `json:"slot,omitempty"`
	Token string `json:"token,omitempty"`
}

func idsCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "ids IDRANGE",
		Short: "The IDRange's blocks or slots, and which pod holds each",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := o.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var r fencerv1.IDRange
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: args[0]}, &r); err != nil {
				return fmt.Errorf("idrange %s/%s: %w", ns, args[0], err)
			}
			sel, err := metav1.LabelSelectorAsSelector(&r.Spec.PodSelector)
			if err != nil {
				return fmt.Errorf("idrange %s/%s: spec.podSelector: %w", ns, r.Name, err)
			}
			var pods corev1.PodList
			if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
				return err
			}
			v := idsView{Namespace: ns, Name: r.Name, Mode: string(r.Spec.Mode), Min: r.Spec.Min, Max: r.Spec.Max,
				Next: r.Status.Next, SlotsInUse: r.Status.SlotsInUse, Remaining: r.Status.Remaining, Holders: []idsHeld{}}
			for _, p := range pods.Items {
				h := idsHeld{Pod: p.Name, Ready: podReady(&p)}
				for _, part := range strings.Split(p.Annotations[fencerv1.IDRangeAnnotationPrefix+r.Name], ",") {
					switch k, val, _ := strings.Cut(part, "="); k {
					case "block":
						h.Block = val
					case "slot":
						h.Slot = val
					case "token":
						h.Token = val
					}
				}
				v.Holders = append(v.Holders, h)
			}
			return o.print(v, func(w *tabwriter.Writer) { idsTable(w, v) })
		},
	}
}

func idsTable(w *tabwriter.Writer, v idsView) {
	fmt.Fprintf(w, "IDRange:\t%s/%s\n", v.Namespace, v.Name)
	fmt.Fprintf(w, "Mode:\t%s, [%d, %d]\n", v.Mode, v.Min, v.Max)
	if v.Mode == string(fencerv1.ModeBlocks) {
		fmt.Fprintf(w, "Next:\t%d\n", v.Next)
	} else {
		fmt.Fprintf(w, "Slots in use:\t%d\n", v.SlotsInUse)
	}
	fmt.Fprintf(w, "Remaining:\t%d\n\n", v.Remaining)
	if v.Mode == string(fencerv1.ModeBlocks) {
		fmt.Fprintln(w, "POD\tREADY\tBLOCK")
		for _, h := range v.Holders {
			fmt.Fprintf(w, "%s\t%v\t%s\n", h.Pod, h.Ready, orDash(h.Block))
		}
		return
	}
	fmt.Fprintln(w, "POD\tREADY\tSLOT\tTOKEN")
	for _, h := range v.Holders {
		fmt.Fprintf(w, "%s\t%v\t%s\t%s\n", h.Pod, h.Ready, orDash(h.Slot), orDash(h.Token))
	}
}
