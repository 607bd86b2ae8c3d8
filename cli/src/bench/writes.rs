//! The write workloads: their database (the user table, the hot lease, each writer's tasks and own lease), their
//! interleaved rounds at each concurrency, and the server time of the guarded statements and their twins.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pgfence::tasks::TaskState;
use pgfence::{Fence, Store};
use serde_json::json;

use super::pgbench::Pgbench;
use super::plan::Plan;
use super::progress::Progress;
use super::report::{Collector, Key, Round, ServerCost};
use super::server::{connect_admin, delta, raw_config, store_config, Server};
use super::timed::timed;
use super::workload::{self, RawClient, Workload, Writer, HOLDER, HOT_LEASE, TTL, ZOMBIE_ROW};
use super::{db_error, Failure, Global};

/// The write workloads' database: the user table, the hot lease, every writer's tasks and own lease.
pub(super) struct WriteSetup {
    /// Through the portable guard (pgfence.fence).
    pub(super) store: Store,
    /// Through the native guard (pgfence_native.fence), when the server has the extension.
    pub(super) native: Option<Store>,
    /// The same database through a pool that tests each connection at check-out (`update-ping`).
    pinging: Store,
    pub(super) url: String,
    pub(super) hot: Fence,
    own: Vec<Fence>,
}

pub(super) async fn setup_writes(
    server: &mut Server,
    plan: &Plan,
    global: &Global,
) -> Result<WriteSetup, Failure> {
    let db = server.create_database("").await?;
    let url = server.url_for(&db);
    let store = Store::connect(store_config(&url, plan, global).native_guard(false)).await?;
    store.migrate().await?;
    let pinging = Store::connect(
        store_config(&url, plan, global)
            .ping_on_checkout(true)
            .native_guard(false),
    )
    .await?;
    let admin = connect_admin(&url).await?;
    // The native guard's workloads, when the server has the extension (native/: make -C native install).
    let native = if plan.writes.iter().any(|w| w.native()) {
        match admin
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pgfence_native")
            .await
        {
            Ok(()) => {
                let native = Store::connect(store_config(&url, plan, global)).await?;
                if !native.native_guard().await? {
                    return Err(Failure::new(
                        1,
                        "the pgfence_native extension was created but the store does not use it (another version?)",
                    ));
                }
                Some(native)
            }
            Err(e) => {
                eprintln!(
                    "pgfence bench: no native guard on this server ({}); its workloads are skipped \
                     (make -C native install)",
                    db_error("CREATE EXTENSION pgfence_native", e).message
                );
                None
            }
        }
    } else {
        None
    };
    // For the server-time probe; absent when the server does not preload the library.
    let _ = admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await;
    admin
        .batch_execute(&workload::schema_sql(i64::from(
            (plan.max_concurrency() * plan.max_batch()).max(ZOMBIE_ROW as u32 + 1),
        )))
        .await
        .map_err(|e| db_error("creating the benchmark schema", e))?;
    let hot = store.acquire(HOT_LEASE, HOLDER, TTL).await?.fence();
    let mut own = Vec::new();
    for w in 0..plan.max_concurrency() as usize {
        store
            .tasks()
            .create(&hot, &workload::append_key(w), &json!({}))
            .await?;
        store
            .tasks()
            .create(&hot, &workload::claim_key(w), &json!({}))
            .await?;
        let fence = store
            .acquire(&workload::own_lease(w), HOLDER, TTL)
            .await?
            .fence();
        store
            .tasks()
            .create(&fence, &workload::append_key(0), &json!({}))
            .await?;
        own.push(fence);
    }
    Ok(WriteSetup {
        store,
        native,
        pinging,
        url,
        hot,
        own,
    })
}

impl WriteSetup {
    /// The store a workload writes through: the native guard's, the pinging pool's, or the portable one.
    pub(super) fn store_for(&self, w: Workload) -> Store {
        match w {
            Workload::UpdatePing => self.pinging.clone(),
            w if w.native() => self
                .native
                .clone()
                .expect("native workloads run only with the native store"),
            _ => self.store.clone(),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn measure_writes(
    server: &Server,
    plan: &Plan,
    setup: &WriteSetup,
    pgbench: Option<&Pgbench>,
    collector: &mut Collector,
    progress: &Progress,
) -> Result<(), Failure> {
    let slots = plan.write_slots();
    let warmup = plan.duration.min(Duration::from_millis(100));
    let raw_config = raw_config(&setup.url)?;
    for &c in &plan.concurrency {
        progress.phase(&format!("writes with {c} concurrent writers"));
        let raw: Vec<Arc<RawClient>> =
            if plan.writes.iter().any(|w| w.path() == workload::Path::Raw) {
                let mut clients = Vec::new();
                for _ in 0..c {
                    clients.push(Arc::new(RawClient::connect(&raw_config).await?));
                }
                clients
            } else {
                Vec::new()
            };
        let mut writers: HashMap<(Workload, u32), Vec<Writer>> = HashMap::new();
        for &(w, b) in &slots {
            if w.path() == workload::Path::Pgbench {
                continue;
            }
            let mut list = Vec::new();
            for i in 0..c as usize {
                let fence = if w == Workload::AppendOwnLease {
                    setup.own[i].clone()
                } else {
                    setup.hot.clone()
                };
                let store = setup.store_for(w);
                let mut writer = Writer::new(w, i, b, store, fence, raw.get(i).cloned(), 0);
                if w == Workload::ClaimTransition {
                    let task = setup
                        .store
                        .tasks()
                        .get(HOT_LEASE, &workload::claim_key(i))
                        .await?;
                    writer.set_claimed(task.is_some_and(|t| t.state == TaskState::Claimed));
                }
                list.push(writer);
            }
            // Opens the pool's connections and prepares each connection's statements before measuring.
            let (list, ..) = timed(list, warmup).await?;
            writers.insert((w, b), list);
        }
        for round in 1..=plan.rounds {
            for &(w, b) in &slots {
                progress.step(format!(
                    "c={c} batch={b} {} round {round}/{}",
                    w.name(),
                    plan.rounds
                ));
                let before = server.counters().await?;
                let (transactions, seconds, tx_per_s, latency) = match pgbench {
                    Some(pgbench) if w.path() == workload::Path::Pgbench => {
                        let duration = plan.duration;
                        let r = tokio::task::block_in_place(|| pgbench.round(w, c, b, duration))?;
                        (r.transactions, r.seconds, r.tx_per_s, r.latency)
                    }
                    _ => {
                        let list = writers.remove(&(w, b)).expect("writers for every slot");
                        let (list, steps, seconds, latency) = timed(list, plan.duration).await?;
                        writers.insert((w, b), list);
                        (steps, seconds, steps as f64 / seconds, latency)
                    }
                };
                let (multixacts, xids) = delta(before, server.counters().await?);
                collector.add(
                    Key {
                        workload: w,
                        concurrency: c,
                        batch: b,
                        lease_rows: None,
                    },
                    Round {
                        transactions,
                        seconds,
                        tx_per_s,
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

/// Server time of the guarded statements and their unguarded twins, one at a time, when pg_stat_statements is
/// loaded (else nothing).
pub(super) async fn server_time(setup: &WriteSetup) -> Result<Vec<ServerCost>, Failure> {
    const ITERATIONS: u32 = 1000;
    let raw = RawClient::connect(&raw_config(&setup.url)?).await?;
    let client = raw.client();
    if client
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .is_err()
    {
        return Ok(Vec::new());
    }
    raw.probe(&setup.hot, ITERATIONS).await?;
    let rows = client
        .query(
            "SELECT query, calls::bigint, mean_exec_time, wal_records::float8 / calls, wal_bytes::float8 / calls \
               FROM pg_stat_statements \
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .map_err(|e| db_error("reading pg_stat_statements", e))?;
    let mut out = Vec::new();
    for (label, start) in workload::PROBES {
        if let Some(row) = rows
            .iter()
            .find(|r| r.get::<_, String>(0).starts_with(start))
        {
            out.push(ServerCost {
                statement: label,
                calls: row.get::<_, i64>(1) as u64,
                mean_us: row.get::<_, f64>(2) * 1000.0,
                wal_records_per_call: row.get(3),
                wal_bytes_per_call: row.get(4),
            });
        }
    }
    Ok(out)
}
