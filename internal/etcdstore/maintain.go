package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/internal/metrics"
)

// Maintainer keeps etcd from filling up, as etcd-druid does for Gardener:
// it compacts old revisions, defragments one member at a time, watches the
// alarms, and recovers from a NOSPACE alarm by itself. Only the leading
// manager runs it.
//
// Compaction never changes a token: a live key keeps its CreateRevision, and
// only superseded revisions are dropped. fencer's watches re-read when
// they are compacted past (WatchHeld, the reconcilers' lease watch).
type Maintainer struct {
	Cli *clientv3.Client
	// Every is how often maintenance runs; compaction keeps the revisions of
	// the last interval, as kube-apiserver's compactor does.
	Every time.Duration
	// DefragFree is the free space (backend size minus size in use) above
	// which a member is defragmented, if it is also half its backend.
	DefragFree int64
	Log        logr.Logger

	lastRev int64
	// defragmenting is set while a member defragments: it blocks all its
	// requests meanwhile, which the Watchdog must not take for an outage.
	defragmenting atomic.Bool
}

// Defragmenting reports whether a member is being defragmented now.
func (m *Maintainer) Defragmenting() bool { return m.defragmenting.Load() }

// NeedLeaderElection: one manager maintains etcd.
func (m *Maintainer) NeedLeaderElection() bool { return true }

// Start runs maintenance every m.Every until ctx ends.
func (m *Maintainer) Start(ctx context.Context) error {
	t := time.NewTicker(m.Every)
	defer t.Stop()
	for {
		m.Run(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Run does one round: alarms first (a NOSPACE alarm is recovered from at
// once), then compaction, then defragmentation.
func (m *Maintainer) Run(ctx context.Context) {
	nospace, err := m.alarms(ctx)
	if err != nil {
		m.Log.Error(err, "etcd alarms")
		return
	}
	if nospace {
		m.recover(ctx)
		return
	}
	if err := m.compact(ctx); err != nil {
		m.Log.Error(err, "etcd compaction")
	}
	if err := m.Defragment(ctx, false); err != nil {
		m.Log.Error(err, "etcd defragmentation")
	}
}

// alarms publishes the active alarms and reports a NOSPACE one.
func (m *Maintainer) alarms(ctx context.Context) (nospace bool, err error) {
	resp, err := m.Cli.AlarmList(ctx)
	if err != nil {
		return false, err
	}
	active := map[etcdserverpb.AlarmType]bool{}
	for _, a := range resp.Alarms {
		active[a.Alarm] = true
	}
	for _, a := range []etcdserverpb.AlarmType{etcdserverpb.AlarmType_NOSPACE, etcdserverpb.AlarmType_CORRUPT} {
		v := 0.0
		if active[a] {
			v = 1
			m.Log.Info("etcd alarm raised", "alarm", a.String())
		}
		metrics.EtcdAlarm.WithLabelValues(a.String()).Set(v)
	}
	return active[etcdserverpb.AlarmType_NOSPACE], nil
}

// compact drops the revisions older than the one seen a round ago.
func (m *Maintainer) compact(ctx context.Context) error {
	rev, err := m.revision(ctx)
	if err != nil {
		return err
	}
	target := m.lastRev
	m.lastRev = rev
	if target == 0 {
		return nil
	}
	return m.compactTo(ctx, target)
}

// revision is etcd's current revision (a count-only read of any key).
func (m *Maintainer) revision(ctx context.Context) (int64, error) {
	resp, err := m.Cli.Get(ctx, "compaction-probe", clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return etcdreply.Revision(resp.Header)
}

func (m *Maintainer) compactTo(ctx context.Context, rev int64) error {
	_, err := m.Cli.Compact(ctx, rev)
	if errors.Is(err, rpctypes.ErrCompacted) {
		return nil // someone (etcd's own --auto-compaction) was there first
	}
	count("compact", err)
	if err == nil {
		m.Log.V(1).Info("compacted etcd", "revision", rev)
	}
	return err
}

// Defragment defragments each member, one at a time, whose free space is
// above DefragFree and half its backend, or every member with all. A member
// blocks while it defragments, so never two at once.
func (m *Maintainer) Defragment(ctx context.Context, all bool) error {
	members, err := m.Cli.MemberList(ctx)
	if err != nil {
		return err
	}
	for _, mem := range members.Members {
		if len(mem.ClientURLs) == 0 {
			continue // a learner not yet started
		}
		ep := mem.ClientURLs[0]
		st, err := m.Cli.Status(ctx, ep)
		if err != nil {
			return fmt.Errorf("status of %s: %w", ep, err)
		}
		metrics.EtcdDBSize.WithLabelValues(ep).Set(float64(st.DbSize))
		metrics.EtcdDBSizeInUse.WithLabelValues(ep).Set(float64(st.DbSizeInUse))
		free := st.DbSize - st.DbSizeInUse
		if !all && (free < m.DefragFree || free < st.DbSize/2) {
			continue
		}
		m.defragmenting.Store(true)
		_, err = m.Cli.Defragment(ctx, ep)
		m.defragmenting.Store(false)
		count("defragment", err)
		if err != nil {
			return fmt.Errorf("defragmenting %s: %w", ep, err)
		}
		m.Log.Info("defragmented etcd member", "member", ep, "freedBytes", free)
	}
	return nil
}

// recover frees space after a NOSPACE alarm and clears it: compact to now,
// defragment every member, disarm. If the data itself exceeds the quota,
// etcd raises the alarm again at the next write and an operator must raise
// the quota (docs/operations.md).
func (m *Maintainer) recover(ctx context.Context) {
	m.Log.Info("etcd is out of space (NOSPACE alarm): compacting, defragmenting and disarming")
	rev, err := m.revision(ctx)
	if err == nil {
		err = m.compactTo(ctx, rev)
	}
	if err == nil {
		err = m.Defragment(ctx, true)
	}
	if err == nil {
		err = m.disarmNoSpace(ctx)
		count("disarm", err)
	}
	if err != nil {
		m.Log.Error(err, "recovering from the NOSPACE alarm")
		return
	}
	metrics.EtcdAlarm.WithLabelValues(etcdserverpb.AlarmType_NOSPACE.String()).Set(0)
	m.Log.Info("NOSPACE alarm cleared")
}

// disarmNoSpace clears each member's NOSPACE alarm, and only those: a
// CORRUPT alarm needs an operator.
func (m *Maintainer) disarmNoSpace(ctx context.Context) error {
	resp, err := m.Cli.AlarmList(ctx)
	if err != nil {
		return err
	}
	for _, a := range resp.Alarms {
		if a.Alarm != etcdserverpb.AlarmType_NOSPACE {
			continue
		}
		if _, err := m.Cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm}); err != nil {
			return err
		}
	}
	return nil
}

func count(op string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	metrics.EtcdMaintenance.WithLabelValues(op, result).Inc()
}

// IsNoSpace reports whether err is etcd refusing a write for its NOSPACE alarm.
func IsNoSpace(err error) bool { return errors.Is(err, rpctypes.ErrNoSpace) }
