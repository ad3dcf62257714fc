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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	cs, err := kubernetes.NewForConfig(fx.Config)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=out"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		history []int64
		lastRV  string
	)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				n, _ := strconv.ParseInt(cm.Annotations["fencer.io/written-token"], 10, 64)
				mu.Lock()
				history, lastRV = append(history, n), cm.ResourceVersion
				mu.Unlock()
			}
		}
	}()
	written := func(tok int64) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(history, tok)
	}

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
	pod := &corev1.Pod{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: holder}, pod); err != nil {
		t.Fatal(err)
	}
	fx.SetReady(t, pod, false)
	_, nt := held(t, ns, holder)
	newTok.Store(nt)
	before := refusedN.Load()
	framework.Eventually(t, 30*time.Second, "both tokens in play after the failover", func() error {
		if !written(nt) || refusedN.Load() < before+20 {
			return fmt.Errorf("new token written %v, refusals since %d", written(nt), refusedN.Load()-before)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	// The history is complete once the watch has delivered the object's
	// final version.
	final := &corev1.ConfigMap{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "out"}, final); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "the watch caught up", func() error {
		mu.Lock()
		defer mu.Unlock()
		if lastRV != final.ResourceVersion {
			return fmt.Errorf("watch at %s, object at %s", lastRV, final.ResourceVersion)
		}
		return nil
	})
	w.Stop()
	<-watched

	t.Logf("%d writes accepted, %d refused; history of %d versions; tokens %d -> %d", accepted.Load(), refusedN.Load(), len(history), oldTok, nt)
	sawNew := false
	for i := 1; i < len(history); i++ {
		if history[i] < history[i-1] {
			t.Fatalf("version %d was written with token %d after version %d with token %d", i, history[i], i-1, history[i-1])
		}
		sawNew = sawNew || history[i] == nt
	}
	if !sawNew || accepted.Load() == 0 || refusedN.Load() == 0 {
		t.Fatalf("the race did not exercise both tokens: accepted %d, refused %d, new token written %v", accepted.Load(), refusedN.Load(), sawNew)
	}
}
