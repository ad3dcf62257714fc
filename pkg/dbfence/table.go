package dbfence

import (
	"fmt"
	"regexp"
)

// DefaultSchema and DefaultTable name the fence table unless Table says
// otherwise.
const (
	DefaultSchema = "fencer"
	DefaultTable  = "fences"
)

// Table names where the fence keeps its rows: one row per resource with
// the highest token (and sequence) accepted, and a commit counter. The
// zero Table is fencer.fences.
type Table struct {
	Schema, Name string
}

// identifier is what Table accepts as a schema or table name: a plain
// lower-case PostgreSQL identifier, so it needs no quoting.
var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// tableIdentifier leaves room for the _ops and _refuse suffixes within
// PostgreSQL's 63 bytes.
var tableIdentifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,55}$`)

// qualifiedName is a table name, with or without its schema.
var qualifiedName = regexp.MustCompile(`^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$`)

func (t Table) names() (schema, table string, err error) {
	schema, table = t.Schema, t.Name
	if schema == "" {
		schema = DefaultSchema
	}
	if table == "" {
		table = DefaultTable
	}
	if !identifier.MatchString(schema) {
		return "", "", fmt.Errorf("dbfence: schema %q is not a plain lower-case identifier (letters, digits, _; at most 63)", schema)
	}
	if !tableIdentifier.MatchString(table) {
		return "", "", fmt.Errorf("dbfence: table %q is not a plain lower-case identifier (letters, digits, _; at most 56, leaving room for its _ops table)", table)
	}
	return schema, table, nil
}

// qualified is schema.table, checked.
func (t Table) qualified() (string, error) {
	schema, table, err := t.names()
	return schema + "." + table, err
}

// The refuse function is VOLATILE (the default, spelled out): the guard's
// CASE must call it only when the compare fails, never fold it into a
// constant.

// Migration is the SQL that creates the fence's schema objects, for the
// user to apply once (a migration tool, or psql): the fence table, and
// the function that aborts a transaction whose token is stale, so that
// nothing of it can commit even if the caller ignores the error; and the
// idempotency records of Once (<table>_ops). Every
// statement is CREATE … IF NOT EXISTS or CREATE OR REPLACE, so applying it
// again changes nothing.
//
// Rows are permanent: deleting one would let the tokens it refuses
// through again.
func (t Table) Migration() (string, error) {
	schema, table, err := t.names()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[1]s.%[2]s (
	resource text PRIMARY KEY,
	token bigint NOT NULL,
	seq bigint NOT NULL DEFAULT 0,
	commits bigint NOT NULL DEFAULT 0,
	updated timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS %[1]s.%[2]s_ops (
	resource text NOT NULL,
	op_id text NOT NULL,
	token bigint NOT NULL,
	result bytea,
	created timestamptz NOT NULL DEFAULT clock_timestamp(),
	PRIMARY KEY (resource, op_id)
);
CREATE OR REPLACE FUNCTION %[1]s.%[2]s_refuse(res text, offered bigint, offered_seq bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	floor_token bigint;
	floor_seq bigint;
BEGIN
	SELECT token, seq INTO floor_token, floor_seq FROM %[1]s.%[2]s WHERE resource = res;
	RAISE EXCEPTION USING
		ERRCODE = '%[3]s',
		MESSAGE = format('fencer: token %%s (seq %%s) is below token %%s (seq %%s), the highest accepted for %%s', offered, offered_seq, floor_token, floor_seq, res);
END
$$;
CREATE OR REPLACE FUNCTION %[1]s.%[2]s_abort(reason text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION USING ERRCODE = '%[4]s', MESSAGE = 'fencer: ' || reason;
END
$$;
`, schema, table, SQLStateStale, SQLStateAborted), nil
}

// SQLStateStale is the SQLSTATE of the exception that refuses a stale
// token; it aborts the transaction.
const SQLStateStale = "FN001"

// SQLStateAborted is the SQLSTATE of the exception with which Once and
// Row.Update abort a transaction they refused, so that a caller who
// commits anyway commits nothing.
const SQLStateAborted = "FN002"
