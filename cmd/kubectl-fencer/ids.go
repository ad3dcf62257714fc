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
	// Warning says why the holders are not the selector's pods.
	Warning string `json:"warning,omitempty"`
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
			v := idsView{Namespace: ns, Name: r.Name, Mode: string(r.Spec.Mode), Min: r.Spec.Min, Max: r.Spec.Max,
				Next: r.Status.Next, SlotsInUse: r.Status.SlotsInUse, Remaining: r.Status.Remaining, Holders: []idsHeld{}}
			opts := []client.ListOption{client.InNamespace(ns)}
			annotation := fencerv1.IDRangeAnnotationPrefix + r.Name
			sel, err := metav1.LabelSelectorAsSelector(&r.Spec.PodSelector)
			if err != nil {
				// The controller hands out nothing then, and what pods hold
				// stays theirs: show those.
				v.Warning = fmt.Sprintf("spec.podSelector is invalid (%v); these are the pods that carry %s", err, annotation)
			} else {
				opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
			}
			var pods corev1.PodList
			if err := c.List(ctx, &pods, opts...); err != nil {
				return err
			}
			for _, p := range pods.Items {
				if _, has := p.Annotations[annotation]; v.Warning != "" && !has {
					continue
				}
				h := idsHeld{Pod: p.Name, Ready: podReady(&p)}
				for _, part := range strings.Split(p.Annotations[annotation], ",") {
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
	fmt.Fprintf(w, "Remaining:\t%d\n", v.Remaining)
	if v.Warning != "" {
		fmt.Fprintf(w, "Warning:\t%s\n", v.Warning)
	}
	fmt.Fprintln(w)
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
