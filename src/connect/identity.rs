//! The identity of the database a connection reached: what it is ([`DatabaseIdentity`]), what the store
//! expects of it ([`ExpectedIdentity`]), and the check every new connection of a store passes before it is used
//! ([`ConnectSettings::open_checked`]): a primary, and the database the store was configured for.

use std::sync::Arc;
use std::time::Duration;

use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::AsyncPgConnection;

use super::{Connector, Kind};
use crate::error::{Error, Result};

/// What the store expects the database to be. Every field left `None` is not checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedIdentity {
    /// The server's system identifier (`pg_control_system()`), which differs between clusters created by
    /// separate `initdb` runs (a physical replica shares it with its primary).
    pub system_identifier: Option<String>,
    /// The pgfence instance id created at migrate time (`pgfence.instance`).
    pub instance_id: Option<String>,
    /// The database name.
    pub database: Option<String>,
}

/// The identity of the database a store talks to, as reported by the server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct DatabaseIdentity {
    /// The server's system identifier; `None` when the role may not read `pg_control_system()` and the
    /// schema's SECURITY DEFINER helper is not installed yet.
    pub system_identifier: Option<String>,
    /// The current database name.
    pub database: String,
    /// The pgfence instance id created at migrate time; `None` before the first migration.
    pub instance_id: Option<String>,
    /// Whether the server is a standby (`pg_is_in_recovery()`).
    pub in_recovery: bool,
    /// The WAL timeline of the last checkpoint, when readable.
    pub timeline: Option<i64>,
    /// The server version string.
    pub server_version: String,
}

impl DatabaseIdentity {
    /// Compares this identity with what was expected; the first difference is a [`Error::WrongDatabase`].
    ///
    /// # Errors
    ///
    /// [`Error::WrongDatabase`] naming the first field that differs (database, system identifier, instance id, in that order),
    /// with both values. A field the expectation leaves `None` is not compared.
    pub fn verify(&self, expected: &ExpectedIdentity) -> Result<()> {
        fn check(
            what: &'static str,
            expected: &Option<String>,
            actual: &Option<String>,
        ) -> Result<()> {
            match expected {
                Some(want) if Some(want) != actual.as_ref() => Err(Error::WrongDatabase {
                    what,
                    expected: want.clone(),
                    actual: actual.clone().unwrap_or_else(|| "none".to_owned()),
                }),
                _ => Ok(()),
            }
        }
        check("database", &expected.database, &Some(self.database.clone()))?;
        check(
            "system identifier",
            &expected.system_identifier,
            &self.system_identifier,
        )?;
        check("instance id", &expected.instance_id, &self.instance_id)
    }
}

/// A store's way to its database: the connector, and the identity every connection it opens must show.
#[derive(Clone)]
pub(crate) struct ConnectSettings {
    pub(crate) connector: Arc<Connector>,
    pub(crate) target: String,
    pub(crate) expected: ExpectedIdentity,
    /// The host the latest connection checked through these settings reached (shared by every clone: the
    /// pool's setup is one), for the cancel requests of pooled connections.
    reached: Arc<std::sync::Mutex<Option<Arc<Connector>>>>,
}

impl ConnectSettings {
    /// Settings for the direct URL (its connector built by the same [`StoreConfig`]); its connections must
    /// reach the server and database `seen` through the pooler (and whatever else is expected).
    pub(crate) fn for_direct_url(
        &self,
        mut connector: Connector,
        application_name: &str,
        seen: &DatabaseIdentity,
    ) -> ConnectSettings {
        let config = connector.config_mut();
        if config.get_application_name().is_none() {
            config.application_name(application_name);
        }
        if let (None, Some(timeout)) = (
            config.get_connect_timeout().copied(),
            self.connector.config().get_connect_timeout().copied(),
        ) {
            config.connect_timeout(timeout);
        }
        let expected = ExpectedIdentity {
            system_identifier: (self.expected.system_identifier.clone())
                .or_else(|| seen.system_identifier.clone()),
            instance_id: (self.expected.instance_id.clone()).or_else(|| seen.instance_id.clone()),
            database: Some(seen.database.clone()),
        };
        ConnectSettings::new(connector, expected)
    }

    /// Settings for `connector`, whose connections must show `expected`.
    pub(crate) fn new(connector: Connector, expected: ExpectedIdentity) -> ConnectSettings {
        ConnectSettings {
            target: connector.target().to_owned(),
            connector: Arc::new(connector),
            expected,
            reached: Arc::default(),
        }
    }

    /// Opens a connection of `kind` (through [`Connector::open`], the hosts in order), not checked.
    pub(crate) async fn open(&self, kind: Kind) -> Result<AsyncPgConnection> {
        self.connector.open(kind).await.map(|(conn, _)| conn)
    }

    /// Where to send the cancel request of a statement on a pooled connection: the host the newest checked
    /// connection reached. A pooled connection does not carry its host, but each was checked to be the primary
    /// when it was opened, so they differ only across a failover — and then the newest host is the one whose
    /// statements matter (before any connection, the connection string's first host).
    pub(crate) fn pooled_host(&self) -> Arc<Connector> {
        self.reached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| self.connector.clone())
    }

    /// Opens a connection and reads the identity, both within the connect timeout; returns them with the
    /// connector of the host it reached (the one its cancel requests go to).
    pub(crate) async fn open_checked(
        &self,
        kind: Kind,
    ) -> Result<(AsyncPgConnection, DatabaseIdentity, Arc<Connector>)> {
        let limit = self
            .connector
            .config()
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(5));
        let (mut conn, host) = self.connector.open(kind).await?;
        let reached = host.target().to_owned();
        let started = tokio::time::Instant::now();
        let identity = tokio::time::timeout_at(started + limit, read_identity(&mut conn))
            .await
            .map_err(|_| Error::Connect {
                target: reached.clone(),
                cause: format!(
                    "the server did not answer the identity query within {limit:?} of connecting"
                ),
            })??;
        if identity.in_recovery {
            return Err(Error::NotPrimary { target: reached });
        }
        identity.verify(&self.expected)?;
        let host = Arc::new(host);
        *self
            .reached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(host.clone());
        Ok((conn, identity, host))
    }
}

#[derive(QueryableByName)]
struct IdentityRow {
    #[diesel(sql_type = Nullable<Text>)]
    system_identifier: Option<String>,
    #[diesel(sql_type = Text)]
    database: String,
    #[diesel(sql_type = Nullable<Text>)]
    instance_id: Option<String>,
    #[diesel(sql_type = Bool)]
    in_recovery: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    timeline: Option<i64>,
    #[diesel(sql_type = Text)]
    server_version: String,
}

/// Reads the identity through `pgfence.identity()` when the schema is installed, or directly (as far as the
/// role's privileges allow) before the first migration.
pub(crate) async fn read_identity(conn: &mut AsyncPgConnection) -> Result<DatabaseIdentity> {
    use diesel_async::RunQueryDsl;
    let installed: bool = diesel::select(diesel::dsl::sql::<Bool>(
        "to_regprocedure('pgfence.identity()') IS NOT NULL",
    ))
    .get_result(conn)
    .await?;
    let row: IdentityRow = if installed {
        diesel::sql_query(
            "SELECT system_identifier, database, instance_id, in_recovery, timeline, server_version \
             FROM pgfence.identity()",
        )
        .get_result(conn)
        .await?
    } else {
        diesel::sql_query(
            "SELECT CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE') \
                    THEN (SELECT system_identifier::text FROM pg_control_system()) END AS system_identifier, \
                    current_database()::text AS database, NULL::text AS instance_id, \
                    pg_is_in_recovery() AS in_recovery, NULL::bigint AS timeline, \
                    current_setting('server_version') AS server_version",
        )
        .get_result(conn)
        .await?
    };
    Ok(DatabaseIdentity {
        system_identifier: row.system_identifier,
        database: row.database,
        instance_id: row.instance_id,
        in_recovery: row.in_recovery,
        timeline: row.timeline,
        server_version: row.server_version,
    })
}
