package idgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// The snowflake layout: 42 bits of milliseconds since Epoch, 10 bits of
// worker ID (the slot), 11 bits of sequence; 63 bits, so IDs are positive
// int64s that sort by time. 2^42 ms is 139 years: from Epoch (2026) the
// layout lasts until 2165. (Baidu's uid-generator gave seconds 28 bits and
// ran out in 2024.)
const (
	TimeBits   = 42
	WorkerBits = 10
	SeqBits    = 11
	MaxWorker  = 1<<WorkerBits - 1
	maxSeq     = 1<<SeqBits - 1
)

// Epoch is time zero of the layout.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ErrSlotLost means the generator's slot lease ended (or its token is no
// longer live, or another generator started on the slot reserved after it):
// it issues no more IDs, since another generator may now issue on the slot.
var ErrSlotLost = errors.New("idgen: the worker-ID slot was lost")

// ClockRollbackError means the clock went back further than the generator
// will wait out.
type ClockRollbackError struct{ Back, Max time.Duration }

func (e *ClockRollbackError) Error() string {
	return fmt.Sprintf("idgen: the clock went back %s, more than the %s the generator waits out; refusing to issue IDs that could repeat", e.Back, e.Max)
}

// ErrSlotOfAnotherPod means the slot named by the annotation is leased to
// another pod: the annotation was copied from that pod. Two generators on
// one slot would issue the same IDs, so the generator refuses to start.
var ErrSlotOfAnotherPod = errors.New("idgen: the worker-ID slot is leased to another pod")

// SlotValue is what fencer's controller stores at a slot key: the pod the
// slot is leased to.
type SlotValue struct {
	Pod    string `json:"pod"`
	PodUID string `json:"podUID"`
}

// SnowflakeOptions configure a generator.
type SnowflakeOptions struct {
	// Prefix is fencer's etcd prefix ("/fencer" by default).
	Prefix string
	// Namespace and Name name the Slots-mode IDRange.
	Namespace, Name string
	// Slot and Token come from the pod's annotation
	// idrange.fencer.io/<name>: "slot=<n>,token=<rev>". Slot must fit 10 bits.
	Slot, Token int64
	// PodUID is this pod's UID (the Downward API's metadata.uid). Required:
	// the generator refuses a slot leased to another pod, so a copy of
	// another pod's annotation cannot run a second generator on its slot.
	PodUID types.UID
	// MaxRollback is the largest clock step back the generator waits out
	// (default 10 ms); a larger one is refused with *ClockRollbackError.
	MaxRollback time.Duration
	// Reserve is how far ahead the generator records in etcd the time it may
	// issue IDs up to (default 1 s). A restart resumes after that time, so a
	// clock that went back across a restart cannot repeat IDs; at most one
	// etcd write per Reserve.
	Reserve time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Snowflake issues unique, time-ordered IDs on a leased worker slot.
type Snowflake struct {
	cli      *clientv3.Client
	o        SnowflakeOptions
	slotKey  string
	clockKey string
	lost     atomic.Bool

	mu       sync.Mutex
	lastMs   int64 // the millisecond of the last ID
	seq      int64
	reserved int64 // IDs may be issued up to this millisecond
	// slotValue is the slot key's value naming this pod, which every
	// reservation compares with the token.
	slotValue string
	// clockRev is the clock key's ModRevision as this generator last saw
	// or wrote it. Each reservation compares it: a second generator on the
	// slot (two containers of one pod, a tool run with kubectl exec)
	// reserves in between, and this one then stops, having issued only up
	// to the time the other waited out.
	clockRev int64
	stop     context.CancelFunc
}

// ParseSlot reads the annotation fencer writes on a Slots-mode pod.
func ParseSlot(annotation string) (slot, tokenValue int64, err error) {
	bad := fmt.Errorf("idgen: %q is not a slot annotation (slot=<n>,token=<rev>)", annotation)
	// Exactly the form the controller writes, nothing around it: a lenient
	// parse would accept a damaged annotation as some other slot.
	slotPart, tokenPart, ok := strings.Cut(annotation, ",")
	slotS, ok1 := strings.CutPrefix(slotPart, "slot=")
	tokenS, ok2 := strings.CutPrefix(tokenPart, "token=")
	if !ok || !ok1 || !ok2 {
		return 0, 0, bad
	}
	slot, ok1 = canonicalNumber(slotS)
	tok, ok2 := canonicalNumber(tokenS)
	if !ok1 || !ok2 || tok == 0 {
		return 0, 0, bad
	}
	return slot, tok, nil
}

// NewSnowflake checks that the slot is live under Token, waits out a clock
// that is behind the time reserved by the slot's previous generator (up to
// Reserve+MaxRollback), and watches the slot so that Next stops once the
// watch reports it lost; unheard, a loss stops Next at the latest when the
// reservation runs out, since reserving again is fenced by the token. Close
// stops the watch.
func NewSnowflake(ctx context.Context, cli *clientv3.Client, o SnowflakeOptions) (*Snowflake, error) {
	if o.Slot < 0 || o.Slot > MaxWorker {
		return nil, fmt.Errorf("idgen: slot %d does not fit the %d worker bits: use an IDRange within [0, %d]", o.Slot, WorkerBits, MaxWorker)
	}
	if o.PodUID == "" {
		return nil, errors.New("idgen: SnowflakeOptions.PodUID is required: this pod's UID, from the Downward API's metadata.uid")
	}
	if o.Namespace == "" || o.Name == "" {
		return nil, fmt.Errorf("idgen: SnowflakeOptions.Namespace and Name name the Slots IDRange; got %q and %q", o.Namespace, o.Name)
	}
	if o.Token <= 0 {
		return nil, fmt.Errorf("idgen: SnowflakeOptions.Token is %d: give the token of the pod's annotation (slot=<n>,token=<rev>; ParseSlot reads it)", o.Token)
	}
	if cli == nil {
		return nil, errors.New("idgen: NewSnowflake needs an etcd client (fence.LoadEtcdAccess makes one)")
	}
	o.Prefix = etcdkeys.OrDefault(o.Prefix)
	if err := etcdkeys.CheckPrefix(o.Prefix); err != nil {
		return nil, fmt.Errorf("idgen: SnowflakeOptions.Prefix: %w", err)
	}
	if o.MaxRollback <= 0 {
		o.MaxRollback = 10 * time.Millisecond
	}
	if o.Reserve <= 0 {
		o.Reserve = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	g := &Snowflake{
		cli: cli, o: o,
		slotKey:  etcdkeys.SlotKey(o.Prefix, o.Namespace, o.Name, o.Slot),
		clockKey: etcdkeys.IDRangeSlotsPrefix(o.Prefix, o.Namespace, o.Name) + strconv.FormatInt(o.Slot, 10) + "/clock",
	}
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(g.slotKey), clientv3.OpGet(g.clockKey)).Commit()
	if err != nil {
		return nil, err
	}
	reads, err := etcdreply.Reads(resp, 2, 0)
	if err != nil {
		return nil, fmt.Errorf("idgen: reading slot %d: %w", o.Slot, err)
	}
	slot, clock := reads[0], reads[1]
	if len(slot) == 0 || slot[0].CreateRevision != o.Token {
		return nil, fmt.Errorf("slot %d is not held under token %d: %w", o.Slot, o.Token, ErrSlotLost)
	}
	var holder SlotValue
	if err := json.Unmarshal(slot[0].Value, &holder); err != nil {
		return nil, fmt.Errorf("idgen: etcd key %s holds %q, not a slot fencer leased: %w", g.slotKey, slot[0].Value, err)
	}
	if holder.PodUID != string(o.PodUID) {
		return nil, fmt.Errorf("slot %d of %s/%s is leased to pod %s (uid %s), not to this pod (uid %s); its annotation was copied from that pod: %w",
			o.Slot, o.Namespace, o.Name, holder.Pod, holder.PodUID, o.PodUID, ErrSlotOfAnotherPod)
	}
	// Reservations compare the value too: the slot must still name this pod.
	g.slotValue = string(slot[0].Value)
	if len(clock) > 0 {
		g.clockRev = clock[0].ModRevision
		if g.lastMs, err = strconv.ParseInt(string(clock[0].Value), 10, 64); err != nil {
			return nil, fmt.Errorf("idgen: etcd key %s holds %q, not a millisecond count", g.clockKey, clock[0].Value)
		}
	}
	if back := time.Duration(g.lastMs-g.nowMs()) * time.Millisecond; back > o.Reserve+o.MaxRollback {
		return nil, &ClockRollbackError{Back: back, Max: o.Reserve + o.MaxRollback}
	}
	// A predecessor may have issued IDs up to lastMs: wait until it is past.
	for g.nowMs() <= g.lastMs {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	wctx, stop := context.WithCancel(context.Background())
	g.stop = stop
	go g.watch(wctx, resp.Header.Revision)
	return g, nil
}

// Close stops watching the slot.
func (g *Snowflake) Close() { g.stop() }

func (g *Snowflake) nowMs() int64 { return g.o.Now().Sub(Epoch).Milliseconds() }

// Next returns a unique ID.
func (g *Snowflake) Next(ctx context.Context) (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lost.Load() {
		return 0, ErrSlotLost
	}
	// Before tick and the reservation: a clock far ahead (past the layout's
	// end) would otherwise reserve the slot's clock key that far, and every
	// later holder of the slot would wait, or refuse, until then.
	if err := g.inLayout(g.nowMs()); err != nil {
		return 0, err
	}
	ms, err := g.tick(ctx)
	if err != nil {
		return 0, err
	}
	if err := g.inLayout(ms); err != nil {
		return 0, err
	}
	if ms > g.reserved {
		if err := g.reserve(ctx, ms); err != nil {
			return 0, err
		}
	}
	return ms<<(WorkerBits+SeqBits) | g.o.Slot<<SeqBits | g.seq, nil
}

// inLayout refuses a millisecond the layout's time bits cannot hold: before
// Epoch, or 2^TimeBits ms after it (the clock set wrong, most likely).
func (g *Snowflake) inLayout(ms int64) error {
	if ms < 0 || ms >= 1<<TimeBits {
		return fmt.Errorf("idgen: the clock reads %s, outside the snowflake layout's time (from %s, for 2^%d ms): no ID issued, nothing reserved",
			g.o.Now().UTC().Format(time.RFC3339), Epoch.UTC().Format(time.RFC3339), TimeBits)
	}
	return nil
}

// tick advances to the millisecond and sequence of the next ID: the
// sequence counts up within a millisecond and restarts only in a later one;
// a clock that went back is waited out if the step is small, refused if not.
func (g *Snowflake) tick(ctx context.Context) (int64, error) {
	for {
		now := g.nowMs()
		switch {
		case now > g.lastMs:
			g.lastMs, g.seq = now, 0
			return now, nil
		case now == g.lastMs && g.seq < maxSeq:
			g.seq++
			return now, nil
		case now < g.lastMs:
			if back := time.Duration(g.lastMs-now) * time.Millisecond; back > g.o.MaxRollback {
				return 0, &ClockRollbackError{Back: back, Max: g.o.MaxRollback}
			}
		}
		// Sequence used up, or a small step back: wait for a later millisecond.
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Microsecond):
		}
	}
}

// reserve records in etcd, fenced by the slot's token, that IDs may be
// issued up to ms+Reserve.
func (g *Snowflake) reserve(ctx context.Context, ms int64) error {
	upTo := ms + g.o.Reserve.Milliseconds()
	resp, err := g.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(g.slotKey), "=", g.o.Token), clientv3.Compare(clientv3.Value(g.slotKey), "=", g.slotValue),
			clientv3.Compare(clientv3.ModRevision(g.clockKey), "=", g.clockRev)).
		Then(clientv3.OpPut(g.clockKey, strconv.FormatInt(upTo, 10))).
		Commit()
	if err != nil {
		return err
	}
	rev, err := etcdreply.Revision(resp.Header)
	if err != nil {
		// As after a timeout: the clock key may have been written, so the
		// next reservation, comparing the old revision, fails, and the
		// generator counts its slot as lost (ErrSlotLost) rather than
		// risk an ID issued twice.
		return fmt.Errorf("idgen: reserving IDs of slot %d: %w", g.o.Slot, err)
	}
	if !resp.Succeeded {
		g.lost.Store(true)
		return ErrSlotLost
	}
	g.reserved, g.clockRev = upTo, rev
	return nil
}

// watch marks the generator lost when its slot key is deleted or recreated.
func (g *Snowflake) watch(ctx context.Context, fromRev int64) {
	if err := fence.WatchHeld(ctx, g.cli, g.slotKey, g.o.Token, fromRev); errors.Is(err, fence.ErrLeaseLost) {
		g.lost.Store(true)
	}
}
