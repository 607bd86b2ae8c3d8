//! The renewal cost: many leases held by one elector, and the statements the server runs for their renewal
//! per tick (counted by pg_stat_statements, or by transaction ids without it).

use std::time::Duration;

use pgfence::leader::{Elector, LeaseOptions, PgElector};
use pgfence::{Store, StoreConfig};

use super::leases::LeaseTable;
use super::report::RenewalCost;
use super::server::connect_admin;
use super::{db_error, Failure, Global};

const RENEW_EVERY: Duration = Duration::from_millis(200);
const RENEWAL_TICKS: u32 = 10;

async fn next_xid(client: &tokio_postgres::Client) -> Result<u64, Failure> {
    client
        .query_one(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint",
            &[],
        )
        .await
        .map(|r| r.get::<_, i64>(0) as u64)
        .map_err(|e| db_error("reading the xid counter", e))
}

/// Holds `leases` leases in one [`PgElector`] and counts what the server runs for their renewal.
pub(super) async fn measure_renewal(
    table: &LeaseTable,
    leases: u32,
    global: &Global,
) -> Result<RenewalCost, Failure> {
    let admin = connect_admin(&table.url).await?;
    let pgss = admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .is_ok()
        && admin
            .query("SELECT 1 FROM pg_stat_statements LIMIT 1", &[])
            .await
            .is_ok();
    let store = Store::connect(
        StoreConfig::new(&table.url, "bench")
            .pool_size(4)
            .connect_timeout(global.connect_timeout)
            .application_name("pgfence-bench-elector"),
    )
    .await?;
    let elector = PgElector::new(store);
    let mut options = LeaseOptions::new(Duration::from_secs(30));
    options.renew_every = RENEW_EVERY;
    let mut held = Vec::new();
    for i in 0..leases {
        held.push(
            elector
                .acquire(&format!("tick-{i}"), "bench-elector", &options)
                .await?,
        );
    }
    // Let the renewal group settle on its tick before counting.
    tokio::time::sleep(RENEW_EVERY * 2).await;
    let window = RENEW_EVERY * RENEWAL_TICKS;
    let counted = if pgss {
        admin
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await
            .map_err(|e| db_error("pg_stat_statements_reset", e))?;
        tokio::time::sleep(window).await;
        let rows = admin
            .query(
                "SELECT query, calls::bigint, rows::bigint, total_exec_time FROM pg_stat_statements \
                  WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                    AND query NOT ILIKE '%pg_stat_statements%' ORDER BY calls DESC",
                &[],
            )
            .await
            .map_err(|e| db_error("reading pg_stat_statements", e))?;
        let mut by_statement = Vec::new();
        let (mut statements, mut ticks, mut renewed, mut ms) = (0u64, 0u64, 0u64, 0f64);
        for row in rows {
            let query: String = row.get(0);
            let calls = row.get::<_, i64>(1) as u64;
            statements += calls;
            if query.contains("renew_many") {
                ticks += calls;
                renewed += row.get::<_, i64>(2) as u64;
                ms += row.get::<_, f64>(3);
            }
            by_statement.push((query, calls));
        }
        (
            ticks,
            statements,
            renewed as f64 / ticks.max(1) as f64,
            (ticks > 0).then(|| ms / ticks as f64),
            "pg_stat_statements",
            by_statement,
        )
    } else {
        let before = next_xid(&admin).await?;
        tokio::time::sleep(window).await;
        let statements = next_xid(&admin).await? - before;
        (
            u64::from(RENEWAL_TICKS),
            statements,
            f64::from(leases),
            None,
            "xids",
            Vec::new(),
        )
    };
    for lease in held {
        let _ = lease.release().await;
    }
    let (ticks, statements, renewed, server_ms, counted_by, by_statement) = counted;
    Ok(RenewalCost {
        leases,
        lease_rows: table.rows + leases,
        renew_every_ms: RENEW_EVERY.as_millis() as u64,
        window_s: window.as_secs_f64(),
        ticks,
        statements,
        statements_per_tick: statements as f64 / ticks.max(1) as f64,
        leases_renewed_per_tick: renewed,
        server_ms_per_tick: server_ms,
        counted_by,
        by_statement,
    })
}
