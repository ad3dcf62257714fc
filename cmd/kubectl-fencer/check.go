package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/resource"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// decision is what `check` learned from the webhook.
type decision struct {
	Object   string `json:"object"`
	Lease    string `json:"lease,omitempty"`
	Offered  string `json:"offeredToken,omitempty"`
	Allowed  bool   `json:"allowed"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	Current  string `json:"currentToken,omitempty"`
	Recorded string `json:"recordedToken,omitempty"`
	Holder   string `json:"holder,omitempty"`
	// OwnKind: a Lease, IDRange or WorkloadLease, which fencer's webhooks
	// never judge, whatever its labels.
	OwnKind bool `json:"fencersOwnKind,omitempty"`
	// ClusterScoped: the fencing webhooks take namespaced objects only,
	// so a fencer.io/lease label on this one fences nothing.
	ClusterScoped bool `json:"clusterScoped,omitempty"`
}

// ownKinds are the resources of fencer's own kinds. The fencing webhooks
// skip them (their matchCondition not-fencer-kind), so a fencer.io/lease
// label on one fences nothing.
var ownKinds = map[string]bool{"leases": true, "idranges": true, "workloadleases": true}

// errRefused ends `check` with exit status 1 once the decision is printed,
// as `kubectl auth can-i` exits 1 for "no", so a script can gate on it.
// main prints nothing more for it: the decision says why.
var errRefused = errors.New("the fencing webhook refuses the write")

func checkCmd(o *options) *cobra.Command {
	var tok string
	cmd := &cobra.Command{
		Use:   "check (TYPE/NAME | TYPE NAME) [--token N] [--as USER]",
		Short: "What the fencing webhook decides now for a write to an object: a server-side dry run, so the real webhook answers",
		Long: "check sends the smallest write to the object, a patch of its fencer.io/token annotation (to --token, or to none),\n" +
			"as a server-side dry run: the apiserver runs fencer's webhook and stores nothing. --as and --as-group send it as another user.\n" +
			"It exits 0 when the write would be allowed, 1 when it would be refused (the decision is printed either way), and 1 with an error otherwise.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, err := o.namespace()
			if err != nil {
				return err
			}
			infos, err := resource.NewBuilder(o.flags).Unstructured().NamespaceParam(ns).DefaultNamespace().
				ResourceTypeOrNameArgs(false, args...).SingleResourceType().Flatten().Do().Infos()
			if err != nil {
				return err
			}
			if len(infos) != 1 {
				return fmt.Errorf("%s names %d objects; check takes one", strings.Join(args, " "), len(infos))
			}
			info := infos[0]
			obj, err := meta.Accessor(info.Object)
			if err != nil {
				return err
			}
			d := decision{Object: strings.ToLower(info.Mapping.GroupVersionKind.Kind) + "/" + obj.GetName(), Offered: tok}
			res := info.Mapping.Resource
			d.OwnKind = res.Group == fencerv1.GroupVersion.Group && ownKinds[res.Resource]
			d.ClusterScoped = !info.Namespaced()
			// An empty label names no Lease and fences nothing (webhook.md).
			if lease := obj.GetLabels()[fencerv1.LeaseLabel]; lease != "" && !d.OwnKind && !d.ClusterScoped {
				d.Lease = obj.GetNamespace() + "/" + lease
			}
			// The smallest write: the token annotation alone (null: none).
			var value any
			if tok != "" {
				value = tok
			}
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{fencerv1.TokenAnnotation: value}}})
			_, err = resource.NewHelper(info.Client, info.Mapping).DryRun(true).Patch(obj.GetNamespace(), obj.GetName(), types.MergePatchType, patch, &metav1.PatchOptions{})
			if err := d.from(err); err != nil {
				return err
			}
			if err := o.print(d, func(w *tabwriter.Writer) { d.table(w) }); err != nil {
				return err
			}
			if !d.Allowed {
				return errRefused
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&tok, "token", "", "the fencing token the write sends (fencer.io/token); none when empty")
	return cmd
}

// from fills the decision from the dry run's answer. An error that is not
// a refusal (the object is gone, the apiserver is down) is returned.
func (d *decision) from(err error) error {
	if err == nil {
		d.Allowed = true
		return nil
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || (status.Status().Reason != metav1.StatusReasonConflict &&
		status.Status().Reason != metav1.StatusReasonForbidden && status.Status().Reason != metav1.StatusReasonInvalid) {
		return err
	}
	d.Message = status.Status().Message
	if details := status.Status().Details; details != nil {
		for _, c := range details.Causes {
			switch c.Type {
			case fencerv1.CauseReason:
				d.Reason = c.Message
			case fencerv1.CauseCurrentToken:
				d.Current = c.Message
			case fencerv1.CauseRecordedToken:
				d.Recorded = c.Message
			case fencerv1.CauseHolder:
				d.Holder = c.Message
			}
		}
	}
	if d.Reason == "" {
		return err // refused, but not by fencer: say so as kubectl would
	}
	return nil
}

func (d decision) table(w *tabwriter.Writer) {
	fmt.Fprintf(w, "Object:\t%s\n", d.Object)
	switch {
	case d.OwnKind:
		fmt.Fprintln(w, "Fenced by:\t- (fencer's own kind: never fenced, whatever its labels)")
	case d.ClusterScoped:
		fmt.Fprintln(w, "Fenced by:\t- (cluster-scoped: fencer fences namespaced objects only, whatever their labels)")
	case d.Lease == "":
		fmt.Fprintln(w, "Fenced by:\t- (no fencer.io/lease label)")
	default:
		fmt.Fprintf(w, "Fenced by:\tlease %s\n", d.Lease)
	}
	fmt.Fprintf(w, "Offered token:\t%s\n", orDash(d.Offered))
	if d.Allowed {
		fmt.Fprintln(w, "Decision:\tALLOWED")
		if d.Lease != "" && d.Offered == "" {
			// fencer refuses a write to a fenced object that sends no
			// token, but for an exempt user: it never saw this one.
			fmt.Fprintln(w, "Note:\ta write with no token passed: fencer's webhooks do not see this namespace (the chart's namespaces or webhook.excludeNamespaces), or the user is exempt (--exempt-users, --exempt-groups)")
		}
		return
	}
	fmt.Fprintf(w, "Decision:\tREFUSED (%s)\n", d.Reason)
	fmt.Fprintf(w, "Current token:\t%s\n", orDash(d.Current))
	fmt.Fprintf(w, "Recorded token:\t%s\n", orDash(d.Recorded))
	fmt.Fprintf(w, "Holder:\t%s\n", orDash(d.Holder))
	fmt.Fprintf(w, "Message:\t%s\n", d.Message)
}
