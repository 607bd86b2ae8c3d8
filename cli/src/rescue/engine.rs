//! The workload engine of the rescue story and its fault test: a real external system that the fence does **not**
//! cover — a second PostgreSQL database on the same server, reached over its own connection — which applies each
//! effect once per idempotency key and can be asked about a key. Its `applied` table is the ground truth the
//! verdict judges the ledger against.
//!
//! - `apply`: the effect applied now, deduplicated by key (a second delivery of a key counts in `deliveries` and
//!   changes nothing else); the caller gets the reply — or, with a lost reply, does not.
//! - `send_late`: the request is in transit and lands `delay` later (`deliver_due`, run by the story's driver),
//!   after the caller gave up waiting: an effect applied late, possibly after a successor asked about the key.
//! - `inquire`: what the engine knows of a key (a request still in transit is not known: it has not arrived).

use std::time::Duration;

use tokio_postgres::Client;

/// The engine's tables, created by [`Engine::install`].
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS applied (
    key        text PRIMARY KEY,
    task       text NOT NULL,
    payload    jsonb NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    deliveries integer NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS inbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        text NOT NULL,
    task       text NOT NULL,
    payload    jsonb NOT NULL,
    deliver_at timestamptz NOT NULL
);";

/// A connection to the engine.
pub(crate) struct Engine {
    client: Client,
}

/// What the engine knows of a key.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Applied {
    pub(crate) key: String,
    pub(crate) task: String,
    pub(crate) deliveries: i32,
}

impl Engine {
    /// Connects to the engine's database (`url`: TLS, hosts and timeouts as every pgfence connection reads them).
    pub(crate) async fn connect(url: &str) -> Result<Engine, String> {
        Ok(Engine {
            client: client(url).await?,
        })
    }

    /// Creates the engine's tables (idempotent).
    pub(crate) async fn install(&self) -> Result<(), String> {
        self.client
            .batch_execute(SCHEMA)
            .await
            .map_err(|e| format!("cannot create the engine's tables: {}", describe(&e)))
    }

    /// Applies the effect `key` of `task` now (once per key: a repeat is counted, not applied again) and answers
    /// how many times the key has been delivered.
    pub(crate) async fn apply(
        &self,
        key: &str,
        task: &str,
        payload: &serde_json::Value,
    ) -> Result<i32, String> {
        let row = self
            .client
            .query_one(
                "INSERT INTO applied (key, task, payload) VALUES ($1, $2, $3) \
                 ON CONFLICT (key) DO UPDATE SET deliveries = applied.deliveries + 1 \
                 RETURNING deliveries",
                &[&key, &task, payload],
            )
            .await
            .map_err(|e| format!("the engine failed to apply {key}: {}", describe(&e)))?;
        Ok(row.get(0))
    }

    /// Sends the effect `key` of `task` to arrive `delay` from now (its reply never reaches the sender).
    pub(crate) async fn send_late(
        &self,
        key: &str,
        task: &str,
        payload: &serde_json::Value,
        delay: Duration,
    ) -> Result<(), String> {
        let ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        self.client
            .execute(
                "INSERT INTO inbox (key, task, payload, deliver_at) \
                 VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond')",
                &[&key, &task, payload, &ms],
            )
            .await
            .map_err(|e| format!("the engine refused a request for {key}: {}", describe(&e)))?;
        Ok(())
    }

    /// Delivers the requests in transit that are due (each key once per call; repeats counted); answers how
    /// many arrived. `all`: every request in transit, due or not (the end of a run).
    pub(crate) async fn deliver_due(&self, all: bool) -> Result<u64, String> {
        self.client
            .execute(
                "WITH due AS (DELETE FROM inbox WHERE $1 OR deliver_at <= clock_timestamp() \
                               RETURNING key, task, payload), \
                      per_key AS (SELECT key, min(task) AS task, (array_agg(payload))[1] AS payload, \
                                         count(*)::integer AS n FROM due GROUP BY key) \
                 INSERT INTO applied (key, task, payload, deliveries) SELECT key, task, payload, n FROM per_key \
                 ON CONFLICT (key) DO UPDATE SET deliveries = applied.deliveries + EXCLUDED.deliveries",
                &[&all],
            )
            .await
            .map_err(|e| format!("the engine failed to deliver: {}", describe(&e)))
    }

    /// What the engine knows of `key`: applied (and how often delivered), or nothing.
    pub(crate) async fn inquire(&self, key: &str) -> Result<Option<Applied>, String> {
        let row = self
            .client
            .query_opt(
                "SELECT key, task, deliveries FROM applied WHERE key = $1",
                &[&key],
            )
            .await
            .map_err(|e| format!("cannot ask the engine about {key}: {}", describe(&e)))?;
        Ok(row.map(|r| Applied {
            key: r.get(0),
            task: r.get(1),
            deliveries: r.get(2),
        }))
    }

    /// Every key the engine applied, for the verdict.
    pub(crate) async fn all_applied(&self) -> Result<Vec<Applied>, String> {
        let rows = self
            .client
            .query(
                "SELECT key, task, deliveries FROM applied ORDER BY key",
                &[],
            )
            .await
            .map_err(|e| format!("cannot read the engine: {}", describe(&e)))?;
        Ok(rows
            .into_iter()
            .map(|r| Applied {
                key: r.get(0),
                task: r.get(1),
                deliveries: r.get(2),
            })
            .collect())
    }
}

/// A plain client of `url` (the engine's database, or the story's reads for its verdict), driven in the
/// background until dropped.
pub(crate) async fn client(url: &str) -> Result<Client, String> {
    let connector = pgfence::connection::Connector::new(url).map_err(|e| e.to_string())?;
    let (client, connection) = connector
        .connect()
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    tokio::spawn(async move {
        // The connection ends with the client; its error is the next call's.
        let _ = connection.await;
    });
    Ok(client)
}

/// A driver error with the server's message (tokio-postgres's own text says only "db error").
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}
