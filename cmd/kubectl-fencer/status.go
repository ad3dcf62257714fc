package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// leaseStatus is one Lease as `status` shows it.
type leaseStatus struct {
	Namespace  string      `json:"namespace"`
	Name       string      `json:"name"`
	Holder     string      `json:"holder,omitempty"`
	Token      int64       `json:"token,omitempty"`
	Renewal    string      `json:"renewal"`
	Policy     string      `json:"policy"`
	TTLSeconds int32       `json:"ttlSeconds"`
	HeldSince  *time.Time  `json:"heldSince,omitempty"`
	ExpiresAt  *time.Time  `json:"expiresAt,omitempty"`
	Ready      string      `json:"ready"`
	Reason     string      `json:"reason,omitempty"`
	Candidates []candidate `json:"candidates"`
}

type candidate struct {
	Pod    string `json:"pod"`
	Ready  bool   `json:"ready"`
	Holder bool   `json:"holder,omitempty"`
}

func statusCmd(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "status [LEASE]",
		Short: "Who holds each Lease (or LEASE), since when, until when as the controller sees it, and the candidates",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := o.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var leases []fencerv1.Lease
			if len(args) == 1 {
				var l fencerv1.Lease
				if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: args[0]}, &l); err != nil {
					return fmt.Errorf("lease %s/%s: %w", ns, args[0], err)
				}
				leases = []fencerv1.Lease{l}
			} else {
				var list fencerv1.LeaseList
				if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
					return err
				}
				leases = list.Items
			}
			// One list of the namespace's pods serves every Lease's candidates.
			var pods corev1.PodList
			if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
				return err
			}
			out := []leaseStatus{} // [] in JSON for a namespace with none, not null
			for i := range leases {
				out = append(out, statusOf(&leases[i], pods.Items))
			}
			if len(args) == 1 {
				return o.print(out[0], func(w *tabwriter.Writer) { o.detail(w, out[0]) })
			}
			if len(out) == 0 && o.output == "" {
				// As kubectl get says it: a namespace with no Lease (or none
				// at all, or a typo) is not an empty table.
				fmt.Fprintf(cmd.ErrOrStderr(), "No fencer Leases found in namespace %s.\n", ns)
				return nil
			}
			return o.print(out, func(w *tabwriter.Writer) { o.table(w, out) })
		},
	}
}

// statusOf is l as status shows it. A selector that cannot be parsed
// matches no pod, as the controller reads it: the Lease is listed with no
// candidates and its Ready reason (InvalidSelector) says why.
func statusOf(l *fencerv1.Lease, pods []corev1.Pod) leaseStatus {
	s := leaseStatus{
		Namespace: l.Namespace, Name: l.Name, Holder: l.Status.Holder, Token: l.Status.Token,
		Renewal: string(l.Spec.Renewal), Policy: string(l.Spec.Policy), TTLSeconds: l.Spec.TTLSeconds,
		Ready: "Unknown", Candidates: []candidate{},
	}
	if l.Status.Holder != "" && l.Status.AcquireTime != nil {
		t := l.Status.AcquireTime.Time
		s.HeldSince = &t
	}
	if l.Status.Holder != "" && l.Status.ExpireTime != nil {
		t := l.Status.ExpireTime.Time
		s.ExpiresAt = &t
	}
	if cond := meta.FindStatusCondition(l.Status.Conditions, fencerv1.ConditionReady); cond != nil {
		s.Ready, s.Reason = string(cond.Status), cond.Reason
	}
	sel, err := metav1.LabelSelectorAsSelector(&l.Spec.HolderSelector)
	if err != nil {
		return s
	}
	for _, p := range pods {
		if !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		s.Candidates = append(s.Candidates, candidate{Pod: p.Name, Ready: podReady(&p), Holder: p.Name == l.Status.Holder})
	}
	return s
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (o *options) table(w *tabwriter.Writer, leases []leaseStatus) {
	now := time.Now()
	fmt.Fprintln(w, "NAME\tHOLDER\tTOKEN\tRENEWAL\tHELD FOR\tEXPIRES IN\tREADY\tCANDIDATES")
	for _, s := range leases {
		ready := 0
		for _, c := range s.Candidates {
			if c.Ready {
				ready++
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d Ready\n", s.Name, orDash(s.Holder), token(s.Token), s.Renewal,
			since(now, s.HeldSince), expiry(now, s), readiness(s), ready, len(s.Candidates))
	}
}

func (o *options) detail(w *tabwriter.Writer, s leaseStatus) {
	now := time.Now()
	fmt.Fprintf(w, "Lease:\t%s/%s\n", s.Namespace, s.Name)
	fmt.Fprintf(w, "Holder:\t%s\n", orDash(s.Holder))
	fmt.Fprintf(w, "Token:\t%s\n", token(s.Token))
	fmt.Fprintf(w, "Renewal:\t%s (TTL %ds)\n", s.Renewal, s.TTLSeconds)
	fmt.Fprintf(w, "Policy:\t%s\n", s.Policy)
	fmt.Fprintf(w, "Held for:\t%s\n", since(now, s.HeldSince))
	fmt.Fprintf(w, "Expires in:\t%s\n", expiry(now, s))
	fmt.Fprintf(w, "Ready:\t%s\n", readiness(s))
	fmt.Fprintln(w, "Candidates:")
	fmt.Fprintln(w, "  POD\tREADY\tHOLDER")
	for _, c := range s.Candidates {
		holder := ""
		if c.Holder {
			holder = "*"
		}
		fmt.Fprintf(w, "  %s\t%v\t%s\n", c.Pod, c.Ready, holder)
	}
}

func readiness(s leaseStatus) string {
	if s.Reason == "" {
		return s.Ready
	}
	return s.Ready + " (" + s.Reason + ")"
}

func since(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	return ago(now, *t)
}

// expiry is when the grant runs out as the controller sees it. The status
// records expireTime only every 30 s (docs/concepts.md), while the etcd
// lease is renewed every TTL/3: once that time has passed, the grant lives
// on renewals, and runs out at most one TTL after the last.
func expiry(now time.Time, s leaseStatus) string {
	switch {
	case s.ExpiresAt == nil:
		return "-"
	case s.ExpiresAt.After(now):
		return duration(s.ExpiresAt.Sub(now))
	case s.Renewal == string(fencerv1.RenewalDirect):
		return fmt.Sprintf("renewed by the holder (TTL %ds)", s.TTLSeconds)
	}
	return fmt.Sprintf("renewed by fencer (TTL %ds)", s.TTLSeconds)
}

func token(t int64) string {
	if t == 0 {
		return "-"
	}
	return fmt.Sprint(t)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
