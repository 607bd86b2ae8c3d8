//! The operator's side of a store ([`Store::admin`], [`Admin`]): the database it reaches (its identity, the
//! native guard, the pool), every lease of the cluster (listed, force-released), the audit of refused writes
//! ([`Rejection`], kept and pruned), the raw-SQL enforcement switch ([`Enforcement`]), the grants that let roles
//! use a cluster ([`Admin::grant_application`], [`Admin::grant_operator`], [`Admin::revoke`]) and the repair and
//! check of the schema's layout ([`Admin::harden`], [`Admin::layout_problems`]). The writes need the schema owner
//! or an operator role.
//!
//! SQL: the enforcement and `pgfence.prune_rejections` in `migrations/2026-11-30-000003_guard/up.sql`;
//! `pgfence.grant_application`, `pgfence.grant_operator` and `pgfence.revoke` in
//! `migrations/2026-11-30-000006_roles/up.sql`.

use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use serde::{Deserialize, Serialize};

use crate::audit::REJECTION_COLUMNS;
pub use crate::audit::{Rejection, RejectionFilter};
use crate::connect::identity::DatabaseIdentity;
use crate::error::{Error, Result};
use crate::reply::unexpected;
use crate::sqlstate::SqlState;
use crate::store::migrate::{LayoutProblem, LayoutSeverity};
use crate::store::{Pool, PooledConnection, Store};
use crate::validate::validate_holder;

/// Raw-SQL enforcement on pgfence's task tables (see [`Admin::set_enforcement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Enforcement {
    /// Raw SQL is not checked (the default); privileges still apply.
    Off,
    /// Raw SQL without the current epoch fails with SQLSTATE `PF001`.
    Error,
    /// Raw SQL without the current epoch is skipped, recorded in `pgfence.rejections` and warned about.
    Audit,
}

/// What [`Admin::revoke`] did: whether a grant was removed, and what the repair it ran changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Revoked {
    /// Whether the role had the grant (and lost it).
    pub removed: bool,
    /// What the repair changed, one sentence each (see [`Admin::harden`]).
    pub repairs: Vec<String>,
}

/// The operator's side of a [`Store`] ([`Store::admin`]): what the store reaches, every lease of its cluster, the
/// audit, enforcement, grants and the schema's layout.
#[derive(Debug, Clone, Copy)]
pub struct Admin<'a> {
    pub(crate) store: &'a Store,
}

impl Store {
    /// The operator's side of this store: the database it reaches, every lease, the audit, enforcement, grants
    /// and the layout (see [`Admin`]).
    pub fn admin(&self) -> Admin<'_> {
        Admin { store: self }
    }
}

impl<'a> Admin<'a> {
    /// The cluster that qualifies every lease name of this store.
    pub fn cluster(&self) -> &'a str {
        self.store.cluster()
    }

    /// The database as `user@host:port/database` (no credentials).
    pub fn target(&self) -> &'a str {
        self.store.target()
    }

    /// The endpoint this store was configured with, as a holder reports it with its beliefs: every host and
    /// port, then the database (`db1:5432,db2:5432/control`), without user, password or other parameters.
    /// `None` for a store built [`from_pool`](Store::from_pool), whose connections pgfence does not know, and when
    /// the configured endpoint is no printable text of at most 512 bytes.
    pub fn endpoint(&self) -> Option<&'a str> {
        self.store.endpoint()
    }

    /// The underlying pool, for the application's own queries. A checkout straight from it takes no turn:
    /// [`conn`](Self::conn) does.
    pub fn pool(&self) -> &'a Pool {
        self.store.pool()
    }

    /// Checks a connection out of the pool, first come, first served (see [`PooledConnection`]); waits at most the
    /// checkout timeout in all.
    ///
    /// # Errors
    ///
    /// [`Error::PoolTimeout`] after the checkout timeout, naming what it waited for: every connection
    /// checked out by others the whole time, or the last connection error the pool saw; [`Error::Connect`] when
    /// the pool's attempt to open a connection failed. Both are transient.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the wait (and its place in the queue); no connection is lost.
    pub async fn conn(&self) -> Result<PooledConnection<'a>> {
        self.store.conn().await
    }

    /// Reads the database's identity now (a fresh query, not a cached value).
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors). The read needs no grant: any role that can connect
    /// reads its database's identity (the system identifier is `None` when it may not read it).
    pub async fn identity(&self) -> Result<DatabaseIdentity> {
        self.store.identity().await
    }

    /// Re-reads the identity and checks it against the configured expectation and that the server is a
    /// primary.
    ///
    /// # Errors
    ///
    /// [`Error::NotPrimary`] when the server is in recovery; [`Error::WrongDatabase`] as in
    /// [`DatabaseIdentity::verify`]; the [errors of every database call](crate#errors).
    pub async fn verify_identity(&self) -> Result<DatabaseIdentity> {
        self.store.verify_identity().await
    }

    /// What the database's advisory-lock and role layout lacks, compared with the hardened layout of
    /// docs/security.md; empty when it is that layout. Run as the schema owner (`pgfence._layout_problems()`,
    /// which no other role may execute). [`migrate`](Store::migrate) and the grants check it themselves
    /// (refusing on an [`LayoutSeverity::Error`], logging a warning for the rest); the CLI prints it.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] with SQLSTATE `42501` when the session is not the owner; the [errors of every
    /// database call](crate#errors).
    pub async fn layout_problems(&self) -> Result<Vec<LayoutProblem>> {
        self.store.layout_problems().await
    }
}

impl Admin<'_> {
    /// Repairs the schema `pgfence`, its privileges and its grant rows to what pgfence made
    /// (`pgfence._harden()`, docs/security.md): drops triggers pgfence did not create and every object in the schema
    /// that another role owns (a function planted during a careless `GRANT CREATE ON SCHEMA`, say), revokes every
    /// privilege pgfence did not grant, enables its protective triggers again. Returns what it changed, one
    /// sentence each (the server's WARNINGs say the same; names in them are quoted and stripped of control
    /// characters, but they are another role's text: escape them before a terminal shows them). Empty when
    /// nothing needed repair. Every grant and revoke runs it too; run it as the owner after a migration or on a
    /// schedule.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] with SQLSTATE `42501` when the session is not the owner, `PF003` when a foreign
    /// object's table stayed locked past the lock-wait bound; the [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A statement already sent takes effect even if the future is dropped; repairing again is harmless. See
    /// [cancel safety](crate#cancel-safety).
    pub async fn harden(&self) -> Result<Vec<String>> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.store.conn().await?;
        let repairs: Vec<String> = diesel::select(diesel::dsl::sql::<Array<Text>>(
            "pgfence._harden(NULL::boolean)",
        ))
        .get_result(&mut *conn)
        .await?;
        log_repairs(&repairs);
        Ok(repairs)
    }

    /// Sets raw-SQL enforcement. While on, the database checks raw SQL on its tables as it checks pgfence's own
    /// writes: any INSERT or UPDATE of `pgfence.tasks` whose `fence` is not the lease's current, held, unexpired
    /// epoch, any INSERT into `pgfence.task_events` whose `epoch` is not (or that names another lease than its
    /// task's), and any DELETE, TRUNCATE or lease change of tasks is refused — with SQLSTATE `PF001`
    /// ([`Enforcement::Error`]) or by skipping the row, recording it in `pgfence.rejections` and warning the
    /// client ([`Enforcement::Audit`]). pgfence's own writes satisfy it by construction. Needs the owner or an
    /// operator role.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] with SQLSTATE `42501` without the owner or an every-cluster operator grant, and the
    /// [errors of every database call](crate#errors).
    ///
    /// # Cancel safety
    ///
    /// A statement already sent takes effect even if the future is dropped; setting it again is harmless. See
    /// [cancel safety](crate#cancel-safety).
    pub async fn set_enforcement(&self, enforcement: Enforcement) -> Result<()> {
        use diesel_async::RunQueryDsl;
        let (on, mode) = match enforcement {
            Enforcement::Off => (false, "error"),
            Enforcement::Error => (true, "error"),
            Enforcement::Audit => (true, "audit"),
        };
        let mut conn = self.store.conn().await?;
        diesel::sql_query("SELECT pgfence.set_enforcement($1, $2)")
            .bind::<Bool, _>(on)
            .bind::<Text, _>(mode)
            .execute(&mut *conn)
            .await?;
        tracing::info!(?enforcement, "raw-SQL enforcement switched");
        Ok(())
    }

    /// The raw-SQL enforcement in effect.
    ///
    /// # Errors
    ///
    /// The [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn enforcement(&self) -> Result<Enforcement> {
        use diesel_async::RunQueryDsl;
        let mut conn = self.store.conn().await?;
        let mode: String = diesel::select(diesel::dsl::sql::<Text>("pgfence.enforcement()"))
            .get_result(&mut *conn)
            .await?;
        match mode.as_str() {
            "off" => Ok(Enforcement::Off),
            "error" => Ok(Enforcement::Error),
            "audit" => Ok(Enforcement::Audit),
            other => Err(unexpected("enforcement", other)),
        }
    }

    /// Deletes audit rows last seen more than `older_than` ago (database clock), in batches of at most `batch`
    /// rows, each its own short transaction, so retention never holds long locks. Returns how many it deleted.
    /// Needs the owner or an operator role.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `batch` is not 1 to 1,000,000; [`Error::Database`] with SQLSTATE `42501`
    /// without the owner or an every-cluster operator grant; the [errors of every database call](crate#errors).
    /// Batches deleted before an error stay deleted.
    ///
    /// # Cancel safety
    ///
    /// A dropped prune keeps the batches it deleted (and a batch already sent may still complete); pruning
    /// again is safe. See [cancel safety](crate#cancel-safety).
    pub async fn prune_rejections(
        &self,
        older_than: std::time::Duration,
        batch: u32,
    ) -> Result<u64> {
        use diesel_async::RunQueryDsl;
        if batch == 0 || batch > 1_000_000 {
            return Err(Error::invalid("batch", "must be 1 to 1000000 rows"));
        }
        let seconds = older_than.as_secs_f64();
        let mut total = 0u64;
        loop {
            let mut conn = self.store.conn().await?;
            let deleted: i32 = diesel::select(
                diesel::dsl::sql::<Integer>("pgfence.prune_rejections(")
                    .bind::<diesel::sql_types::Double, _>(seconds)
                    .sql(" * interval '1 second', ")
                    .bind::<Integer, _>(batch as i32)
                    .sql(")"),
            )
            .get_result(&mut *conn)
            .await?;
            total += deleted as u64;
            if (deleted as u32) < batch {
                tracing::info!(deleted = total, ?older_than, "audit pruned");
                return Ok(total);
            }
        }
    }

    /// Grants `role` the application rights on `cluster` (`None`: every cluster): acquire, renew, release and
    /// guarded writes of that cluster's leases, and reading its rows (row-level security hides the others).
    /// The database gives it EXECUTE on the lease and guarded-write functions and SELECT on the tables — no
    /// direct INSERT, UPDATE or DELETE. Run as the owner (the role that migrated). Refused, granting nothing
    /// ([`Error::InvalidInput`], SQLSTATE `22023` from SQL): PUBLIC, pseudo-roles (`current_user`, …),
    /// predefined `pg_*` roles, superusers, BYPASSRLS roles, and the owner and its members.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a refused or malformed `role` or `cluster`: PUBLIC, pseudo-roles, `pg_*` roles
    /// and malformed text before anything is sent, superusers, BYPASSRLS roles and the owner (or its members) by
    /// the database; [`Error::Database`] with SQLSTATE `42704` when no such role exists, `42501` when the session
    /// is not the owner or when the owner may not execute an advisory-lock function pgfence calls (the message
    /// names them and the GRANT to run; nothing was granted); the [errors of every database call](crate#errors).
    /// The rest of [`Admin::layout_problems`] is logged as warnings.
    ///
    /// Returns what the repair every grant runs changed ([`Admin::harden`]); empty when nothing needed it.
    ///
    /// # Cancel safety
    ///
    /// A statement already sent takes effect even if the future is dropped; granting again is harmless. See
    /// [cancel safety](crate#cancel-safety).
    pub async fn grant_application(
        &self,
        role: &str,
        cluster: Option<&str>,
    ) -> Result<Vec<String>> {
        self.grant("grant_application", role, cluster).await
    }

    /// Grants `role` the application rights plus force-release on `cluster`; with `None` (every cluster) also
    /// the instance settings (enforcement, takeover grace) and audit retention.
    ///
    /// # Errors
    ///
    /// As [`grant_application`](Self::grant_application).
    ///
    /// # Cancel safety
    ///
    /// As [`grant_application`](Self::grant_application).
    pub async fn grant_operator(&self, role: &str, cluster: Option<&str>) -> Result<Vec<String>> {
        self.grant("grant_operator", role, cluster).await
    }

    /// Removes `role`'s grant of `cluster` (`None`: its every-cluster grant); once it has none left, also its
    /// privileges on pgfence's objects. Returns whether a grant was removed and what the repair it runs first
    /// changed ([`Admin::harden`]). Refuses the roles
    /// [`grant_application`](Self::grant_application) refuses, revoking nothing: in particular the owner, whose
    /// own privileges a revoke would take (every pgfence call would then fail `42501`).
    ///
    /// # Errors
    ///
    /// As [`grant_application`](Self::grant_application).
    ///
    /// # Cancel safety
    ///
    /// A statement already sent takes effect even if the future is dropped; revoking again is harmless (it then
    /// answers `removed: false`). See [cancel safety](crate#cancel-safety).
    pub async fn revoke(&self, role: &str, cluster: Option<&str>) -> Result<Revoked> {
        use diesel_async::RunQueryDsl;
        check_role(role)?;
        if let Some(cluster) = cluster {
            crate::validate::validate_cluster(cluster)?;
        }
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = Integer)]
            removed: i32,
            #[diesel(sql_type = Array<Text>)]
            repairs: Vec<String>,
        }
        let mut conn = self.store.conn().await?;
        let row: Row = diesel::sql_query("SELECT removed, repairs FROM pgfence.revoke($1, $2)")
            .bind::<Text, _>(role)
            .bind::<Nullable<Text>, _>(cluster)
            .get_result(&mut *conn)
            .await?;
        log_repairs(&row.repairs);
        tracing::info!(
            role,
            cluster = cluster.unwrap_or("*"),
            removed = row.removed,
            "grant revoked"
        );
        Ok(Revoked {
            removed: row.removed > 0,
            repairs: row.repairs,
        })
    }

    async fn grant(
        &self,
        function: &str,
        role: &str,
        cluster: Option<&str>,
    ) -> Result<Vec<String>> {
        use diesel_async::RunQueryDsl;
        check_role(role)?;
        if let Some(cluster) = cluster {
            crate::validate::validate_cluster(cluster)?;
        }
        // The layout first: a grant is of no use while the owner may not take the guard lock (nothing is
        // changed then), and the rest is worth a warning.
        for problem in self.store.layout_problems().await? {
            if problem.severity == LayoutSeverity::Error {
                return Err(Error::Database {
                    sqlstate: Some(SqlState::InsufficientPrivilege),
                    message: format!(
                        "pgfence: refusing to grant: {}. To fix: {}",
                        problem.problem, problem.fix
                    ),
                    source: None,
                });
            }
            tracing::warn!(problem = %problem.problem, fix = %problem.fix,
                "the database's role layout leaves a gap (docs/security.md)");
        }
        let mut conn = self.store.conn().await?;
        let repairs: Vec<String> = diesel::select(
            diesel::dsl::sql::<Array<Text>>(&format!("pgfence.{function}("))
                .bind::<Text, _>(role)
                .sql(", ")
                .bind::<Nullable<Text>, _>(cluster)
                .sql(")"),
        )
        .get_result(&mut *conn)
        .await?;
        log_repairs(&repairs);
        tracing::info!(
            role,
            cluster = cluster.unwrap_or("*"),
            function,
            "grant recorded"
        );
        Ok(repairs)
    }
}

impl Admin<'_> {
    /// Rejections of this store's cluster (or as `filter` says), newest first.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed lease name or a limit under 1, and the
    /// [errors of every database call](crate#errors). Dropping the future is safe: it only reads
    /// ([cancel safety](crate#cancel-safety)).
    pub async fn rejections(&self, filter: &RejectionFilter) -> Result<Vec<Rejection>> {
        use diesel_async::RunQueryDsl;
        let pattern = match &filter.lease {
            _ if filter.all_clusters => String::new(),
            Some(name) => {
                crate::validate::validate_name(name)?;
                self.store.qualify(name)
            }
            None => format!("{}/", self.store.cluster()),
        };
        let limit = filter.limit.unwrap_or(100);
        if limit < 1 {
            return Err(Error::invalid("limit", "must be at least 1"));
        }
        let mut conn = self.store.conn().await?;
        let rows = diesel::sql_query(format!(
            "SELECT {REJECTION_COLUMNS} FROM pgfence.rejections \
              WHERE (CASE WHEN $4 THEN lease = $1 ELSE starts_with(lease, $1) END) \
                AND ($2::timestamptz IS NULL OR last_rejected_at >= $2) \
              ORDER BY last_rejected_at DESC, id DESC LIMIT $3"
        ))
        .bind::<Text, _>(pattern)
        .bind::<Nullable<Timestamptz>, _>(filter.since)
        .bind::<BigInt, _>(limit)
        .bind::<Bool, _>(filter.lease.is_some() && !filter.all_clusters)
        .load(&mut *conn)
        .await?;
        Ok(rows)
    }
}

/// Logs what `_harden` repaired, one warning each.
fn log_repairs(repairs: &[String]) {
    for repair in repairs {
        tracing::warn!(repair = %repair, "pgfence repaired the schema (docs/security.md)");
    }
}

/// Roles a grant refuses before asking the database (which refuses them too): PUBLIC and the pseudo-roles stand
/// for many roles, and predefined `pg_*` roles are held by roles nobody listed.
fn check_role(role: &str) -> Result<()> {
    validate_holder("role", role)?;
    if role.chars().count() > 63 {
        return Err(Error::invalid("role", "must be at most 63 characters"));
    }
    let lower = role.to_lowercase();
    if matches!(
        lower.as_str(),
        "public" | "current_user" | "current_role" | "session_user" | "user" | "none"
    ) || role.starts_with("pg_")
    {
        return Err(Error::invalid(
            "role",
            "PUBLIC, pseudo-roles and predefined pg_* roles stand for many roles: grant to a role of the \
             application",
        ));
    }
    Ok(())
}
