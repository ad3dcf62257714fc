package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// ErrNotLeader means this controller does not hold the etcd election (yet, or
// any more), so it may not grant, release or allocate.
var ErrNotLeader = errors.New("this controller does not lead the etcd election")

// Term is one won election: the leader key and the revision that created it.
// Every controller write compares CreateRevision(Key) == Rev, so a deposed
// replica that still believes it leads can write nothing.
type Term struct {
	Key string
	Rev int64
}

// cmp is the self-fencing comparison every controller transaction carries.
func (t Term) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.Key), "=", t.Rev)
}

// orElse is the Else branch of every fenced transaction: it reads the
// leader key, so a failed transaction tells a lost term from a failed
// comparison (heldIn).
func (t Term) orElse() []clientv3.Op { return []clientv3.Op{clientv3.OpGet(t.Key)} }

// heldIn says why a transaction whose Else branch is orElse failed: nil
// when the answer shows this term still in force (a comparison of the
// caller's failed), ErrNotLeader when it shows the term gone. An answer
// without that read (which etcd never sends) shows neither: the error
// wraps etcdreply.ErrMalformed, and is handled as etcd being away.
func (t Term) heldIn(resp *clientv3.TxnResponse) error {
	reads, err := etcdreply.Reads(resp, len(t.orElse()), 0)
	if err != nil {
		return err
	}
	if kvs := reads[0]; len(kvs) != 1 || kvs[0].CreateRevision != t.Rev {
		return ErrNotLeader
	}
	return nil
}

// commit runs the one shape of every controller write:
// Txn(If term && cmps...) Then(ops) Else(orElse). ok is false when a
// comparison failed while this term still holds; the error is ErrNotLeader
// when the term itself is gone.
func (t Term) commit(ctx context.Context, cli *clientv3.Client, cmps []clientv3.Cmp, ops ...clientv3.Op) (resp *clientv3.TxnResponse, ok bool, err error) {
	resp, err = cli.Txn(ctx).If(append([]clientv3.Cmp{t.cmp()}, cmps...)...).Then(ops...).Else(t.orElse()...).Commit()
	if err != nil {
		return nil, false, err
	}
	// Callers take a grant's token from the header: an answer without one
	// fails like a write whose outcome is unknown.
	if _, err := etcdreply.Revision(resp.Header); err != nil {
		return nil, false, err
	}
	if resp.Succeeded {
		return resp, true, nil
	}
	if err := t.heldIn(resp); err != nil {
		return nil, false, err
	}
	return resp, false, nil
}

// Elector campaigns for <prefix>/controller/leader with a short session TTL,
// and campaigns again whenever its session is lost. It is a controller-runtime
// Runnable that runs only on the replica that won Kubernetes leader election,
// so campaigns rarely contend; the etcd election is what fences.
type Elector struct {
	// Log receives the election's progress; NewElector discards it.
	Log        logr.Logger
	cli        *clientv3.Client
	prefix     string
	identity   string
	sessionTTL int

	mu      sync.Mutex
	term    *Term
	changed chan struct{} // closed and replaced whenever term changes
}

// NewElector returns an Elector; identity names this replica in the leader key.
func NewElector(cli *clientv3.Client, prefix, identity string, sessionTTL time.Duration) *Elector {
	ttl := int(sessionTTL.Seconds())
	if ttl < 1 {
		ttl = 1
	}
	return &Elector{Log: logr.Discard(), cli: cli, prefix: prefix, identity: identity, sessionTTL: ttl, changed: make(chan struct{})}
}

// Term returns the current term, or ErrNotLeader.
func (e *Elector) Term() (Term, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term == nil {
		return Term{}, ErrNotLeader
	}
	return *e.term, nil
}

// Changed returns a channel closed at the next change of term.
func (e *Elector) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

func (e *Elector) setTerm(t *Term) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.term = t
	close(e.changed)
	e.changed = make(chan struct{})
}

// NeedLeaderElection: only the Kubernetes leader campaigns.
func (e *Elector) NeedLeaderElection() bool { return true }

// Start campaigns until ctx ends, resigning on the way out so a successor
// does not wait for the session to expire.
func (e *Elector) Start(ctx context.Context) error {
	log := e.Log.WithValues("key", etcdkeys.LeaderKey(e.prefix), "identity", e.identity)
	for ctx.Err() == nil {
		if err := e.campaign(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "etcd election lost or failed; campaigning again")
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// campaignOnce is election.Campaign with a panic turned into an error.
// etcd's concurrency package reads the campaign's answers without checking
// their shape, so a broken answer (a faulty proxy) panics inside it; that
// must cost one campaign, whose session campaign then revokes, not the
// manager.
func campaignOnce(ctx context.Context, election *concurrency.Election, identity string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("etcd's election library panicked (%v), most likely on a malformed answer: %w", p, etcdreply.ErrMalformed)
		}
	}()
	return election.Campaign(ctx, identity)
}

func (e *Elector) campaign(ctx context.Context) error {
	session, err := concurrency.NewSession(e.cli, concurrency.WithTTL(e.sessionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("etcd session: %w", err)
	}
	defer func() {
		// Revoke with a fresh context: ctx may be cancelled (shutdown), and
		// resigning at once spares the successor a session TTL of waiting.
		session.Orphan()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = e.cli.Revoke(rctx, session.Lease())
	}()
	election := concurrency.NewElection(session, etcdkeys.LeaderKey(e.prefix))
	if err := campaignOnce(ctx, election, e.identity); err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	e.setTerm(&Term{Key: election.Key(), Rev: election.Rev()})
	e.Log.Info("won the etcd election", "key", election.Key(), "rev", election.Rev())
	defer e.setTerm(nil)
	select {
	case <-ctx.Done():
		return nil
	case <-session.Done():
		return errors.New("etcd session expired")
	}
}
