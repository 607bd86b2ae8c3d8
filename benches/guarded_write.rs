//! Guarded vs unguarded writes through the same pool, measured side by side in one run.
//!
//! Workloads run in interleaved rounds (A B C D A B C D …) against a throwaway server (or `DATABASE_URL` with
//! `PGFENCE_BENCH_YES=1`, since it writes), and the report gives the median throughput over rounds and its
//! ratio to the unguarded baseline of the same shape:
//!
//! * `update`            — unguarded single-row `UPDATE` (diesel `sql_query`), the baseline for …
//! * `fenced_update`     — the same `UPDATE` inside `Store::fenced` (BEGIN, guard, UPDATE, COMMIT);
//! * `task_write`        — unguarded: update a task row and insert its event in one statement (CTE), the
//!   baseline for …
//! * `append_event`      — `Store::append_event`: guard + row fence + event in one prepared statement.
//!
//! `cargo bench --bench guarded_write` (env: `PGFENCE_BENCH_SECS` per workload and round, default 2;
//! `PGFENCE_BENCH_ROUNDS`, default 5; `PGFENCE_BENCH_CLIENTS`, default `1,8`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use pgfence::embedded::EmbeddedServer;
use pgfence::{Error, Fence, Store, StoreConfig};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Workload {
    Update,
    FencedUpdate,
    TaskWrite,
    AppendEvent,
}

const WORKLOADS: [Workload; 4] = [
    Workload::Update,
    Workload::FencedUpdate,
    Workload::TaskWrite,
    Workload::AppendEvent,
];

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Update => "update (unguarded)",
            Workload::FencedUpdate => "fenced_update",
            Workload::TaskWrite => "task_write (unguarded)",
            Workload::AppendEvent => "append_event",
        }
    }

    fn baseline(self) -> Workload {
        match self {
            Workload::Update | Workload::FencedUpdate => Workload::Update,
            Workload::TaskWrite | Workload::AppendEvent => Workload::TaskWrite,
        }
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn one_write(
    store: &Store,
    fence: &Fence,
    workload: Workload,
    client: i64,
) -> Result<(), Error> {
    // Imported here, not at file scope: its `load` would shadow the atomics' inherent methods.
    use diesel_async::RunQueryDsl;
    let key = format!("bench-{client}");
    match workload {
        Workload::Update => {
            let mut conn = store.conn().await?;
            diesel::sql_query("UPDATE bench_rows SET v = v + 1 WHERE id = $1")
                .bind::<BigInt, _>(client)
                .execute(&mut *conn)
                .await?;
        }
        Workload::FencedUpdate => {
            store
                .fenced(fence, "bench", move |conn| {
                    Box::pin(async move {
                        diesel::sql_query("UPDATE bench_rows SET v = v + 1 WHERE id = $1")
                            .bind::<BigInt, _>(client)
                            .execute(conn)
                            .await?;
                        Ok::<_, Error>(())
                    })
                })
                .await?;
        }
        Workload::TaskWrite => {
            let mut conn = store.conn().await?;
            diesel::sql_query(
                "WITH t AS (UPDATE pgfence.tasks SET updated_at = clock_timestamp() \
                             WHERE lease = $1 AND key = $2 RETURNING id) \
                 INSERT INTO pgfence.task_events (task_id, lease, epoch, kind) SELECT id, $1, $3, 'bench' FROM t",
            )
            .bind::<Text, _>(fence.lease())
            .bind::<Text, _>(&key)
            .bind::<BigInt, _>(fence.epoch().get())
            .execute(&mut *conn)
            .await?;
        }
        Workload::AppendEvent => {
            store.append_event(fence, &key, "bench", &json!({})).await?;
        }
    }
    Ok(())
}

/// Runs `clients` concurrent writers for `secs`; returns writes per second.
async fn round(store: &Store, fence: &Fence, workload: Workload, clients: i64, secs: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (store, fence, stop, done) = (store.clone(), fence.clone(), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                one_write(&store, &fence, workload, client)
                    .await
                    .expect("write");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list; this is not a test harness.
    }
    let secs: f64 = env_or("PGFENCE_BENCH_SECS", 2.0);
    let rounds: usize = env_or("PGFENCE_BENCH_ROUNDS", 5);
    let clients: Vec<i64> = std::env::var("PGFENCE_BENCH_CLIENTS")
        .unwrap_or_else(|_| "1,8".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let max_clients = clients.iter().copied().max().unwrap_or(1);

    let (server, url) = match std::env::var("DATABASE_URL") {
        Ok(url) if std::env::var("PGFENCE_BENCH_YES").is_ok() => (None, url),
        _ => {
            let server = EmbeddedServer::start().expect("start a throwaway PostgreSQL server");
            let url = server.url();
            (Some(server), url)
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use diesel_async::RunQueryDsl;
        let store = Store::connect(StoreConfig::new(url, "bench").pool_size(max_clients as u32 + 2))
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        let lease = store.acquire("writer", "bench", Duration::from_secs(3600)).await.expect("acquire");
        let fence = lease.fence();
        {
            let mut conn = store.conn().await.unwrap();
            diesel::sql_query("CREATE TABLE IF NOT EXISTS bench_rows (id bigint PRIMARY KEY, v bigint NOT NULL)")
                .execute(&mut *conn)
                .await
                .unwrap();
            diesel::sql_query("INSERT INTO bench_rows SELECT g, 0 FROM generate_series(0, 1000) g ON CONFLICT DO NOTHING")
                .execute(&mut *conn)
                .await
                .unwrap();
        }
        for client in 0..max_clients {
            store.create_task(&fence, &format!("bench-{client}"), &json!({})).await.unwrap();
        }
        let version: String = {
            #[derive(diesel::QueryableByName)]
            struct V {
                #[diesel(sql_type = Text)]
                v: String,
            }
            let mut conn = store.conn().await.unwrap();
            diesel::sql_query("SELECT current_setting('server_version') AS v")
                .get_result::<V>(&mut *conn)
                .await
                .unwrap()
                .v
        };
        println!(
            "pgfence guarded-write benchmark: PostgreSQL {version}, {} cores, {rounds} interleaved rounds of {secs} s",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        );
        println!("{:<24} {:>8} {:>12} {:>18}", "workload", "clients", "median tx/s", "ratio to baseline");
        for &c in &clients {
            let mut results: Vec<Vec<f64>> = vec![Vec::new(); WORKLOADS.len()];
            for _ in 0..rounds {
                for (i, w) in WORKLOADS.iter().enumerate() {
                    results[i].push(round(&store, &fence, *w, c, secs).await);
                }
            }
            let medians: Vec<f64> = results.iter_mut().map(|r| median(r)).collect();
            for (i, w) in WORKLOADS.iter().enumerate() {
                let base = WORKLOADS.iter().position(|b| *b == w.baseline()).unwrap();
                println!(
                    "{:<24} {:>8} {:>12.0} {:>18.2}",
                    w.name(),
                    c,
                    medians[i],
                    medians[i] / medians[base]
                );
            }
        }
    });
    drop(server);
}
