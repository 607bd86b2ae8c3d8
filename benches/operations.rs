//! One criterion benchmark per pgfence operation, so that a regression in one of them shows up in
//! `cargo bench`: acquire, renew, release, a pooled checkout (`checkout`), a task write (`append_event`), a
//! one-statement guarded UPDATE (`guarded_write`) and a fenced transaction.
//!
//! Each runs one operation at a time against a throwaway server (or `DATABASE_URL` with `PGFENCE_BENCH_YES=1`,
//! since it writes). For ratios between guarded and unguarded writes, raw statements and pgbench at several
//! concurrencies, run `pgfence bench` instead.
//!
//! `cargo bench --bench operations` (criterion's own options follow `--`, e.g. `-- fenced`).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pgfence::embedded::EmbeddedServer;
use pgfence::{Error, Fence, Lease, Store, StoreConfig};
use serde_json::json;
use tokio::runtime::Runtime;

const TTL: Duration = Duration::from_secs(3600);

struct Setup {
    _server: Option<EmbeddedServer>,
    runtime: Runtime,
    store: Store,
    fence: Fence,
    lease: Lease,
}

fn setup() -> Setup {
    let (server, url) = match std::env::var("DATABASE_URL") {
        Ok(url) if std::env::var("PGFENCE_BENCH_YES").is_ok_and(|v| v == "1") => (None, url),
        _ => {
            let server = EmbeddedServer::start().expect("start a throwaway PostgreSQL server");
            let url = server.url();
            (Some(server), url)
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (store, fence, lease) = runtime.block_on(async {
        use diesel_async::RunQueryDsl;
        let cluster = format!("criterion-{}", std::process::id());
        let store = Store::connect(StoreConfig::new(url, cluster).pool_size(4))
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        {
            let mut conn = store.admin().conn().await.expect("connection");
            diesel::sql_query(
                "CREATE TABLE IF NOT EXISTS pgfence_criterion_rows (id bigint PRIMARY KEY, v bigint NOT NULL)",
            )
            .execute(&mut *conn)
            .await
            .expect("create table");
            diesel::sql_query(
                "INSERT INTO pgfence_criterion_rows VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
            )
            .execute(&mut *conn)
            .await
            .expect("insert row");
        }
        let writer = store
            .acquire("writer", "criterion", TTL)
            .await
            .expect("acquire");
        let fence = writer.fence();
        store
            .tasks().create(&fence, "task", &json!({}))
            .await
            .expect("create task");
        let lease = store
            .acquire("renewed", "criterion", TTL)
            .await
            .expect("acquire");
        (store, fence, lease)
    });
    Setup {
        _server: server,
        runtime,
        store,
        fence,
        lease,
    }
}

fn operations(c: &mut Criterion) {
    let s = setup();
    let mut group = c.benchmark_group("pgfence");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));

    // The same holder acquiring again gets a new epoch each time: every iteration is a full acquisition.
    group.bench_function("acquire", |b| {
        b.to_async(&s.runtime).iter(|| async {
            s.store
                .acquire("acquired", "criterion", TTL)
                .await
                .expect("acquire")
        })
    });

    group.bench_function("renew", |b| {
        b.to_async(&s.runtime).iter_custom(|iters| {
            let mut lease = s.lease.clone();
            let store = s.store.clone();
            async move {
                let started = Instant::now();
                for _ in 0..iters {
                    store.renew(&mut lease).await.expect("renew");
                }
                started.elapsed()
            }
        })
    });

    // Only the release is timed; the acquisition before it is not.
    group.bench_function("release", |b| {
        b.to_async(&s.runtime).iter_custom(|iters| {
            let store = s.store.clone();
            async move {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let lease = store
                        .acquire("released", "criterion", TTL)
                        .await
                        .expect("acquire");
                    let started = Instant::now();
                    store.release(&lease).await.expect("release");
                    timed += started.elapsed();
                }
                timed
            }
        })
    });

    // A pooled connection checked out and given back, no statement: the checkout's own cost (its turn included),
    // which every operation above pays once.
    group.bench_function("checkout", |b| {
        b.to_async(&s.runtime)
            .iter(|| async { drop(s.store.admin().conn().await.expect("checkout")) })
    });

    group.bench_function("append_event", |b| {
        b.to_async(&s.runtime).iter(|| async {
            s.store
                .tasks()
                .append_event(&s.fence, "task", "criterion", &json!({}))
                .await
                .expect("append_event")
        })
    });

    group.bench_function("guarded_write", |b| {
        b.to_async(&s.runtime).iter(|| async {
            s.store
                .guarded_write(
                    &s.fence,
                    "criterion",
                    diesel::sql_query(
                        "UPDATE pgfence_criterion_rows SET v = v + 1 \
                          WHERE id = 1 AND (SELECT passed FROM pgfence_guard)",
                    ),
                )
                .await
                .expect("guarded_write")
        })
    });

    group.bench_function("fenced_transaction", |b| {
        b.to_async(&s.runtime).iter(|| async {
            s.store
                .fenced(&s.fence, "criterion", async |conn| {
                    use diesel_async::RunQueryDsl;
                    pgfence::guard::Cached::new(diesel::sql_query(
                        "UPDATE pgfence_criterion_rows SET v = v + 1 WHERE id = 1",
                    ))
                    .execute(conn)
                    .await?;
                    Ok::<_, Error>(())
                })
                .await
                .expect("fenced")
        })
    });
    group.finish();
}

criterion_group!(benches, operations);
criterion_main!(benches);
