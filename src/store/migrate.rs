//! The embedded migrations, the checks that run before them (the migrating role may call what pgfence needs and
//! alone controls the schema), the migration lock, and the role layout compared with docs/security.md.

use std::time::Duration;

use diesel::sql_types::{Bool, Text};
use diesel::QueryableByName;
use diesel_async::AsyncPgConnection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use super::Store;
use crate::connect::Kind;
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::limits::DEFAULT_MIGRATION_LOCK_WAIT;
use crate::sqlstate::SqlState;
#[cfg(doc)]
use crate::StoreConfig;

/// The schema migrations compiled into the crate (the `migrations/` folder).
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Session advisory lock key held while migrating, so two processes migrating at once take turns.
/// (The ASCII bytes of "pgfence" followed by a version byte.)
const MIGRATION_LOCK_KEY: i64 = 0x7067_6665_6e63_6501;

/// The advisory-lock functions pgfence calls: the migration lock (here), the guard lock and the intent lock (the
/// lease protocol, the guard; the guard probes the intent lock with the session-level pair). The schema owner must
/// be able to execute every one of them; `pgfence._layout_problems()` (000006_roles) checks the same list once the
/// schema exists.
pub const ADVISORY_FUNCTIONS_NEEDED: [&str; 7] = [
    "pg_catalog.pg_advisory_lock(bigint)",
    "pg_catalog.pg_advisory_xact_lock(integer, integer)",
    "pg_catalog.pg_try_advisory_xact_lock(integer, integer)",
    "pg_catalog.pg_advisory_xact_lock_shared(integer, integer)",
    "pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer)",
    "pg_catalog.pg_try_advisory_lock_shared(integer, integer)",
    "pg_catalog.pg_advisory_unlock_shared(integer, integer)",
];

/// How much a gap in the database's role layout matters ([`LayoutProblem`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LayoutSeverity {
    /// pgfence cannot work: migrations and grants refuse to go on.
    Error,
    /// pgfence works, with a residual risk the problem names.
    Warning,
}

/// A gap between the database's advisory-lock and role layout and the hardened one of docs/security.md
/// ([`Admin::layout_problems`](crate::admin::Admin::layout_problems)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct LayoutProblem {
    /// Whether pgfence can work despite it.
    pub severity: LayoutSeverity,
    /// What is missing and what it risks.
    pub problem: String,
    /// The SQL that closes the gap, and who must run it.
    pub fix: String,
}

impl Store {
    /// Applies the embedded migrations that are not applied yet and returns their versions. Migrating twice is
    /// a no-op; two processes migrating at once take turns (a session advisory lock on a dedicated connection,
    /// waited for at most [`StoreConfig::migration_lock_wait`]).
    ///
    /// Before anything is applied, on every run: the migrating role must be able to execute the advisory-lock
    /// functions pgfence calls ([`ADVISORY_FUNCTIONS_NEEDED`]), and an existing schema `pgfence` must be its alone
    /// — owned by exactly that role, with no schema privilege it did not grant and no CREATE for another role, and
    /// no object in it owned by another role (whoever controls the schema could replace pgfence's functions).
    /// After the migrations, the rest of [`layout_problems`](crate::admin::Admin::layout_problems) is logged as warnings.
    ///
    /// # Errors
    ///
    /// - [`Error::Migration`] whose [`sqlstate`](Error::sqlstate) is `42501` when one of those checks refused,
    ///   naming the owner, grantee, object or functions and the SQL that fixes it; nothing was changed.
    /// - [`Error::Database`] with SQLSTATE `PF003` (transient) when the migration lock was not free within
    ///   [`StoreConfig::migration_lock_wait`], naming the sessions that hold it (pid, application_name, state,
    ///   role).
    /// - [`Error::Migration`] when a migration failed (its transaction rolled back; the ones before it stay
    ///   applied), with the database's error as its source — a missing privilege keeps its SQLSTATE `42501` —
    ///   or when the store sits behind a transaction-mode pooler without [`StoreConfig::direct_url`].
    /// - [`Error::Connect`], [`Error::Tls`], [`Error::NotPrimary`], [`Error::WrongDatabase`] for the dedicated
    ///   connection the migrations run on.
    pub async fn migrate(&self) -> Result<Vec<String>> {
        if !self.can_open_dedicated() {
            return Err(Error::Migration {
                reason: "behind a transaction-mode pooler, migrations need StoreConfig::direct_url (their lock \
                         and search_path are session state)"
                    .to_owned(),
                source: None,
            });
        }
        let applied = run_migrations(
            self.open_dedicated(Kind::Coded).await?,
            self.inner.migration_lock_wait,
        )
        .await?;
        for problem in self.layout_problems().await? {
            tracing::warn!(severity = ?problem.severity, problem = %problem.problem, fix = %problem.fix,
                "the database's role layout leaves a gap (docs/security.md)");
        }
        // The schema may be new: whether pgfence_native is there is asked again.
        self.forget_native_guard();
        Ok(applied)
    }

    /// [`Admin::layout_problems`](crate::admin::Admin::layout_problems).
    pub(crate) async fn layout_problems(&self) -> Result<Vec<LayoutProblem>> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.checked().await?;
        let rows: std::result::Result<Vec<ProblemRow>, _> =
            diesel::sql_query("SELECT severity, problem, fix FROM pgfence._layout_problems()")
                .load(&mut *conn)
                .await;
        conn.settle(&rows);
        Ok(rows?
            .into_iter()
            .map(|row| LayoutProblem {
                severity: if row.severity == "error" {
                    LayoutSeverity::Error
                } else {
                    LayoutSeverity::Warning
                },
                problem: row.problem,
                fix: row.fix,
            })
            .collect())
    }
}

/// A row of the layout and schema checks: a problem and its fix.
#[derive(QueryableByName)]
struct ProblemRow {
    #[diesel(sql_type = Text)]
    severity: String,
    #[diesel(sql_type = Text)]
    problem: String,
    #[diesel(sql_type = Text)]
    fix: String,
}

/// A role or object name made safe for a message: control characters replaced, length bounded, quoted (as
/// `pgfence._printable`, which cannot be used before the schema is known to be the migrating role's).
macro_rules! printable {
    ($e:literal) => {
        concat!(
            "quote_literal(regexp_replace(left(",
            $e,
            ", 64), '[[:cntrl:]]', '?', 'g'))"
        )
    };
}

/// The advisory-lock functions of [`ADVISORY_FUNCTIONS_NEEDED`] the migrating role may not execute (run with
/// `search_path = pg_catalog`; before the migration lock, which needs one of them).
fn missing_execute_query() -> String {
    let needed = ADVISORY_FUNCTIONS_NEEDED
        .iter()
        .map(|f| format!("'{f}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT 'error' AS severity, \
                format('the migrating role %s may not execute %s, which pgfence''s functions call as the schema \
                        owner: acquire, guarded writes, takeovers and migrate would fail 42501', \
                       {me}, string_agg(f::text, ', ' ORDER BY f::text)) AS problem, \
                format('GRANT EXECUTE ON FUNCTION %s TO %s (as a superuser, in this database)', \
                       string_agg(f::text, ', ' ORDER BY f::text), quote_ident(current_user::text)) AS fix \
           FROM unnest(ARRAY[{needed}]::regprocedure[]) f \
          WHERE NOT has_function_privilege(f, 'EXECUTE') \
         HAVING count(*) > 0",
        me = printable!("current_user::text"),
    )
}

/// Why the existing schema `pgfence` is not the migrating role's alone, one row per problem (none: it is). Run
/// with `search_path = pg_catalog`, after the migration lock and before anything of the schema is used or
/// created: another role's schema, a schema privilege the migrating role did not grant (or CREATE for another
/// role), or an object in the schema of another role would let that role replace pgfence's functions. The
/// first migration checks the same (000001_schema).
const SCHEMA_PROBLEMS: &str = concat!(
    "WITH me AS (SELECT oid FROM pg_roles WHERE rolname = current_user), \
          s AS (SELECT n.oid, n.nspowner, n.nspacl FROM pg_namespace n WHERE n.nspname = 'pgfence'), \
          objects(what, owner) AS ( \
            SELECT 'relation pgfence.' || quote_ident(c.relname), c.relowner FROM pg_class c, s \
             WHERE c.relnamespace = s.oid \
            UNION ALL SELECT 'function ' || p.oid::regprocedure::text, p.proowner FROM pg_proc p, s \
             WHERE p.pronamespace = s.oid \
            UNION ALL SELECT 'type pgfence.' || quote_ident(t.typname), t.typowner FROM pg_type t, s \
             WHERE t.typnamespace = s.oid \
            UNION ALL SELECT 'operator pgfence.' || o.oprname, o.oprowner FROM pg_operator o, s \
             WHERE o.oprnamespace = s.oid \
            UNION ALL SELECT 'collation pgfence.' || quote_ident(c.collname), c.collowner FROM pg_collation c, s \
             WHERE c.collnamespace = s.oid \
            UNION ALL SELECT 'conversion pgfence.' || quote_ident(c.conname), c.conowner FROM pg_conversion c, s \
             WHERE c.connamespace = s.oid \
            UNION ALL SELECT 'operator family pgfence.' || quote_ident(f.opfname), f.opfowner FROM pg_opfamily f, s \
             WHERE f.opfnamespace = s.oid \
            UNION ALL SELECT 'operator class pgfence.' || quote_ident(c.opcname), c.opcowner FROM pg_opclass c, s \
             WHERE c.opcnamespace = s.oid \
            UNION ALL SELECT 'text search configuration pgfence.' || quote_ident(c.cfgname), c.cfgowner \
              FROM pg_ts_config c, s WHERE c.cfgnamespace = s.oid \
            UNION ALL SELECT 'text search dictionary pgfence.' || quote_ident(d.dictname), d.dictowner \
              FROM pg_ts_dict d, s WHERE d.dictnamespace = s.oid \
            UNION ALL SELECT 'statistics object pgfence.' || quote_ident(x.stxname), x.stxowner \
              FROM pg_statistic_ext x, s WHERE x.stxnamespace = s.oid) \
     SELECT 'error' AS severity, \
            format('the schema pgfence is owned by %s, not by %s (the role migrating); it holds %s objects', ",
    printable!("pg_get_userbyid(s.nspowner)"),
    ", ",
    printable!("current_user::text"),
    ", (SELECT count(*) FROM objects)) AS problem, \
            format('DROP SCHEMA pgfence (as %s or a superuser) when it holds nothing of yours, then migrate \
                    again; ALTER SCHEMA pgfence OWNER TO %s only if you trust every object in it', ",
    printable!("pg_get_userbyid(s.nspowner)"),
    ", quote_ident(current_user::text)) AS fix \
       FROM s, me WHERE s.nspowner <> me.oid \
     UNION ALL \
     SELECT 'error', \
            format('the schema pgfence grants %s to %s (granted by %s)', a.privilege_type, \
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE ",
    printable!("pg_get_userbyid(a.grantee)"),
    " END, ",
    printable!("pg_get_userbyid(a.grantor)"),
    "), \
            format('REVOKE %s ON SCHEMA pgfence FROM %s', a.privilege_type, \
                   CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END) \
       FROM s CROSS JOIN LATERAL aclexplode(s.nspacl) a, me \
      WHERE s.nspowner = me.oid AND a.grantee <> me.oid AND (a.grantor <> me.oid OR a.privilege_type = 'CREATE') \
     UNION ALL \
     SELECT 'error', format('%s in the schema pgfence is owned by %s', o.what, ",
    printable!("pg_get_userbyid(o.owner)"),
    "), \
            format('drop %s (or change its owner to %s once you have checked it), then migrate again', o.what, \
                   quote_ident(current_user::text)) \
       FROM objects o, me, s WHERE s.nspowner = me.oid AND o.owner <> me.oid"
);

/// The refusal of a migration whose pre-flight check found `problems`: [`Error::Migration`] whose source is the
/// privilege error (SQLSTATE `42501`, reachable through [`Error::sqlstate`]).
fn migration_refused(what: &str, problems: &[ProblemRow]) -> Error {
    let listed = |f: fn(&ProblemRow) -> &str| {
        let mut items: Vec<&str> = problems.iter().take(5).map(f).collect();
        if problems.len() > 5 {
            items.push("…");
        }
        items.join("; ")
    };
    let message = format!(
        "{what}: {}. To fix: {}",
        listed(|p| &p.problem),
        listed(|p| &p.fix)
    );
    Error::Migration {
        reason: message.clone(),
        source: Some(Box::new(Error::Database {
            sqlstate: Some(SqlState::InsufficientPrivilege),
            message,
            source: None,
        })),
    }
}

/// Takes the migration lock, waiting at most `wait`; past it, `PF003` naming the sessions that hold the lock
/// (pid, application_name, state, role, escaped).
async fn take_migration_lock(conn: &mut AsyncPgConnection, wait: Duration) -> Result<()> {
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
    let ms = wait.as_millis().clamp(1, i32::MAX as u128);
    conn.batch_execute(&format!("SET lock_timeout = '{ms}ms'"))
        .await?;
    let locked = conn
        .batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))
        .await;
    if let Err(e) = locked {
        let error = Error::from(e);
        if error.sqlstate() != Some(SqlState::LockNotAvailable) {
            return Err(error);
        }
        #[derive(QueryableByName)]
        struct Holders {
            #[diesel(sql_type = Text)]
            holders: String,
        }
        let (classid, objid) = (MIGRATION_LOCK_KEY >> 32, MIGRATION_LOCK_KEY & 0xffff_ffff);
        let holders: Holders = diesel::sql_query(format!(
            "SELECT coalesce(string_agg(format('pid %s (application_name %s, state %s, role %s)', a.pid, {app}, \
                    coalesce(a.state, 'unknown'), {role}), ', ' ORDER BY a.pid), \
                    'no session any more (the holder has just ended)') AS holders \
               FROM pg_stat_activity a \
              WHERE a.pid IN (SELECT k.pid FROM pg_locks k \
                               WHERE k.locktype = 'advisory' AND k.classid = {classid}::bigint::oid \
                                 AND k.objid = {objid}::bigint::oid AND k.objsubid = 1 AND k.granted \
                                 AND k.database = (SELECT d.oid FROM pg_database d \
                                                    WHERE d.datname = current_database()))",
            app = printable!("a.application_name"),
            role = printable!("a.usename::text"),
        ))
        .get_result(conn)
        .await?;
        return Err(Error::Database {
            sqlstate: Some(SqlState::LockWaitEnded),
            message: format!(
                "pgfence: migrate waited {wait:?} for the migration lock (advisory lock {MIGRATION_LOCK_KEY}); \
                 held by {}",
                holders.holders
            ),
            source: Some(Box::new(error)),
        });
    }
    conn.batch_execute("RESET lock_timeout").await?;
    Ok(())
}

/// Checks the layout and the schema, takes the migration lock and applies what is not applied yet.
async fn run_migrations(mut conn: AsyncPgConnection, lock_wait: Duration) -> Result<Vec<String>> {
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
    // Nothing of the schema pgfence is used before it is known to be the migrating role's: the checks read the
    // catalogs only. No JIT on this session: the catalog checks and the migrations' own are planned with large
    // row estimates and would be compiled for seconds to run for milliseconds.
    conn.batch_execute("SET search_path = pg_catalog, pg_temp; SET jit = off")
        .await?;
    let missing: Vec<ProblemRow> = diesel::sql_query(missing_execute_query())
        .load(&mut conn)
        .await?;
    if !missing.is_empty() {
        return Err(migration_refused(
            "refusing to migrate: the advisory-lock layout lacks what pgfence needs",
            &missing,
        ));
    }
    // Serialize concurrent migrators; the lock is released when this dedicated connection closes.
    take_migration_lock(&mut conn, lock_wait).await?;
    // CREATE SCHEMA needs CREATE on the database even when the schema exists: only when it does not.
    let exists: bool = diesel::select(diesel::dsl::sql::<Bool>(
        "EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgfence')",
    ))
    .get_result(&mut conn)
    .await?;
    if !exists {
        conn.batch_execute("CREATE SCHEMA IF NOT EXISTS pgfence")
            .await?;
    }
    let problems: Vec<ProblemRow> = diesel::sql_query(SCHEMA_PROBLEMS).load(&mut conn).await?;
    if !problems.is_empty() {
        return Err(migration_refused(
            "refusing to migrate into a schema pgfence that another role controls (it could replace pgfence's \
             functions)",
            &problems,
        ));
    }
    conn.batch_execute("SET search_path = pgfence").await?;
    // diesel's migration harness is synchronous; run it on a blocking thread through the wrapper (it blocks on
    // the current runtime's handle, which must not happen on a runtime worker thread).
    let applied = tokio::task::spawn_blocking(move || {
        let mut wrapped: diesel_async::async_connection_wrapper::AsyncConnectionWrapper<
            AsyncPgConnection,
        > = diesel_async::async_connection_wrapper::AsyncConnectionWrapper::from(conn);
        let applied = wrapped
            .run_pending_migrations(MIGRATIONS)
            .map(|versions| versions.iter().map(|v| v.to_string()).collect::<Vec<_>>())
            .map_err(|e| Error::Migration {
                reason: e.to_string(),
                source: Some(e),
            })?;
        // The guard's shape for this server, on every migrate (a server upgraded to PostgreSQL 18 since the
        // schema was made gets the SQL shape now; idempotent: nothing changes when the shape is already the one
        // the server supports best). See pgfence._install_guard in 000003_guard.
        diesel::connection::SimpleConnection::batch_execute(
            &mut wrapped,
            "SELECT pgfence._install_guard()",
        )
        .map_err(|e| Error::Migration {
            reason: format!("installing the guard's shape for this server: {e}"),
            source: Some(Box::new(e)),
        })?;
        Ok::<_, Error>(applied)
    })
    .await
    .map_err(|e| Error::Migration {
        reason: format!("migration task failed: {e}"),
        source: Some(Box::new(e)),
    })??;
    if applied.is_empty() {
        tracing::debug!("schema already up to date");
    } else {
        tracing::info!(?applied, "applied migrations");
    }
    Ok(applied)
}
