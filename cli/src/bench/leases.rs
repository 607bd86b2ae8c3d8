//! The lease workloads (`acquire`, `renew`): a scratch database per lease-table size, filled through the public
//! SQL function, and their interleaved rounds at each concurrency.

use std::collections::HashMap;
use std::time::Duration;

use pgfence::{Fence, Store, TenureSecret};

use super::plan::Plan;
use super::progress::Progress;
use super::report::{Collector, Key, Round};
use super::server::{connect_admin, delta, store_config, Server};
use super::timed::timed;
use super::workload::{Workload, Writer, HOLDER, TTL};
use super::{db_error, Failure, Global};

/// One database per lease-table size, each with `rows` leases held by the benchmark.
pub(super) struct LeaseTable {
    pub(super) rows: u32,
    store: Store,
    pub(super) url: String,
}

pub(super) async fn setup_leases(
    server: &mut Server,
    plan: &Plan,
    global: &Global,
    progress: &Progress,
) -> Result<Vec<LeaseTable>, Failure> {
    let mut tables = Vec::new();
    for &rows in &plan.lease_rows {
        progress.phase(&format!("creating a lease table of {rows} rows"));
        let db = server.create_database(&format!("_leases_{rows}")).await?;
        let url = server.url_for(&db);
        let store = Store::connect(store_config(&url, plan, global)).await?;
        store.migrate().await?;
        let admin = connect_admin(&url).await?;
        // Through the public SQL function, so the rows are exactly what acquisitions create; 1,000 per transaction,
        // since every acquisition holds its lease's guard lock (a lock table entry) until its transaction ends.
        for first in (1..=rows as i32).step_by(1000) {
            let last = (first + 999).min(rows as i32);
            admin
                .execute(
                    "SELECT count(*) FROM generate_series($1::int, $2::int) g, \
                       LATERAL pgfence.acquire('bench/l' || g, $3, $4) a",
                    &[&first, &last, &HOLDER, &(TTL.as_millis() as i64)],
                )
                .await
                .map_err(|e| db_error("creating leases", e))?;
        }
        admin
            .batch_execute("VACUUM ANALYZE pgfence.leases, pgfence.tenures")
            .await
            .map_err(|e| db_error("VACUUM", e))?;
        tables.push(LeaseTable { rows, store, url });
    }
    Ok(tables)
}

pub(super) async fn measure_leases(
    server: &Server,
    plan: &Plan,
    tables: &[LeaseTable],
    collector: &mut Collector,
    progress: &Progress,
) -> Result<(), Failure> {
    let slots = plan.lease_slots();
    let warmup = plan.duration.min(Duration::from_millis(100));
    let table = |rows: u32| {
        tables
            .iter()
            .find(|t| t.rows == rows)
            .expect("a table for every size")
    };
    for &c in &plan.concurrency {
        progress.phase(&format!("leases with {c} concurrent writers"));
        let mut writers: HashMap<(Workload, u32), Vec<Writer>> = HashMap::new();
        for &(w, rows) in &slots {
            let t = table(rows);
            // Lease workloads never write with it (renew writers get their own lease each round).
            let placeholder = TenureSecret::parse("0".repeat(pgfence::limits::SECRET_LEN))?;
            let fence = Fence::new("bench/l1", pgfence::Epoch::new(1)?, placeholder)?;
            let list: Vec<Writer> = (0..c as usize)
                .map(|i| Writer::new(w, i, 1, t.store.clone(), fence.clone(), None, rows))
                .collect();
            let list = prepare_renewals(w, list, t).await?;
            let (list, ..) = timed(list, warmup).await?;
            writers.insert((w, rows), list);
        }
        for round in 1..=plan.rounds {
            for &(w, rows) in &slots {
                progress.step(format!(
                    "c={c} {} on {rows} leases round {round}/{}",
                    w.name(),
                    plan.rounds
                ));
                let list = writers.remove(&(w, rows)).expect("writers for every slot");
                let list = prepare_renewals(w, list, table(rows)).await?;
                let before = server.counters().await?;
                let (list, steps, seconds, latency) = timed(list, plan.duration).await?;
                let (multixacts, xids) = delta(before, server.counters().await?);
                writers.insert((w, rows), list);
                collector.add(
                    Key {
                        workload: w,
                        concurrency: c,
                        batch: 1,
                        lease_rows: Some(rows),
                    },
                    Round {
                        transactions: steps,
                        seconds,
                        tx_per_s: steps as f64 / seconds,
                        multixacts,
                        xids,
                    },
                    &latency,
                );
            }
        }
    }
    Ok(())
}

/// Renew writers hold a current lease at the start of each round (acquisitions in other rounds take new
/// epochs): writer i renews lease 1 + i·rows/c, shared when there are fewer leases than writers.
async fn prepare_renewals(
    w: Workload,
    mut writers: Vec<Writer>,
    table: &LeaseTable,
) -> Result<Vec<Writer>, Failure> {
    if w != Workload::Renew {
        return Ok(writers);
    }
    let c = writers.len() as u64;
    let mut taken: HashMap<u64, pgfence::Lease> = HashMap::new();
    for (i, writer) in writers.iter_mut().enumerate() {
        let n = 1 + (i as u64 * u64::from(table.rows) / c);
        let lease = match taken.get(&n) {
            Some(lease) => lease.clone(),
            None => {
                let lease = table.store.acquire(&format!("l{n}"), HOLDER, TTL).await?;
                taken.insert(n, lease.clone());
                lease
            }
        };
        writer.set_lease(lease);
    }
    Ok(writers)
}
