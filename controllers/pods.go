package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The pods both controllers serve: finding them, and writing the
// annotations through which they learn their tokens, blocks and slots.

// podsMatching lists the pods of namespace that ls (parsed: sel) matches.
// With a matchLabels pair it reads only the pods carrying that label (the
// smallest key, for a stable choice); the whole selector then filters them.
func podsMatching(ctx context.Context, c client.Reader, namespace string, ls *metav1.LabelSelector, sel labels.Selector) ([]corev1.Pod, error) {
	opts := []client.ListOption{client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: sel}}
	if keys := slices.Sorted(maps.Keys(ls.MatchLabels)); len(keys) > 0 {
		opts = append(opts, client.MatchingFields{indexPodLabel: keys[0] + "=" + ls.MatchLabels[keys[0]]})
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, opts...); err != nil {
		return nil, err
	}
	return pods.Items, nil
}

func podByUID(pods []corev1.Pod, uid string) *corev1.Pod {
	for i := range pods {
		if string(pods[i].UID) == uid {
			return &pods[i]
		}
	}
	return nil
}

// annotatePod sets the keys in want and removes the other keys named, with
// one merge patch, only when something differs.
func annotatePod(ctx context.Context, c client.Client, pod *corev1.Pod, want map[string]string, keys ...string) error {
	changed := false
	for _, k := range keys {
		v, ok := want[k]
		cur, has := pod.Annotations[k]
		if (ok && (!has || cur != v)) || (!ok && has) {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	patch := client.MergeFrom(pod.DeepCopy())
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for _, k := range keys {
		if v, ok := want[k]; ok {
			pod.Annotations[k] = v
		} else {
			delete(pod.Annotations, k)
		}
	}
	return client.IgnoreNotFound(c.Patch(ctx, pod, patch))
}

// annotateEach gives each pod the annotations want(pod) among keys
// (annotatePod), trying every pod: one that cannot be patched keeps no
// other from its annotation.
func annotateEach(ctx context.Context, c client.Client, pods []*corev1.Pod, want func(*corev1.Pod) map[string]string, keys ...string) error {
	var errs []error
	for _, pod := range pods {
		if err := annotatePod(ctx, c, pod, want(pod), keys...); err != nil {
			errs = append(errs, fmt.Errorf("annotating pod %s: %w", pod.Name, err))
		}
	}
	return errors.Join(errs...)
}
