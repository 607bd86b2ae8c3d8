/*
 * pgfence_native: pgfence.fence's fast path in C.
 *
 * pgfence_native.fence(lease, epoch, secret, operation, table, key) answers exactly as pgfence.fence does. It
 * admits by itself only the common case — a tenure this backend has already seen pgfence.fence admit, presented
 * again with the same secret, still current, held, unexpired and on the current timeline, by a role that may
 * execute pgfence.fence and has a grant on the lease's cluster, no takeover in flight, READ COMMITTED, plain
 * labels — and hands everything else to pgfence.fence (the portable guard, plpgsql), which
 * decides, refuses and audits. So it can only admit what pgfence.fence admits.
 *
 * What it remembers, per lease, in this backend's private memory (no role can write it: only this code does,
 * and only after pgfence.fence answered 'ok' to the same lease, epoch and secret): the lease's guard lock key,
 * the epoch, the tenure's acquisition time, the OID of pgfence.leases and the secret presented. A tenure's secret
 * never changes, so a secret equal to the remembered one is that tenure's secret; the acquisition time and the
 * table's OID tell the tenure apart from one that reuses its epoch and lock key after the schema was dropped and
 * created again. Nothing about the grant, the timeline or the expiry is remembered: those are read again on
 * every call.
 *
 * The fast path, in order (each "no" goes to pgfence.fence, holding nothing it did not hold before, except the
 * guard lock when it was taken, which pgfence.fence then finds held):
 *   1. READ COMMITTED, the arguments non-NULL and the labels plain (pgfence._plain_labels' test);
 *   2. the backend remembers this lease at this epoch with this secret (compared in constant time);
 *   3. the caller may execute pgfence.fence;
 *   4. the intent probe and the guard lock shared, without waiting (see try_guard_lock): no transaction holds the
 *      intent lock (1885824613, -lock_key), then the guard lock (1885824613, lock_key) shared at transaction
 *      level;
 *   5. a snapshot taken after the lock (every takeover that held the intent or the guard lock before it was
 *      granted has committed and shows), and on it the lease's row by its primary key: the same lock key, epoch
 *      and acquisition time, held, expiring after the clock read now, a timeline no older than the server's;
 *   6. the grant, on the same snapshot: the session's login role is a member of the pgfence schema's owner, or of
 *      a role that pgfence.grants grants the lease's cluster (or every cluster) — pgfence._grant_of's rule;
 *   7. the write mark, when one is due (the session's mark, pgfence.write_mark, does not name this tenure and
 *      second): recorded as pgfence._mark does (see write_mark);
 * then it leaves the secret for the raw-SQL enforcement (pgfence.tenure_secret_<lock key>, transaction-local)
 * and answers 'ok'. When it took the guard lock and then could not admit, it first sets the marker
 * pgfence.guard_held_<lock key> (transaction-local), by which pgfence._await_takeover knows the transaction
 * holds the lock.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/pg_list.h"
#include "parser/parse_func.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include <math.h>

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(pgfence_native_fence);
PG_FUNCTION_INFO_V1(pgfence_native_remembered);

/* The advisory lock class of every pgfence lock: pgfence._guard_lock_class() of the migrations, and
 * pgfence::schema::GUARD_LOCK_CLASS of the library (tests/sql_source.rs compares those two). */
#define PGFENCE_LOCK_CLASS 1885824613
/* A lease name is at most 63 + 1 + 200 bytes (pgfence._lease_problem); a secret at most 128. */
#define LEASE_MAX 272
#define SECRET_MAX 128
/* Leases remembered per backend at most; past that the memory starts again empty. */
#define REMEMBERED_MAX 4096

typedef struct Remembered
{
	char		lease[LEASE_MAX];	/* the hash key: the lease name, NUL-terminated */
	Oid			leases_relid;
	int32		lock_key;
	int64		epoch;
	TimestampTz acquired_at;
	int			secret_len;
	char		secret[SECRET_MAX];
} Remembered;

static HTAB *remembered = NULL;

/*
 * Where pgfence's objects are, looked up once and forgotten on any invalidation of a relation, a function or a
 * schema (a migration, a dropped and created schema): the namespace, pgfence.leases, its primary key and columns,
 * pgfence.grants, its cluster index and role column, and pgfence.fence.
 */
typedef struct Catalog
{
	bool		valid;
	Oid			nsp;
	Oid			leases;
	Oid			leases_pkey;
	AttrNumber	lock_key;
	AttrNumber	epoch;
	AttrNumber	state;
	AttrNumber	expires_at;
	AttrNumber	timeline;
	AttrNumber	acquired_at;
	Oid			grants;
	Oid			grants_cluster_idx;
	AttrNumber	grant_role;
	Oid			fence;
} Catalog;

static Catalog catalog;
static bool callbacks_registered = false;

static void
invalidate_relation(Datum arg, Oid relid)
{
	catalog.valid = false;
}

static void
invalidate_syscache(Datum arg, int cacheid, uint32 hashvalue)
{
	catalog.valid = false;
}

static HTAB *
memory(void)
{
	if (remembered == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = LEASE_MAX;
		ctl.entrysize = sizeof(Remembered);
		ctl.hcxt = TopMemoryContext;
		remembered = hash_create("pgfence_native remembered tenures", 64, &ctl,
								 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	return remembered;
}

static void
forget(const char *lease)
{
	if (remembered != NULL)
		hash_search(remembered, lease, HASH_REMOVE, NULL);
}

/* The text's bytes as a NUL-terminated lease key, or false when it cannot be one. */
static bool
lease_key(text *t, char *out)
{
	int			len = VARSIZE_ANY_EXHDR(t);

	if (len < 1 || len >= LEASE_MAX)
		return false;
	memcpy(out, VARDATA_ANY(t), len);
	out[len] = '\0';
	/* A NUL inside would truncate the key (lease names never hold one: pgfence._lease_problem). */
	return strlen(out) == (size_t) len;
}

/* Bytes 0x20..0x7E only, length in [1, max] (NULL: whether it may be NULL). pgfence._plain_labels' test. */
static bool
plain_label(FunctionCallInfo fcinfo, int arg, int max, bool optional)
{
	text	   *t;
	const unsigned char *p;
	int			len;

	if (PG_ARGISNULL(arg))
		return optional;
	t = PG_GETARG_TEXT_PP(arg);
	len = VARSIZE_ANY_EXHDR(t);
	if (len < 1 || len > max)
		return false;
	p = (const unsigned char *) VARDATA_ANY(t);
	for (int i = 0; i < len; i++)
		if (p[i] < 0x20 || p[i] > 0x7E)
			return false;
	return true;
}

/* Constant-time comparison of the presented secret with the remembered one. */
static bool
same_secret(const Remembered *r, text *secret)
{
	int			len = VARSIZE_ANY_EXHDR(secret);
	const char *p = VARDATA_ANY(secret);
	unsigned char diff = 0;

	if (len != r->secret_len)
		return false;
	for (int i = 0; i < len; i++)
		diff |= (unsigned char) (p[i] ^ r->secret[i]);
	return diff == 0;
}

static AttrNumber
column(Oid relid, const char *table, const char *name)
{
	AttrNumber	n = get_attnum(relid, name);

	if (n == InvalidAttrNumber)
		ereport(ERROR, (errmsg("pgfence_native: pgfence.%s has no column %s", table, name),
						errhint("The pgfence schema is not the one this extension knows: update pgfence_native.")));
	return n;
}

static Oid
relation(Oid nsp, const char *name)
{
	Oid			relid = get_relname_relid(name, nsp);

	if (!OidIsValid(relid))
		ereport(ERROR, (errmsg("pgfence_native: pgfence.%s does not exist", name),
						errhint("Run pgfence's migrations before CREATE EXTENSION pgfence_native.")));
	return relid;
}

/* The catalog entry for pgfence's schema nsp, looked up again after any invalidation. */
static const Catalog *
pgfence_catalog(Oid nsp)
{
	Oid			argtypes[6] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID};

	if (!callbacks_registered)
	{
		CacheRegisterRelcacheCallback(invalidate_relation, (Datum) 0);
		CacheRegisterSyscacheCallback(PROCOID, invalidate_syscache, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, invalidate_syscache, (Datum) 0);
		callbacks_registered = true;
	}
	if (catalog.valid && catalog.nsp == nsp)
		return &catalog;
	catalog.valid = false;
	catalog.nsp = nsp;
	catalog.leases = relation(nsp, "leases");
	catalog.leases_pkey = relation(nsp, "leases_pkey");
	catalog.lock_key = column(catalog.leases, "leases", "lock_key");
	catalog.epoch = column(catalog.leases, "leases", "epoch");
	catalog.state = column(catalog.leases, "leases", "state");
	catalog.expires_at = column(catalog.leases, "leases", "expires_at");
	catalog.timeline = column(catalog.leases, "leases", "timeline");
	catalog.acquired_at = column(catalog.leases, "leases", "acquired_at");
	catalog.grants = relation(nsp, "grants");
	catalog.grants_cluster_idx = relation(nsp, "grants_cluster_idx");
	catalog.grant_role = column(catalog.grants, "grants", "role");
	catalog.fence = LookupFuncName(list_make2(makeString("pgfence"), makeString("fence")), 6, argtypes, false);
	catalog.valid = true;
	return &catalog;
}

/* The pgfence schema: its OID and owner. False when it does not exist. */
static bool
pgfence_schema(Oid *nsp, Oid *owner)
{
	HeapTuple	tup = SearchSysCache1(NAMESPACENAME, CStringGetDatum("pgfence"));

	if (!HeapTupleIsValid(tup))
		return false;
	*nsp = ((Form_pg_namespace) GETSTRUCT(tup))->oid;
	*owner = ((Form_pg_namespace) GETSTRUCT(tup))->nspowner;
	ReleaseSysCache(tup);
	return true;
}

static void
set_local(const char *name, const char *value)
{
	(void) set_config_option(name, value, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
}

/* Hands the call to pgfence.fence, the portable guard, with the caller's arguments; checks EXECUTE as a call
 * of it would. */
static Datum
portable(FunctionCallInfo fcinfo)
{
	Oid			nsp;
	Oid			owner;
	Oid			fn;
	AclResult	acl;
	FmgrInfo	flinfo;
	Datum		result;

	LOCAL_FCINFO(call, 6);

	if (!pgfence_schema(&nsp, &owner))
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION), errmsg("pgfence_native: the pgfence schema does not exist")));
	fn = pgfence_catalog(nsp)->fence;
	acl = pg_proc_aclcheck(fn, GetUserId(), ACL_EXECUTE);
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_FUNCTION, "pgfence.fence");
	fmgr_info(fn, &flinfo);
	InitFunctionCallInfoData(*call, &flinfo, 6, PG_GET_COLLATION(), NULL, NULL);
	for (int i = 0; i < 6; i++)
	{
		call->args[i].value = PG_GETARG_DATUM(i);
		call->args[i].isnull = PG_ARGISNULL(i);
	}
	result = FunctionCallInvoke(call);
	if (call->isnull)
		elog(ERROR, "pgfence.fence returned NULL");
	return result;
}

/* The lease's row as the fast path needs it, read on snapshot snap by the primary key. */
typedef struct LeaseRow
{
	int32		lock_key;
	int64		epoch;
	bool		held;
	TimestampTz expires_at;
	bool		timeline_null;
	int64		timeline;
	bool		acquired_null;
	TimestampTz acquired_at;
} LeaseRow;

static bool
read_lease(const Catalog *c, text *lease, Snapshot snap, LeaseRow *row)
{
	Relation	rel;
	Relation	idx;
	IndexScanDesc scan;
	ScanKeyData key;
	TupleTableSlot *slot;
	bool		found;

	rel = table_open(c->leases, AccessShareLock);
	idx = index_open(c->leases_pkey, AccessShareLock);
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(lease));
	key.sk_collation = idx->rd_indcollation[0];
	scan = index_beginscan(rel, idx, snap, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	slot = table_slot_create(rel, NULL);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
	{
		bool		isnull;
		Datum		d;
		text	   *state;

		d = slot_getattr(slot, c->lock_key, &isnull);
		row->lock_key = isnull ? 0 : DatumGetInt32(d);
		d = slot_getattr(slot, c->epoch, &isnull);
		row->epoch = isnull ? -1 : DatumGetInt64(d);
		d = slot_getattr(slot, c->state, &isnull);
		state = isnull ? NULL : DatumGetTextPP(d);
		row->held = state != NULL && VARSIZE_ANY_EXHDR(state) == 4 && memcmp(VARDATA_ANY(state), "held", 4) == 0;
		d = slot_getattr(slot, c->expires_at, &isnull);
		row->expires_at = isnull ? DT_NOBEGIN : DatumGetTimestampTz(d);
		d = slot_getattr(slot, c->timeline, &isnull);
		row->timeline_null = isnull;
		row->timeline = isnull ? 0 : DatumGetInt64(d);
		d = slot_getattr(slot, c->acquired_at, &isnull);
		row->acquired_null = isnull;
		row->acquired_at = isnull ? 0 : DatumGetTimestampTz(d);
	}
	ExecDropSingleTupleTableSlot(slot);
	index_endscan(scan);
	index_close(idx, AccessShareLock);
	table_close(rel, AccessShareLock);
	return found;
}

/* pgfence._grant_of(cluster)'s rule on snapshot snap: the session's login role is a member of the schema's owner,
 * or of a role that pgfence.grants grants the cluster or every cluster. */
static bool
granted(const Catalog *c, Oid owner, const char *lease, Snapshot snap)
{
	Oid			session = GetSessionUserId();
	Relation	rel;
	Relation	idx;
	const char *slash;
	text	   *cluster;
	bool		found = false;

	if (is_member_of_role(session, owner))
		return true;
	slash = strchr(lease, '/');
	cluster = slash ? cstring_to_text_with_len(lease, slash - lease) : cstring_to_text(lease);
	rel = table_open(c->grants, AccessShareLock);
	idx = index_open(c->grants_cluster_idx, AccessShareLock);
	/* Two scans of the cluster index: the cluster's grants, then the grants of every cluster (cluster IS NULL). */
	for (int pass = 0; pass < 2 && !found; pass++)
	{
		ScanKeyData key;
		IndexScanDesc scan;
		TupleTableSlot *slot;

		if (pass == 0)
		{
			ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(cluster));
			key.sk_collation = idx->rd_indcollation[0];
		}
		else
			ScanKeyEntryInitialize(&key, SK_ISNULL | SK_SEARCHNULL, 1, InvalidStrategy, InvalidOid, InvalidOid,
								   InvalidOid, (Datum) 0);
		scan = index_beginscan(rel, idx, snap, 1, 0);
		index_rescan(scan, &key, 1, NULL, 0);
		slot = table_slot_create(rel, NULL);
		while (!found && index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			Datum		d = slot_getattr(slot, c->grant_role, &isnull);

			if (!isnull && is_member_of_role(session, DatumGetObjectId(d)))
				found = true;
		}
		ExecDropSingleTupleTableSlot(slot);
		index_endscan(scan);
	}
	index_close(idx, AccessShareLock);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * The intent probe and the guard lock shared, without waiting (pgfence._try_guard_lock's rule). The probe asks the
 * lock manager whether any transaction holds the intent lock (1885824613, -lock_key) in a mode that conflicts with
 * a shared one — a takeover holds it exclusive from its start to its end — instead of taking it shared and giving
 * it back: the same answer for a takeover (a transaction, so it has a virtual transaction id), one look at the
 * lock's partition under a shared LWLock instead of two exclusive ones. (An idle session holding the intent lock
 * outside any transaction is not seen; it is no takeover, and a takeover queued behind it waits for it anyway.) No
 * takeover at the probe: from the guard lock on, every later takeover waits for this transaction; one whose
 * intent lock fell between the probe and the guard lock finds this write holding the guard lock and waits for
 * it, like for any write past its check. The guard lock is a try: it fails behind a queued takeover (a request
 * conflicting with a waiting one waits), so takeovers are not starved.
 */
static bool
try_guard_lock(int32 lock_key)
{
	LOCKTAG		intent;
	LOCKTAG		guard;
	int			holders = 0;

	SET_LOCKTAG_ADVISORY(intent, MyDatabaseId, (uint32) PGFENCE_LOCK_CLASS, (uint32) (-lock_key), 2);
	SET_LOCKTAG_ADVISORY(guard, MyDatabaseId, (uint32) PGFENCE_LOCK_CLASS, (uint32) lock_key, 2);
	pfree(GetLockConflicts(&intent, ShareLock, &holders));
	if (holders > 0)
		return false;
	return LockAcquire(&guard, ShareLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

/* After pgfence.fence answered 'ok': remember the tenure it admitted (its row read on a fresh snapshot). */
static void
remember(FunctionCallInfo fcinfo, const char *lease_name, text *lease)
{
	Oid			nsp;
	Oid			owner;
	const Catalog *c;
	text	   *secret;
	LeaseRow	row;
	Snapshot	snap;
	bool		found;
	Remembered *r;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2) || !pgfence_schema(&nsp, &owner))
		return;
	secret = PG_GETARG_TEXT_PP(2);
	if (VARSIZE_ANY_EXHDR(secret) > SECRET_MAX)
		return;
	c = pgfence_catalog(nsp);
	snap = RegisterSnapshot(GetLatestSnapshot());
	found = read_lease(c, lease, snap, &row);
	UnregisterSnapshot(snap);
	/* Only the tenure that was admitted: if another has begun since, nothing is remembered. */
	if (!found || row.epoch != PG_GETARG_INT64(1) || !row.held || row.acquired_null)
	{
		forget(lease_name);
		return;
	}
	if (hash_get_num_entries(memory()) >= REMEMBERED_MAX)
	{
		hash_destroy(remembered);
		remembered = NULL;
	}
	r = hash_search(memory(), lease_name, HASH_ENTER, NULL);
	r->leases_relid = c->leases;
	r->lock_key = row.lock_key;
	r->epoch = row.epoch;
	r->acquired_at = row.acquired_at;
	r->secret_len = VARSIZE_ANY_EXHDR(secret);
	memcpy(r->secret, VARDATA_ANY(secret), r->secret_len);
}

/*
 * The write mark of an admitted write (pgfence._mark's upsert, in the write's transaction), written as the owner
 * of the pgfence schema — who alone writes pgfence.write_marks, as pgfence.fence does as its SECURITY DEFINER
 * owner — by a statement that names everything by schema (the caller's search_path resolves nothing in it); then
 * the session remembers the mark, as pgfence._mark does, so its other writes of that second record nothing.
 */
static void
write_mark(Oid owner, text *lease, int64 epoch, const char *mark)
{
	Oid			save_userid;
	int			save_sec_context;
	Oid			argtypes[2] = {TEXTOID, INT8OID};
	Datum		args[2];

	args[0] = PointerGetDatum(lease);
	args[1] = Int64GetDatum(epoch);
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	PG_TRY();
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "pgfence_native: SPI_connect failed");
		if (SPI_execute_with_args("INSERT INTO pgfence.write_marks AS m (lease, epoch, backend, last_at) "
								  "VALUES ($1, $2, pg_catalog.pg_backend_pid(), pg_catalog.clock_timestamp()) "
								  "ON CONFLICT (lease, epoch, backend) "
								  "DO UPDATE SET last_at = GREATEST(m.last_at, EXCLUDED.last_at)",
								  2, argtypes, args, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "pgfence_native: the write mark was not recorded");
		SPI_finish();
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(save_userid, save_sec_context);
	}
	PG_END_TRY();
	(void) set_config_option("pgfence.write_mark", mark, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SET, true, 0,
							 false);
}

/* The slow path: pgfence.fence decides; an 'ok' is remembered for the next call. */
static Datum
slow(FunctionCallInfo fcinfo, const char *lease_name, text *lease)
{
	Datum		result = portable(fcinfo);
	HeapTupleHeader answer = DatumGetHeapTupleHeader(result);
	bool		isnull;
	Datum		outcome = GetAttributeByNum(answer, 1, &isnull);

	if (lease_name != NULL)
	{
		text	   *o = isnull ? NULL : DatumGetTextPP(outcome);

		if (o != NULL && VARSIZE_ANY_EXHDR(o) == 2 && memcmp(VARDATA_ANY(o), "ok", 2) == 0)
			remember(fcinfo, lease_name, lease);
		else
		{
			/* A refusal of the remembered tenure ends it; one of another epoch says nothing about it. */
			Remembered *r = hash_search(memory(), lease_name, HASH_FIND, NULL);

			if (r != NULL && !PG_ARGISNULL(1) && r->epoch == PG_GETARG_INT64(1))
				forget(lease_name);
		}
	}
	return result;
}

Datum
pgfence_native_fence(PG_FUNCTION_ARGS)
{
	char		lease_name[LEASE_MAX];
	text	   *lease;
	text	   *secret;
	int64		epoch;
	Remembered *r;
	Oid			nsp;
	Oid			owner;
	const Catalog *c;
	LeaseRow	row;
	Snapshot	snap;
	bool		found;
	bool		admit;
	TimestampTz now;
	char		setting[64];
	char		mark[LEASE_MAX + 64];
	const char *last_mark;
	char	   *secret_value;
	TupleDesc	desc;
	Datum		values[13];
	bool		nulls[13];

	/* 1. */
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || XactIsoLevel != XACT_READ_COMMITTED
		|| !plain_label(fcinfo, 3, 64, false) || !plain_label(fcinfo, 4, 64, true)
		|| !plain_label(fcinfo, 5, 256, true))
		return slow(fcinfo, NULL, NULL);
	lease = PG_GETARG_TEXT_PP(0);
	epoch = PG_GETARG_INT64(1);
	secret = PG_GETARG_TEXT_PP(2);
	if (!lease_key(lease, lease_name))
		return slow(fcinfo, NULL, NULL);
	/* 2. */
	r = remembered == NULL ? NULL : hash_search(remembered, lease_name, HASH_FIND, NULL);
	if (r == NULL || r->epoch != epoch)
		return slow(fcinfo, lease_name, lease);
	/* Another secret for the remembered tenure: pgfence.fence refuses it, and the memory stays (a forger sharing
	 * the backend must not make the holder's writes slow). */
	if (!same_secret(r, secret))
		return slow(fcinfo, NULL, NULL);
	/* 3. (and the schema, the table the tenure was remembered from) */
	c = pgfence_schema(&nsp, &owner) ? pgfence_catalog(nsp) : NULL;
	if (c == NULL || c->leases != r->leases_relid
		|| pg_proc_aclcheck(c->fence, GetUserId(), ACL_EXECUTE) != ACLCHECK_OK)
	{
		forget(lease_name);
		return slow(fcinfo, lease_name, lease);
	}
	/* 4. (A standby has no takeovers and no writes: pgfence.fence answers there.) */
	if (RecoveryInProgress() || !try_guard_lock(r->lock_key))
		return slow(fcinfo, lease_name, lease);
	/* 5. and 6. */
	snap = RegisterSnapshot(GetLatestSnapshot());
	found = read_lease(c, lease, snap, &row);
	now = GetCurrentTimestamp();
	admit = found && row.lock_key == r->lock_key && row.epoch == epoch && row.held && row.expires_at > now
		&& !row.acquired_null && row.acquired_at == r->acquired_at && !row.timeline_null
		&& !RecoveryInProgress() && row.timeline >= (int64) GetWALInsertionTimeLine()
		&& granted(c, owner, lease_name, snap);
	UnregisterSnapshot(snap);
	if (!admit)
	{
		/* The name pgfence._guard_held_setting(lock_key) gives. */
		snprintf(setting, sizeof(setting), "pgfence.guard_held_%d", r->lock_key);
		set_local(setting, "on");
		forget(lease_name);
		return slow(fcinfo, lease_name, lease);
	}
	/* 7. The write mark: "<epoch>:<second>:<lease>" by the clock after the admission, as pgfence.fence names it. */
	/* (date_part('epoch', ts) is (ts - the Unix epoch) / 1e6 as float8; ::bigint rounds it with rint.) */
	snprintf(mark, sizeof(mark), INT64_FORMAT ":" INT64_FORMAT ":%s", epoch,
			 (int64) rint((double) (now - SetEpochTimestamp()) / 1000000.0), lease_name);
	last_mark = GetConfigOption("pgfence.write_mark", true, false);
	if (last_mark == NULL || strcmp(last_mark, mark) != 0)
		write_mark(owner, lease, epoch, mark);
	/* Admitted: the secret for the raw-SQL enforcement, then 'ok'. */
	snprintf(setting, sizeof(setting), "pgfence.tenure_secret_%d", r->lock_key);
	secret_value = text_to_cstring(secret);
	set_local(setting, secret_value);
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "pgfence_native.fence must return pgfence.write_result");
	memset(nulls, true, sizeof(nulls));
	values[0] = CStringGetTextDatum("ok");
	nulls[0] = false;
	values[2] = Int64GetDatum(epoch);
	nulls[2] = false;
	if (!PG_ARGISNULL(5))
	{
		values[5] = PG_GETARG_DATUM(5);
		nulls[5] = false;
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* The leases this backend remembers: lease, epoch, lock key (never the secret). */
Datum
pgfence_native_remembered(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS seq;
	Remembered *r;

	InitMaterializedSRF(fcinfo, 0);
	if (remembered == NULL)
		return (Datum) 0;
	hash_seq_init(&seq, remembered);
	while ((r = hash_seq_search(&seq)) != NULL)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = CStringGetTextDatum(r->lease);
		values[1] = Int64GetDatum(r->epoch);
		values[2] = Int32GetDatum(r->lock_key);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
