// Package dbfence is fencer's fence at the database: inside the caller's
// own PostgreSQL transaction (database/sql, any driver), it refuses the
// transaction when its fencing token is lower than the highest one the
// database already accepted for the same resource. The compare and the
// record are one atomic step with the caller's writes: a late writer waits
// for the resource's row lock, then sees the newer token.
//
// It keeps no session state and takes no advisory lock, so it works through
// database/sql pooling and through PgBouncer in transaction mode. Its table
// lives in the same database as the data; Table.Migration is the schema,
// which the user applies (it is never created at first use).
//
// A resource is named by the lock whose tokens it takes (a fencer Lease or
// a keyed lock) and by the install that issued them: tokens of two locks,
// or of two installs, are never compared.
package dbfence
