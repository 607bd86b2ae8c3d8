//! Administration of a pgfence database: the raw-SQL enforcement switch ([`Enforcement`]), retention of the
//! audit ([`Store::prune_rejections`]), and the grants that let roles use a cluster ([`Store::grant_application`],
//! [`Store::grant_operator`], [`Store::revoke`]). Each needs the schema owner or an operator role.
//!
//! SQL: the enforcement and `pgfence.prune_rejections` in `migrations/2026-11-30-000003_guard/up.sql`;
//! `pgfence.grant_application`, `pgfence.grant_operator` and `pgfence.revoke` in
//! `migrations/2026-11-30-000006_roles/up.sql`.

use diesel::sql_types::{Array, Bool, Integer, Nullable, Text};
use serde::{Deserialize, Serialize};

use crate::connect::sqlstate::INSUFFICIENT_PRIVILEGE;
use crate::error::{Error, Result};
use crate::reply::unexpected;
use crate::store::migrate::LayoutSeverity;
use crate::store::Store;
use crate::validate::validate_holder;

/// Raw-SQL enforcement on pgfence's task tables (see [`Store::set_enforcement`]).
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

/// What [`Store::revoke`] did: whether a grant was removed, and what the repair it ran changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Revoked {
    /// Whether the role had the grant (and lost it).
    pub removed: bool,
    /// What the repair changed, one sentence each (see [`Store::harden`]).
    pub repairs: Vec<String>,
}

impl Store {
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
        let mut conn = self.conn().await?;
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
        let mut conn = self.conn().await?;
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
        let mut conn = self.conn().await?;
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
            let mut conn = self.conn().await?;
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
    /// The rest of [`Store::layout_problems`] is logged as warnings.
    ///
    /// Returns what the repair every grant runs changed ([`Store::harden`]); empty when nothing needed it.
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
    /// changed ([`Store::harden`]). Refuses the roles
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
        let mut conn = self.conn().await?;
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
        for problem in self.layout_problems().await? {
            if problem.severity == LayoutSeverity::Error {
                return Err(Error::Database {
                    sqlstate: Some(INSUFFICIENT_PRIVILEGE.to_owned()),
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
        let mut conn = self.conn().await?;
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
