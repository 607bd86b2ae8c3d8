//! The raw path's client: one tokio-postgres connection per writer with every statement of the raw workloads
//! prepared once, and the statements whose server time the benchmark probes.

use pgfence::Fence;
use serde_json::json;
use tokio_postgres::types::Json;
use tokio_postgres::Statement;

use super::super::{db_error, Failure};
use super::{append_key, sql, OPERATION};

/// The statements [`RawClient::probe`] runs: a label and how `pg_stat_statements` shows the statement's start.
pub(in super::super) const PROBES: [(&str, &str); 6] = [
    (
        "guard alone: SELECT * FROM pgfence.fence(..)",
        "SELECT * FROM pgfence.fence(",
    ),
    ("UPDATE of 1 row, unguarded", "UPDATE pgfence_bench.rows"),
    (
        "guard + UPDATE of 1 row in one statement (Store::guarded_write)",
        "WITH RECURSIVE pgfence_write AS (UPDATE pgfence_bench.rows",
    ),
    (
        "the floor of a plpgsql guard (lock + fresh read) + UPDATE of 1 row",
        "WITH g AS (SELECT pgfence_bench.fence_advisory(",
    ),
    (
        "SELECT * FROM pgfence.append_event(..)",
        "SELECT * FROM pgfence.append_event(",
    ),
    (
        "append-unguarded: the same writes without the guard",
        "SELECT * FROM pgfence_bench.append_event_unguarded(",
    ),
];

/// One tokio-postgres connection with every statement of the raw workloads prepared once.
pub(in super::super) struct RawClient {
    pub(super) client: tokio_postgres::Client,
    pub(super) begin: Statement,
    pub(super) commit: Statement,
    pub(super) fence: Statement,
    pub(super) update: Statement,
    pub(super) guarded_update: Statement,
    /// The native guard's statement, when the server has pgfence_native.
    pub(super) guarded_update_native: Option<Statement>,
    pub(super) advisory_update: Statement,
    pub(super) append: Statement,
    pub(super) append_unguarded: Statement,
}

impl RawClient {
    pub(in super::super) fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Runs each statement of [`PROBES`] `iterations` times, interleaved, one at a time, as writer 0.
    pub(in super::super) async fn probe(
        &self,
        fence: &Fence,
        iterations: u32,
    ) -> Result<(), Failure> {
        let (lease, epoch) = (fence.lease().to_owned(), fence.epoch().get());
        let secret = fence.secret().expose_secret().to_owned();
        let (lo, hi) = (0i64, 1i64);
        let key = append_key(0);
        let payload = Json(json!({}));
        let c = &self.client;
        let err = |e| db_error("probing server time", e);
        for _ in 0..iterations {
            c.query_one(&self.fence, &[&lease, &epoch, &secret, &OPERATION])
                .await
                .map_err(err)?;
            c.execute(&self.update, &[&lo, &hi]).await.map_err(err)?;
            c.query_one(
                &self.guarded_update,
                &[&lo, &hi, &lease, &epoch, &secret, &OPERATION],
            )
            .await
            .map_err(err)?;
            c.query_one(&self.advisory_update, &[&lo, &hi, &lease, &epoch])
                .await
                .map_err(err)?;
            c.query_one(
                &self.append,
                &[&lease, &epoch, &key, &OPERATION, &payload, &secret],
            )
            .await
            .map_err(err)?;
            {
                let statement = &self.append_unguarded;
                c.query_one(statement, &[&lease, &epoch, &key, &OPERATION, &payload])
                    .await
                    .map_err(err)?;
            }
        }
        Ok(())
    }

    pub(in super::super) async fn connect(
        connector: &pgfence::connection::Connector,
    ) -> Result<RawClient, Failure> {
        let (client, connection) = connector.connect().await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(target: "pgfence", error = %e, "raw benchmark connection ended");
            }
        });
        let prepare = |sql: &'static str| {
            let client = &client;
            async move {
                client
                    .prepare(sql)
                    .await
                    .map_err(|e| db_error(&format!("preparing {sql}"), e))
            }
        };
        Ok(RawClient {
            begin: prepare(sql::BEGIN).await?,
            commit: prepare(sql::COMMIT).await?,
            fence: prepare(sql::FENCE).await?,
            update: prepare(sql::UPDATE).await?,
            guarded_update: client
                .prepare(&pgfence::guard::guarded_write_sql(
                    sql::GATED_UPDATE,
                    2,
                    false,
                ))
                .await
                .map_err(|e| db_error("preparing the guarded UPDATE", e))?,
            guarded_update_native: client
                .prepare(&pgfence::guard::guarded_write_sql(
                    sql::GATED_UPDATE,
                    2,
                    true,
                ))
                .await
                .ok(),
            advisory_update: prepare(sql::ADVISORY_UPDATE).await?,
            append: prepare(sql::APPEND).await?,
            append_unguarded: prepare(sql::APPEND_UNGUARDED).await?,
            client,
        })
    }
}
