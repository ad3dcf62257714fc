package story

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Role is one role of a story binary: the driver (demo) or an actor.
type Role struct {
	// Args describes the arguments, for the usage line; NArgs is how many
	// there must be at least.
	Args  string
	NArgs int
	Run   func(ctx context.Context, args []string) error
}

// Main runs the role os.Args[1] names with the arguments after it, and
// exits 1 with its error; an unknown role or missing arguments print the
// usage and exit 2.
func Main(story string, roles map[string]Role) {
	if len(os.Args) >= 2 {
		if r, ok := roles[os.Args[1]]; ok && len(os.Args)-2 >= r.NArgs {
			if err := r.Run(context.Background(), os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", story, err)
				os.Exit(1)
			}
			return
		}
	}
	var usage []string
	for name, r := range roles {
		usage = append(usage, strings.TrimSpace(name+" "+r.Args))
	}
	sort.Strings(usage)
	fmt.Fprintf(os.Stderr, "usage: %s %s\n", story, strings.Join(usage, " | "))
	os.Exit(2)
}

// Setup is the start of every demo: it applies the story's manifests
// ($STORY_DIR/manifests.yaml, which make demo sets, or
// examples/<story>/manifests.yaml below the working directory) and waits
// for the story's pods.
func Setup(ctx context.Context, story string, pods ...string) (client.Client, error) {
	k, err := Kube()
	if err != nil {
		return nil, err
	}
	manifests := "examples/" + story + "/manifests.yaml"
	if dir := os.Getenv("STORY_DIR"); dir != "" {
		manifests = dir + "/manifests.yaml"
	}
	if err := apply(ctx, k, manifests); err != nil {
		return nil, err
	}
	return k, waitReady(ctx, k, pods...)
}
