// Package fencedwrites is what a workload member writes in the real node's
// partition test, once for each of the three places a workload keeps state:
// a fenced Kubernetes object (through fencer's webhook), a fenced etcd key
// (a transaction that compares the token), and a database row (through the
// guard, in the same transaction). The member's container and the test,
// writing as the replacement, use the same code, and each write comes back
// as an Attempt that says whether fencer refused it, and why.
package fencedwrites

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// Table holds the members' rows, one per Lease.
const Table = "member_output"

// Name is the ConfigMap, and the etcd key below the namespace's data
// prefix, that lease's members write: one per Lease, since a fenced
// object stays bound to the Lease that first fenced it.
func Name(lease string) string { return "member-output-" + lease }

// The targets, as Attempt.Target names them.
const (
	Object = "object"
	Etcd   = "etcd"
	Row    = "row"
)

// Schema creates the member's table and the guard's schema objects.
func Schema() (string, error) {
	m, err := dbfence.Table{}.Migration()
	if err != nil {
		return "", err
	}
	return m + "\nCREATE TABLE IF NOT EXISTS " + Table + " (lease text PRIMARY KEY, writer text NOT NULL, token bigint NOT NULL);", nil
}

// Targets are the connections a member writes through.
type Targets struct {
	Kube      client.Client
	Etcd      *clientv3.Client
	Prefix    string
	Namespace string
	// Install names the etcd install the tokens come from (dbfence.InstallOf).
	Install string
	DB      *sql.DB
}

// Attempt is one write and how it ended.
type Attempt struct {
	Target string    `json:"target"`
	Writer string    `json:"writer"`
	Token  int64     `json:"token"`
	Start  time.Time `json:"start"`
	OK     bool      `json:"ok,omitempty"`
	// Refused is fencer's reason, when fencer refused the write: the
	// webhook's denial reason, "etcd-fenced", or "db-stale".
	Refused string `json:"refused,omitempty"`
	// Err is any other failure: one that fencer did not answer.
	Err string `json:"err,omitempty"`
}

// WriteAll writes each target once under tok, as writer.
func (t Targets) WriteAll(ctx context.Context, tok fence.Token, writer string) []Attempt {
	return []Attempt{
		t.attempt(ctx, Object, tok, writer, t.object),
		t.attempt(ctx, Etcd, tok, writer, t.key),
		t.attempt(ctx, Row, tok, writer, t.row),
	}
}

func (t Targets) attempt(ctx context.Context, target string, tok fence.Token, writer string, write func(context.Context, fence.Token, string) error) Attempt {
	a := Attempt{Target: target, Writer: writer, Token: tok.Value, Start: time.Now()}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err := write(ctx, tok, writer)
	var stale *fence.StaleTokenError
	var fenced *fence.FencedError
	var dbStale *dbfence.StaleError
	switch {
	case err == nil:
		a.OK = true
	case errors.As(err, &stale):
		a.Refused = string(stale.Reason)
	case errors.As(err, &fenced):
		a.Refused = "etcd-fenced"
	case errors.As(err, &dbStale):
		a.Refused = "db-stale"
	default:
		a.Err = err.Error()
	}
	return a
}

// object writes the fenced ConfigMap with a merge patch, so that no
// optimistic-lock conflict can answer in fencer's place.
func (t Targets) object(ctx context.Context, tok fence.Token, writer string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: t.Namespace, Name: Name(tok.Lease)}}
	body := fmt.Sprintf(`{"data":{"writer":%q,"token":%q}}`, writer, strconv.FormatInt(tok.Value, 10))
	err := fence.NewClient(t.Kube, tok).Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(body)))
	if !apierrors.IsNotFound(err) {
		return err
	}
	cm.Data = map[string]string{"writer": writer, "token": strconv.FormatInt(tok.Value, 10)}
	return fence.NewClient(t.Kube, tok).Create(ctx, cm)
}

// key puts writer and the token at the member's data key, in a
// transaction that holds only while tok is the Lease's live grant.
func (t Targets) key(ctx context.Context, tok fence.Token, writer string) error {
	key := etcdkeys.DataPrefix(t.Prefix, t.Namespace) + Name(tok.Lease)
	_, err := fence.NewTxn(t.Etcd, t.Prefix, t.Namespace, tok).
		Then(clientv3.OpPut(key, fmt.Sprintf("%s %d", writer, tok.Value))).
		Commit(ctx)
	return err
}

// row upserts the member's row in a transaction the guard opens: its
// statement carries the guard, so a stale token commits nothing.
func (t Targets) row(ctx context.Context, tok fence.Token, writer string) error {
	tx, err := t.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	res := dbfence.Lease(t.Install, t.Namespace, tok.Lease)
	_, err = dbfence.Table{}.Exec(ctx, tx, res, tok.Value,
		"INSERT INTO "+Table+" (lease, writer, token) VALUES ($1, $2, $3) ON CONFLICT (lease) DO UPDATE SET writer = EXCLUDED.writer, token = EXCLUDED.token",
		tok.Lease, writer, tok.Value)
	if err != nil {
		return err
	}
	return tx.Commit()
}
