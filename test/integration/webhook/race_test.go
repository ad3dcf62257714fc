package webhook

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/framework"
)

// TestRaceAcrossFailover: writers hammer one fenced ConfigMap with the old
// and the new token while the lease fails over. The object's complete
// history, replayed from a watch in resourceVersion order, must never show
// an accepted write with a lower token after a higher one.
func TestRaceAcrossFailover(t *testing.T) {
	ns, holder, oldTok := setup(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := fx.Client.Create(ctx, configMap(ns, "report", itoa(oldTok))); err != nil {
		t.Fatal(err)
	}
	history := followWrittenTokens(t, ctx, ns)
	var newTok atomic.Int64 // 0 until the failover is seen
	var accepted, refusedN atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				tok := oldTok
				if nt := newTok.Load(); nt != 0 && rng.IntN(2) == 0 {
					tok = nt
				}
				err := write(fx.Client, ns, tok, strconv.Itoa(i)+"-"+strconv.Itoa(n))
				switch {
				case err == nil:
					accepted.Add(1)
				case apierrors.IsConflict(err):
					refusedN.Add(1) // fencer's 409, or the apiserver's optimistic-lock conflict
				default:
					t.Errorf("writer %d: %v", i, err)
					return
				}
			}
		}()
	}

	framework.Eventually(t, 30*time.Second, "writers running", func() error {
		if accepted.Load() < 20 {
			return fmt.Errorf("%d writes accepted", accepted.Load())
		}
		return nil
	})
	_, nt := failOver(t, ns, holder)
	newTok.Store(nt)
	before := refusedN.Load()
	framework.Eventually(t, 30*time.Second, "both tokens in play after the failover", func() error {
		if !history.contains(nt) || refusedN.Load() < before+20 {
			return fmt.Errorf("new token written %v, refusals since %d", history.contains(nt), refusedN.Load()-before)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	versions := history.complete(t, ctx, ns)
	t.Logf("%d writes accepted, %d refused; history of %d versions; tokens %d -> %d", accepted.Load(), refusedN.Load(), len(versions), oldTok, nt)
	neverBack(t, versions)
	if !slices.Contains(versions, nt) || accepted.Load() == 0 || refusedN.Load() == 0 {
		t.Fatalf("the race did not exercise both tokens: accepted %d, refused %d, new token written %v", accepted.Load(), refusedN.Load(), slices.Contains(versions, nt))
	}
}

// writtenTokens follows the fenced ConfigMap "out" with a watch, and
// keeps the token each version of it recorded, in resourceVersion order.
type writtenTokens struct {
	w      watch.Interface
	done   chan struct{}
	mu     sync.Mutex
	tokens []int64
	lastRV string
}

func followWrittenTokens(t *testing.T, ctx context.Context, ns string) *writtenTokens {
	t.Helper()
	cs, err := kubernetes.NewForConfig(fx.Config)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=out"})
	if err != nil {
		t.Fatal(err)
	}
	h := &writtenTokens{w: w, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for ev := range w.ResultChan() {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				n, _ := strconv.ParseInt(cm.Annotations[fencerv1.WrittenTokenAnnotation], 10, 64)
				h.mu.Lock()
				h.tokens, h.lastRV = append(h.tokens, n), cm.ResourceVersion
				h.mu.Unlock()
			}
		}
	}()
	t.Cleanup(w.Stop)
	return h
}

func (h *writtenTokens) contains(tok int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.tokens, tok)
}

// complete waits until the watch has delivered the object's current
// version, stops it, and returns the whole history.
func (h *writtenTokens) complete(t *testing.T, ctx context.Context, ns string) []int64 {
	t.Helper()
	final := &corev1.ConfigMap{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "out"}, final); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "the watch caught up", func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.lastRV != final.ResourceVersion {
			return fmt.Errorf("watch at %s, object at %s", h.lastRV, final.ResourceVersion)
		}
		return nil
	})
	h.w.Stop()
	<-h.done
	return h.tokens
}

// neverBack fails t if a version was written under a lower token than
// the version before it.
func neverBack(t *testing.T, tokens []int64) {
	t.Helper()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] < tokens[i-1] {
			t.Fatalf("version %d was written with token %d after version %d with token %d", i, tokens[i], i-1, tokens[i-1])
		}
	}
}

// TestRaceTheRecordAloneDecides: the race of TestRaceAcrossFailover where
// only the per-object record can refuse the older token. The Lease is
// Monotonic and held by nobody, so both tokens pass the Lease's own rules,
// and the writers send merge patches with no resourceVersion, so the
// apiserver's optimistic lock refuses none of them: it retries its own
// conflicts, running admission again against the object it now read.
// The object's history must still never go back.
func TestRaceTheRecordAloneDecides(t *testing.T) {
	ns, holder, tok1 := setup(t, func(l *fencerv1.Lease) { l.Spec.Policy = fencerv1.PolicyMonotonic })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := fx.Client.Create(ctx, configMap(ns, "report", itoa(tok1))); err != nil {
		t.Fatal(err)
	}
	_, tok2 := failOver(t, ns, holder)
	suspend(t, ns) // nobody holds it: tok1 and tok2 both pass the Lease's rules
	history := followWrittenTokens(t, ctx, ns)
	var accepted, refused [2]atomic.Int64 // by token: tok1, tok2
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			which, tok := i%2, tok1
			if which == 1 {
				tok = tok2
			}
			for n := range 15 {
				body := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}},"data":{"v":"%d-%d"}}`, fencerv1.TokenAnnotation, tok, i, n)
				err := fx.Client.Patch(ctx, configMap(ns, "", ""), client.RawPatch(types.MergePatchType, []byte(body)))
				switch {
				case err == nil:
					accepted[which].Add(1)
				case apierrors.IsConflict(err): // fencer's refusal: the apiserver retries its own
					refused[which].Add(1)
				default:
					t.Errorf("writer %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	versions := history.complete(t, ctx, ns)
	t.Logf("tokens %d -> %d: accepted %d / %d, refused %d / %d; history of %d versions",
		tok1, tok2, accepted[0].Load(), accepted[1].Load(), refused[0].Load(), refused[1].Load(), len(versions))
	neverBack(t, versions)
	if accepted[1].Load() == 0 || refused[0].Load() == 0 {
		t.Fatalf("the race did not exercise the record: %d writes under the newer token accepted, %d under the older refused", accepted[1].Load(), refused[0].Load())
	}
	if refused[1].Load() != 0 {
		t.Fatalf("%d writes under the newer token refused: nothing is newer", refused[1].Load())
	}
}
