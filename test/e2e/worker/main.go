// Command worker is the fault harness's workload: one process per pod,
// built on fencer's SDK. For each Lease it keeps the last token it read from
// its pod's annotations and keeps writing with it, to a fenced ConfigMap
// through the apiserver and to a fenced etcd key, the way a real workload
// that was paused would wake up and write with a stale token. It also
// issues IDs from a Blocks IDRange. Every attempt and every ID run goes to
// its history file for the checker. With --lock-keys it also takes keyed
// locks and writes fenced keys under their tokens. With --db, each fenced
// etcd write is followed by a transaction through the database guard under
// the same token, recorded in an audit table.
//
// It serves /readyz on --ready-addr; the harness probes it like a kubelet,
// so a paused worker goes not Ready and loses its Leases.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/pkg/idgen"
	"github.com/fencer-io/fencer/test/e2e/history"
)

type config struct {
	kubeconfig, namespace, pod, podUID string
	leases                             []string
	etcdCredentials                    string
	prefix                             string
	idRange, slotRange                 string
	idMin, idMax, blockSize            int64
	historyPath, readyAddr             string
	interval                           time.Duration
	hostileEvery                       time.Duration
	lockKeys                           int
	databaseDSN                        string
	unguarded                          bool
}

func main() {
	var c config
	var leases string
	// Its own flag set: controller-runtime registers --kubeconfig globally.
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig authenticating as this pod")
	fs.StringVar(&c.namespace, "namespace", "default", "the pod's namespace")
	fs.StringVar(&c.pod, "pod", "", "the pod this worker is")
	fs.StringVar(&c.podUID, "pod-uid", "", "that pod's UID (the Downward API's metadata.uid)")
	fs.StringVar(&leases, "leases", "", "comma-separated fencer Lease names to write under")
	fs.StringVar(&c.etcdCredentials, "etcd-credentials", "", "directory of the namespace's mounted etcd credentials Secret (fence.LoadEtcdAccess)")
	fs.StringVar(&c.idRange, "idrange", "", "Blocks IDRange to issue IDs from; empty for none")
	fs.StringVar(&c.slotRange, "slots", "", "Slots IDRange whose annotated slot the worker issues snowflake IDs on; empty for none")
	fs.Int64Var(&c.idMin, "id-min", 0, "the IDRange's spec.min")
	fs.Int64Var(&c.idMax, "id-max", 1<<62, "the IDRange's spec.max")
	fs.Int64Var(&c.blockSize, "block-size", 1000, "block size of the ID allocator")
	fs.StringVar(&c.historyPath, "history", "", "history file (JSON lines)")
	fs.StringVar(&c.readyAddr, "ready-addr", "127.0.0.1:0", "address of /readyz")
	fs.DurationVar(&c.interval, "interval", 50*time.Millisecond, "pause between writes")
	fs.IntVar(&c.lockKeys, "lock-keys", 0, "take keyed locks on random sets of 1-3 of this many keys, writing a fenced key under each; 0 takes none")
	fs.StringVar(&c.databaseDSN, "db", "", "PostgreSQL DSN: also commit a transaction through the database guard (pkg/dbfence) after each fenced etcd write, under the same token; empty for none")
	fs.BoolVar(&c.unguarded, "db-unguarded", false, "the checker's mutation: commit without the guard's token compare")
	fs.DurationVar(&c.hostileEvery, "hostile-every", 0, "pause between hostile writes (no token, forged, old, tokenless) to lease alpha's objects; 0 sends none")
	_ = fs.Parse(os.Args[1:])
	c.leases = split(leases)
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func run(c config) error {
	if c.pod == "" || c.podUID == "" || c.historyPath == "" {
		return errors.New("--pod, --pod-uid and --history are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rest, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return err
	}
	rest.Timeout = 5 * time.Second
	// fencer's kinds too: the hostile relabel reads Lease alpha's holder.
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(fencerv1.AddToScheme(scheme))
	kube, err := client.New(rest, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	// As a workload does: its namespace's identity, from the mounted Secret.
	access, err := fence.LoadEtcdAccess(c.etcdCredentials)
	if err != nil {
		return err
	}
	c.prefix = access.Prefix
	cfg := access.Config
	cfg.DialTimeout, cfg.DialKeepAliveTime, cfg.DialKeepAliveTimeout, cfg.Logger = 2*time.Second, time.Second, time.Second, zap.NewNop()
	etcd, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer etcd.Close()
	hist, err := history.Create(c.historyPath)
	if err != nil {
		return err
	}
	defer hist.Close()
	go serveReady(c.readyAddr)

	w := &worker{config: c, kube: kube, etcd: etcd, hist: hist, tokens: map[string][]int64{}}
	if c.databaseDSN != "" {
		if w.database, err = openDatabase(c.databaseDSN, c.pod, c.unguarded); err != nil {
			return err
		}
		defer w.database.db.Close()
	}
	var wg sync.WaitGroup
	for _, lease := range c.leases {
		wg.Go(func() { w.writeLoop(ctx, lease) })
	}
	if c.idRange != "" {
		wg.Go(func() { w.idLoop(ctx) })
	}
	if c.slotRange != "" {
		wg.Go(func() { w.snowflakeLoop(ctx) })
	}
	if c.hostileEvery > 0 {
		wg.Go(func() { w.hostileLoop(ctx, c.hostileEvery) })
	}
	if c.lockKeys > 0 {
		wg.Go(func() { w.lockLoop(ctx, c.lockKeys) })
	}
	wg.Wait()
	return nil
}

func serveReady(addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	if err := http.ListenAndServe(addr, mux); err != nil {
		fmt.Fprintln(os.Stderr, "worker: readiness server:", err)
		os.Exit(1)
	}
}

type worker struct {
	config
	kube client.Client
	etcd *clientv3.Client
	hist *history.Writer
	// database is nil unless --db is set.
	database *database
	mu       sync.Mutex
	seq      int64
	// tokens are the tokens read per lease, for the hostile writes.
	tokens map[string][]int64
	// relabelling is set while this worker's pod is relabelled out of
	// alpha's selector (relabelHolder).
	relabelling atomic.Bool
}

func (w *worker) nextSeq() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	return w.seq
}

func (w *worker) record(a history.Attempt) {
	if a.At.IsZero() {
		a.At = time.Now()
	}
	a.Worker = w.pod
	if err := w.hist.Add(a); err != nil {
		fmt.Fprintln(os.Stderr, "worker: history:", err)
		os.Exit(1)
	}
}

// writeLoop writes under lease with the last token read, refreshing the
// token only every few writes: a worker that was paused writes first with
// what it knew before the pause.
func (w *worker) writeLoop(ctx context.Context, lease string) {
	src := fence.PodSource{Client: w.kube, Namespace: w.namespace, Pod: w.pod, UID: types.UID(w.podUID), Lease: lease}
	var tok fence.Token
	for i := 0; ctx.Err() == nil; i++ {
		if i%5 == 0 {
			read := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			t, err := src.Token(rctx)
			cancel()
			switch {
			case err == nil:
				tok = t
				w.saw(lease, t.Value)
				// What the pod reports it holds, as read at read.
				w.record(history.Attempt{At: read, Kind: history.KindReport, Lease: lease, Token: t.Value})
			case errors.Is(err, fence.ErrNotHolder):
				tok = fence.Token{}
			}
		}
		if tok.Value != 0 {
			w.writeObject(ctx, lease, tok)
			w.writeKey(ctx, lease, tok)
			w.writeRow(ctx, "lease", lease, tok.Value)
		}
		select {
		case <-ctx.Done():
		case <-time.After(w.interval):
		}
	}
}

// writeObject merge-patches (or creates) the fenced ConfigMap cm-<lease>.
func (w *worker) writeObject(ctx context.Context, lease string, tok fence.Token) {
	seq := w.nextSeq()
	name := "cm-" + lease
	tokS, seqS := strconv.FormatInt(tok.Value, 10), strconv.FormatInt(seq, 10)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.namespace,
			Labels:      map[string]string{"fencer.io/lease": lease},
			Annotations: map[string]string{"fencer.io/token": tokS}},
		Data: map[string]string{"writer": w.pod, "seq": seqS, "token": tokS},
	}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"fencer.io/lease":%q},"annotations":{"fencer.io/token":%q}},"data":{"writer":%q,"seq":%q,"token":%q}}`,
		lease, tokS, w.pod, seqS, tokS)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := w.kube.Patch(wctx, cm, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) {
		err = w.kube.Create(wctx, cm)
	}
	if ctx.Err() != nil {
		return // shutting down: the outcome is unknown, the history has the truth
	}
	a := history.Attempt{Kind: history.KindConfigMap, Lease: lease, Target: name, Token: tok.Value, Seq: seq, OK: err == nil}
	if err != nil {
		a.Reason, a.Message = apiReason(err), err.Error()
	}
	w.record(a)
}

// apiReason names why the apiserver refused a write.
func apiReason(err error) string {
	var stale *fence.StaleTokenError
	msg := err.Error()
	switch {
	case errors.As(fence.AsStaleToken(err), &stale):
		return history.ReasonFenced
	case strings.Contains(msg, "failed calling webhook"):
		return history.ReasonWebhookUnavailable
	case strings.Contains(msg, "cannot read the live token"), strings.Contains(msg, "fencer: cannot read lease"):
		return history.ReasonTokenUnavailable
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), strings.Contains(msg, "Client.Timeout"):
		return history.ReasonTimeout
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		return history.ReasonRace
	}
	return "" // unexplained: the checker fails the run
}

// writeKey writes the fenced etcd key <prefix>/data/<ns>/<lease> in a fenced txn.
func (w *worker) writeKey(ctx context.Context, lease string, tok fence.Token) {
	seq := w.nextSeq()
	key := history.DataPrefix + w.namespace + "/" + lease
	err := w.fencedPut(ctx, tok, key, tok.Value, seq)
	if ctx.Err() != nil {
		return
	}
	a := history.Attempt{Kind: history.KindEtcd, Lease: lease, Target: key, Token: tok.Value, Seq: seq, OK: err == nil}
	if err != nil {
		a.Reason, a.Message = refusalReason(err), err.Error()
	}
	w.record(a)
}

// fencedPut writes a worker's value (token, writer, seq) to key under
// the fence, a Lease's token or a keyed lock's.
func (w *worker) fencedPut(ctx context.Context, f fence.EtcdFence, key string, token, seq int64) error {
	val := fmt.Sprintf(`{"token":%d,"writer":%q,"seq":%d}`, token, w.pod, seq)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err := fence.NewTxn(w.etcd, w.prefix, w.namespace, f).Then(clientv3.OpPut(key, val)).Commit(wctx)
	return err
}

// refusalReason names why a keyed lock, or a fenced etcd write under a
// Lease's token or a lock's, did not go through.
func refusalReason(err error) string {
	var fenced *fence.FencedError
	switch {
	case errors.As(err, &fenced), errors.Is(err, fence.ErrLockLost):
		return history.ReasonFenced
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, fence.ErrLockBusy):
		return history.ReasonTimeout
	}
	return history.ReasonEtcdUnavailable
}

// idLoop issues IDs and records them as runs of consecutive IDs.
func (w *worker) idLoop(ctx context.Context) {
	blocks, err := idgen.NewBlocks(w.etcd, idgen.BlockOptions{Prefix: w.prefix, Namespace: w.namespace, Name: w.idRange,
		Min: w.idMin, Max: w.idMax, BlockSize: w.blockSize})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: ids:", err)
		os.Exit(1)
	}
	defer blocks.Close()
	var lo, hi int64 = -1, -1
	flush := func() {
		if lo >= 0 {
			w.record(history.Attempt{Kind: history.KindIDs, Lo: lo, Hi: hi})
		}
		lo, hi = -1, -1
	}
	defer flush()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for range 50 {
			nctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			id, err := blocks.Next(nctx)
			cancel()
			if err != nil {
				break // etcd is away; try again next tick
			}
			if id != hi+1 || lo < 0 {
				flush()
				lo = id
			}
			hi = id
		}
		if n%100 == 0 {
			flush()
		}
	}
}
