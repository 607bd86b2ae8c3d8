//! `pgfence bench`: what fencing costs on your database, measured side by side in one run.
//!
//! Every workload (see [`workload`]) runs at each concurrency in **interleaved rounds**: round 1 runs every
//! (batch size, workload) pair once, then round 2 does the same, and so on, so that a ratio between two
//! workloads compares rounds that ran seconds apart on the same noisy machine. The report gives medians over
//! rounds and paired ratios (the median of the per-round ratios); latency percentiles come from an HDR
//! histogram of every transaction of every round.
//!
//! Where: a throwaway server (the default), or scratch databases that the command creates on the server of
//! `--database-url` (only with `--yes`: it writes) and drops at the end. The lease workloads run in one scratch
//! database per lease-table size, so that 1 and 100,000 rows can be interleaved too.

mod pgbench;
mod plot;
mod report;
mod takeover;
mod workload;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pgfence::embedded::{EmbeddedOptions, EmbeddedServer};
use pgfence::leader::{Elector, LeaseOptions, PgElector};
use pgfence::{ExpectedIdentity, Fence, Store, StoreConfig, TaskState, TenureSecret};
use serde::Serialize;
use serde_json::json;

use self::pgbench::Pgbench;
use self::report::{Collector, Key, Measurement, RenewalCost, Round, ServerCost, Target};
use self::workload::{RawClient, Workload, Writer, HOLDER, HOT_LEASE, TTL};
use super::{CliResult, Failure, Global};

/// Options of `pgfence bench`.
#[derive(Debug, Args)]
pub(super) struct BenchArgs {
    /// How long each workload runs in each round. pgbench rounds last whole seconds (at least 1 s).
    #[arg(long, default_value = "500ms", value_parser = super::parse_duration)]
    duration: Duration,

    /// Interleaved rounds per workload; the report gives medians over rounds.
    #[arg(long, default_value_t = 5)]
    rounds: u32,

    /// Concurrent writers (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<u32>,

    /// Rows written per round trip by the user-table workloads (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    batch: Vec<u32>,

    /// Sizes of the lease table for the acquire and renew workloads (comma-separated; 0 skips them).
    #[arg(long, value_delimiter = ',', default_value = "1,1000,100000")]
    lease_rows: Vec<u32>,

    /// Only these workloads (comma-separated): update, update-ping, tx, fenced, raw-fenced,
    /// raw-fenced-pipelined, raw-guarded-update, guarded-update, raw-advisory-update, pgbench-fenced, append, append-unguarded, claim-transition, append-own-lease,
    /// raw-append, pgbench-append, acquire, renew. Default: all.
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<String>>,

    /// Skip the pgbench workloads even when pgbench is installed.
    #[arg(long)]
    no_pgbench: bool,

    /// How many leases one process holds when counting the statements per renewal tick (0 skips it).
    #[arg(long, default_value_t = 1000)]
    renewal_leases: u32,

    /// Takeovers per guard under six busy writers (0 skips them): their latency and whether a write of the
    /// ended tenure still lands (for fenced, guarded-update and the peer-* workloads that are selected).
    #[arg(long, default_value_t = 100)]
    takeovers: u32,

    /// Write every figure and the environment as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,

    /// Write a chart of throughput against concurrency (SVG) to this file.
    #[arg(long, value_name = "PATH")]
    plot: Option<PathBuf>,

    /// Measure nothing: draw the chart (--plot) of the runs these JSON files (--json of earlier runs) hold, in one
    /// chart, each line once per run (named by its fsync setting: "fsync off", "fsync on"). Repeatable.
    #[arg(long, value_name = "PATH")]
    plot_from: Vec<PathBuf>,

    /// The throwaway server calls fsync (off by default, as in the test suites).
    #[arg(long)]
    fsync: bool,

    /// Confirm running against --database-url: the benchmark creates scratch databases there (and drops them).
    #[arg(long)]
    yes: bool,
}

const RENEW_EVERY: Duration = Duration::from_millis(200);
const RENEWAL_TICKS: u32 = 10;

pub(super) fn new_histogram() -> Histogram<u64> {
    // Microseconds from 1 µs to 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// A failure of the benchmark's own statements, with the error's sources (tokio-postgres shows "db error" and
/// keeps the server's message as its source).
pub(super) fn db_error(context: &str, e: impl std::error::Error) -> Failure {
    Failure::new(1, format!("{context}: {}", pgfence::error_chain(&e)))
}

/// What the command was asked to measure.
struct Plan {
    duration: Duration,
    rounds: u32,
    concurrency: Vec<u32>,
    batches: Vec<u32>,
    lease_rows: Vec<u32>,
    writes: Vec<Workload>,
    leases: Vec<Workload>,
    /// Leases held by one process for the renewal measurement (0: skipped).
    renewal_leases: u32,
    /// Takeovers per guard (0: skipped).
    takeovers: u32,
}

impl Plan {
    fn new(args: &BenchArgs, pgbench: bool) -> Result<Plan, Failure> {
        let usage = |m: String| Failure::new(2, m);
        let clean = |mut v: Vec<u32>, what: &str, max: u32| -> Result<Vec<u32>, Failure> {
            v.sort_unstable();
            v.dedup();
            v.retain(|&n| n > 0);
            if v.iter().any(|&n| n > max) {
                return Err(usage(format!("--{what} values must be at most {max}")));
            }
            Ok(v)
        };
        let concurrency = clean(args.concurrency.clone(), "concurrency", 512)?;
        let batches = clean(args.batch.clone(), "batch", 10_000)?;
        let lease_rows = clean(args.lease_rows.clone(), "lease-rows", 10_000_000)?;
        if concurrency.is_empty() || batches.is_empty() {
            return Err(usage(
                "--concurrency and --batch need at least one positive value".into(),
            ));
        }
        if args.rounds == 0 {
            return Err(usage("--rounds must be at least 1".into()));
        }
        let selected: Vec<Workload> = match &args.workloads {
            None => Workload::all().collect(),
            Some(names) => names
                .iter()
                .map(|n| {
                    Workload::parse(n.trim()).ok_or_else(|| {
                        usage(format!(
                            "unknown workload {n:?}; known: {}",
                            Workload::all()
                                .map(Workload::name)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let writes: Vec<Workload> = workload::WRITES
            .into_iter()
            .filter(|w| selected.contains(w))
            .filter(|w| pgbench || w.path() != workload::Path::Pgbench)
            .collect();
        let leases: Vec<Workload> = if lease_rows.is_empty() {
            Vec::new()
        } else {
            workload::LEASES
                .into_iter()
                .filter(|w| selected.contains(w))
                .collect()
        };
        if writes.is_empty() && leases.is_empty() {
            return Err(usage("no workload left to run".into()));
        }
        Ok(Plan {
            duration: args.duration,
            rounds: args.rounds,
            concurrency,
            batches,
            lease_rows,
            writes,
            leases,
            renewal_leases: args.renewal_leases,
            takeovers: args.takeovers,
        })
    }

    fn max_concurrency(&self) -> u32 {
        *self.concurrency.last().expect("at least one")
    }

    fn max_batch(&self) -> u32 {
        *self.batches.last().expect("at least one")
    }

    /// (workload, batch) pairs of one round of writes.
    fn write_slots(&self) -> Vec<(Workload, u32)> {
        let mut slots = Vec::new();
        for &b in &self.batches {
            for &w in &self.writes {
                if b == 1 || w.batches() {
                    slots.push((w, b));
                }
            }
        }
        slots
    }

    /// (workload, lease rows) pairs of one round of lease operations.
    fn lease_slots(&self) -> Vec<(Workload, u32)> {
        let mut slots = Vec::new();
        for &w in &self.leases {
            for &n in &self.lease_rows {
                slots.push((w, n));
            }
        }
        slots
    }

    /// Connections open at once: the pool, the pinging pool of `update-ping`, the native guard's pool, the raw
    /// clients and pgbench; or one pool per lease table.
    fn connections_needed(&self) -> u32 {
        let per_writer = 5.max(if self.leases.is_empty() {
            0
        } else {
            self.lease_rows.len() as u32
        });
        self.max_concurrency() * per_writer + 10
    }

    fn steps(&self) -> u64 {
        let c = self.concurrency.len() as u64;
        let per_round = (self.write_slots().len() + self.lease_slots().len()) as u64;
        c * per_round * u64::from(self.rounds)
    }

    fn estimate(&self) -> Duration {
        let pgbench_round = Duration::from_secs_f64(self.duration.as_secs_f64().round().max(1.0))
            + Duration::from_millis(300);
        let mut total = Duration::ZERO;
        for (w, _) in self.write_slots() {
            total += if w.path() == workload::Path::Pgbench {
                pgbench_round
            } else {
                self.duration
            };
        }
        total += self.duration * self.lease_slots().len() as u32;
        total * (self.rounds * self.concurrency.len() as u32)
    }
}

/// The server the benchmark runs on and the scratch databases it created there.
struct Server {
    embedded: Option<EmbeddedServer>,
    /// URL of the maintenance database (the one given, or the embedded server's `postgres`).
    url: String,
    admin: tokio_postgres::Client,
    created: Vec<String>,
    prefix: String,
}

async fn connect_admin(url: &str) -> Result<tokio_postgres::Client, Failure> {
    // TLS as for every pgfence connection: the URL's sslmode/sslrootcert/…, else PGSSLMODE/PGSSLROOTCERT/….
    let mut connector = pgfence::Connector::new(url)?;
    let config = connector.config_mut();
    if config.get_application_name().is_none() {
        config.application_name("pgfence-bench");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    let (client, connection) = connector.connect().await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

impl Server {
    async fn embedded(plan: &Plan, fsync: bool) -> Result<Server, Failure> {
        let mut settings = vec![(
            "max_connections".to_owned(),
            plan.connections_needed().max(200).to_string(),
        )];
        let pgss = pgfence::embedded::find_bin_dir()
            .ok()
            .and_then(|bin| bin.parent().map(|p| p.join("lib/pg_stat_statements.so")))
            .is_some_and(|lib| lib.is_file());
        if pgss {
            settings.push((
                "shared_preload_libraries".to_owned(),
                "pg_stat_statements".to_owned(),
            ));
        }
        let mut options = EmbeddedOptions::default();
        options.fsync = fsync;
        options.extra_settings = settings;
        let server = tokio::task::spawn_blocking(move || EmbeddedServer::start_with(options))
            .await
            .map_err(|e| Failure::new(1, e.to_string()))??;
        let url = server.url();
        let admin = connect_admin(&url).await?;
        Ok(Server {
            embedded: Some(server),
            url,
            admin,
            created: Vec::new(),
            prefix: "pgfence_bench".to_owned(),
        })
    }

    async fn remote(url: &str, plan: &Plan) -> Result<Server, Failure> {
        let admin = connect_admin(url).await?;
        let row = admin
            .query_one(
                "SELECT current_setting('max_connections')::int - \
                        current_setting('superuser_reserved_connections')::int - \
                        (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int",
                &[],
            )
            .await
            .map_err(|e| db_error("reading max_connections", e))?;
        let free: i32 = row.get(0);
        if free < plan.connections_needed() as i32 {
            return Err(Failure::new(
                2,
                format!(
                    "the benchmark needs {} connections at once ({} writers), the server has {free} free: \
                     lower --concurrency or raise max_connections",
                    plan.connections_needed(),
                    plan.max_concurrency()
                ),
            ));
        }
        Ok(Server {
            embedded: None,
            url: url.to_owned(),
            admin,
            created: Vec::new(),
            prefix: format!(
                "pgfence_bench_{}",
                chrono::Utc::now().format("%Y%m%d%H%M%S")
            ),
        })
    }

    fn url_for(&self, database: &str) -> String {
        match &self.embedded {
            Some(server) => server.url_for(database),
            None => pgfence::with_database(&self.url, database),
        }
    }

    async fn create_database(&mut self, suffix: &str) -> Result<String, Failure> {
        let name = format!("{}{suffix}", self.prefix);
        self.admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .map_err(|e| {
                db_error(
                    &format!("creating the scratch database {name} (the benchmark needs CREATEDB)"),
                    e,
                )
            })?;
        self.created.push(name.clone());
        Ok(name)
    }

    /// Drops the scratch databases of a server the benchmark did not start.
    async fn cleanup(&mut self) {
        if self.embedded.is_some() {
            return;
        }
        for name in self.created.drain(..) {
            if let Err(e) = self
                .admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
            {
                eprintln!("pgfence bench: could not drop the scratch database {name}: {e}");
            }
        }
    }

    /// Cluster-wide counters: (next MultiXact id, next transaction id). `mxid_age` is measured against the
    /// current next MultiXact id, so this needs no checkpoint and no privilege.
    async fn counters(&self) -> Result<(u64, u64), Failure> {
        let row = self
            .admin
            .query_one(
                "SELECT ((datminmxid::text::bigint + mxid_age(datminmxid)) % 4294967296)::bigint, \
                        pg_snapshot_xmax(pg_current_snapshot())::text::bigint \
                   FROM pg_database WHERE datname = current_database()",
                &[],
            )
            .await
            .map_err(|e| db_error("reading the MultiXact counter", e))?;
        Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
    }
}

fn delta(before: (u64, u64), after: (u64, u64)) -> (u64, u64) {
    (
        after.0.wrapping_sub(before.0) % (1 << 32),
        after.1.saturating_sub(before.1),
    )
}

/// The document `--json` writes.
#[derive(Debug, Serialize)]
struct Document {
    environment: Environment,
    measurements: Vec<Measurement>,
    renewal: Option<RenewalCost>,
    server_time: Vec<ServerCost>,
    takeovers: Vec<takeover::TakeoverCost>,
    targets: Vec<Target>,
}

/// Where and how the figures were measured.
#[derive(Debug, Serialize)]
struct Environment {
    pgfence_version: &'static str,
    build: &'static str,
    command: String,
    started_at: String,
    elapsed_s: f64,
    /// `user@host:port` of the server; "embedded" when the command started it.
    server: String,
    embedded: bool,
    server_version: String,
    settings: BTreeMap<String, String>,
    cores: usize,
    cpu: Option<String>,
    os: Option<String>,
    pgbench: Option<String>,
    duration_per_round_s: f64,
    pgbench_round_s: u64,
    rounds: u32,
    concurrency: Vec<u32>,
    batches: Vec<u32>,
    lease_rows: Vec<u32>,
    /// The MultiXact counter as computed from `mxid_age` and as written by a CHECKPOINT, at the end of the
    /// run (they agree when the method is right; `null` without the privilege to CHECKPOINT).
    multixact_crosscheck: Option<(u64, u64)>,
    /// `/proc/loadavg` at the start and the end: other work on the machine shows here.
    load_average: (Option<String>, Option<String>),
}

fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// The command line as run, without the connection string.
fn command_line() -> String {
    let mut out = Vec::new();
    let mut hide_next = false;
    for arg in std::env::args() {
        if hide_next {
            out.push("<redacted>".to_owned());
            hide_next = false;
        } else if arg == "--database-url" {
            out.push(arg);
            hide_next = true;
        } else if arg.starts_with("--database-url=") {
            out.push("--database-url=<redacted>".to_owned());
        } else {
            out.push(arg);
        }
    }
    if let Some(first) = out.first_mut() {
        *first = "pgfence".to_owned();
    }
    out.join(" ")
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
}

fn os_release() -> Option<String> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    Some(format!("Linux {}", kernel.trim()))
}

const SETTINGS: [&str; 12] = [
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "shared_buffers",
    "max_connections",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "autovacuum_multixact_freeze_max_age",
    "jit",
    "shared_preload_libraries",
];

/// Progress on stderr: a bar on a terminal, a line per phase otherwise.
struct Progress {
    bar: ProgressBar,
}

impl Progress {
    fn new(steps: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} (eta {eta}) {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Progress { bar }
    }

    fn phase(&self, text: &str) {
        if self.bar.is_hidden() {
            eprintln!("pgfence bench: {text}");
        }
        self.bar.set_message(text.to_owned());
    }

    fn step(&self, text: String) {
        self.bar.set_message(text);
        self.bar.inc(1);
    }
}

/// Runs `writers` for `duration`: each records every step's latency. Returns the writers (for the next round),
/// the steps done, the seconds it took and the merged latencies.
async fn timed(
    writers: Vec<Writer>,
    duration: Duration,
) -> Result<(Vec<Writer>, u64, f64, Histogram<u64>), Failure> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|mut writer| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut latency = new_histogram();
                let mut steps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    writer.step().await?;
                    latency.saturating_record(t.elapsed().as_micros().max(1) as u64);
                    steps += 1;
                }
                Ok::<_, Failure>((writer, steps, latency))
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut writers = Vec::with_capacity(tasks.len());
    let mut steps = 0;
    let mut latency = new_histogram();
    let mut failure = None;
    for task in tasks {
        match task.await {
            Ok(Ok((w, n, h))) => {
                writers.push(w);
                steps += n;
                let _ = latency.add(&h);
            }
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(Failure::new(1, format!("a writer panicked: {e}"))),
        }
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    Ok((writers, steps, started.elapsed().as_secs_f64(), latency))
}

/// The write workloads' database: the user table, the hot lease, every writer's tasks and own lease.
struct WriteSetup {
    /// Through the portable guard (pgfence.fence).
    store: Store,
    /// Through the native guard (pgfence_native.fence), when the server has the extension.
    native: Option<Store>,
    /// The same database through a pool that tests each connection at check-out (`update-ping`).
    pinging: Store,
    url: String,
    hot: Fence,
    own: Vec<Fence>,
}

async fn setup_writes(
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
            (plan.max_concurrency() * plan.max_batch()).max(takeover::ZOMBIE_ROW as u32 + 1),
        )))
        .await
        .map_err(|e| db_error("creating the benchmark schema", e))?;
    let hot = store.acquire(HOT_LEASE, HOLDER, TTL).await?.fence();
    let mut own = Vec::new();
    for w in 0..plan.max_concurrency() as usize {
        store
            .create_task(&hot, &workload::append_key(w), &json!({}))
            .await?;
        store
            .create_task(&hot, &workload::claim_key(w), &json!({}))
            .await?;
        let fence = store
            .acquire(&workload::own_lease(w), HOLDER, TTL)
            .await?
            .fence();
        store
            .create_task(&fence, &workload::append_key(0), &json!({}))
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
    fn store_for(&self, w: Workload) -> Store {
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

fn store_config(url: &str, plan: &Plan, global: &Global) -> StoreConfig {
    StoreConfig::new(url, "bench")
        // The takeover measurement's busy writers, its zombie write and its acquisition each hold a connection
        // at once. The pool's check-out is not first come, first served (a returned connection goes to whoever
        // asks next), so with fewer connections than writers one writer can wait out the whole measurement.
        .pool_size(plan.max_concurrency().max(takeover::CONNECTIONS))
        .connect_timeout(global.connect_timeout)
        .checkout_timeout(Duration::from_secs(60))
        .application_name("pgfence-bench")
        .expect(ExpectedIdentity {
            system_identifier: global.expect_system_identifier.clone(),
            instance_id: None,
            database: None,
        })
}

fn raw_config(url: &str) -> Result<pgfence::Connector, Failure> {
    let mut connector = pgfence::Connector::new(url)?;
    connector.config_mut().application_name("pgfence-bench-raw");
    Ok(connector)
}

#[allow(clippy::too_many_arguments)]
async fn measure_writes(
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
                    let task = setup.store.task(HOT_LEASE, &workload::claim_key(i)).await?;
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
async fn server_time(setup: &WriteSetup) -> Result<Vec<ServerCost>, Failure> {
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

/// One database per lease-table size, each with `rows` leases held by the benchmark.
struct LeaseTable {
    rows: u32,
    store: Store,
    url: String,
}

async fn setup_leases(
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

async fn measure_leases(
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
            let placeholder = TenureSecret::parse("0".repeat(pgfence::SECRET_LEN))?;
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
async fn measure_renewal(
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

async fn environment(
    server: &Server,
    plan: &Plan,
    started_at: chrono::DateTime<chrono::Utc>,
    elapsed: Duration,
) -> Result<Environment, Failure> {
    let version: String = server
        .admin
        .query_one("SELECT current_setting('server_version')", &[])
        .await
        .map_err(|e| db_error("reading the server version", e))?
        .get(0);
    let mut settings = BTreeMap::new();
    for row in server
        .admin
        .query(
            "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings WHERE name = ANY($1)",
            &[&SETTINGS.to_vec()],
        )
        .await
        .map_err(|e| db_error("reading settings", e))?
    {
        settings.insert(row.get(0), row.get(1));
    }
    // The counter as this module computes it, and as a checkpoint records it.
    let computed = server.counters().await?.0;
    let crosscheck = match server.admin.batch_execute("CHECKPOINT").await {
        Ok(()) => server
            .admin
            .query_one(
                "SELECT next_multixact_id::text::bigint FROM pg_control_checkpoint()",
                &[],
            )
            .await
            .ok()
            .map(|r| (computed, r.get::<_, i64>(0) as u64)),
        Err(_) => None,
    };
    Ok(Environment {
        pgfence_version: env!("CARGO_PKG_VERSION"),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        command: command_line(),
        started_at: started_at.to_rfc3339(),
        elapsed_s: elapsed.as_secs_f64(),
        server: if server.embedded.is_some() {
            "embedded".to_owned()
        } else {
            pgfence::redact(&server.url)
        },
        embedded: server.embedded.is_some(),
        server_version: version,
        settings,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cpu: cpu_model(),
        os: os_release(),
        pgbench: None,
        duration_per_round_s: plan.duration.as_secs_f64(),
        pgbench_round_s: plan.duration.as_secs_f64().round().max(1.0) as u64,
        rounds: plan.rounds,
        concurrency: plan.concurrency.clone(),
        batches: plan.batches.clone(),
        lease_rows: plan.lease_rows.clone(),
        multixact_crosscheck: crosscheck,
        load_average: (None, load_average()),
    })
}

async fn measure(
    server: &mut Server,
    plan: &mut Plan,
    global: &Global,
    pgbench_exe: Option<PathBuf>,
    progress: &Progress,
) -> Result<Outcome, Failure> {
    let mut collector = Collector::default();
    let mut pgbench_version = None;
    let mut server_time = Vec::new();
    let mut takeovers = Vec::new();
    if !plan.writes.is_empty() {
        progress.phase("creating the write database");
        let setup = setup_writes(server, plan, global).await?;
        if setup.native.is_none() {
            plan.writes.retain(|w| !w.native());
        }
        let pgbench = match pgbench_exe {
            Some(exe) => Some(Pgbench::new(
                exe,
                &raw_config(&setup.url)?,
                &plan.batches,
                setup.hot.lease(),
                setup.hot.epoch().get(),
                setup.hot.secret().expose_secret(),
            )?),
            None => None,
        };
        pgbench_version = pgbench.as_ref().map(|p| p.version.clone());
        measure_writes(
            server,
            plan,
            &setup,
            pgbench.as_ref(),
            &mut collector,
            progress,
        )
        .await?;
        progress.phase("server time per statement");
        server_time = self::server_time(&setup).await?;
        if plan.takeovers > 0 {
            progress.phase(&format!(
                "{} takeovers per guard under {} busy writers",
                plan.takeovers,
                takeover::WRITERS
            ));
            let admin = connect_admin(&setup.url).await?;
            takeovers =
                takeover::measure(&setup, &admin, server, &plan.writes, plan.takeovers).await?;
        }
    }
    let mut renewal = None;
    if !plan.leases.is_empty() || plan.renewal_leases > 0 {
        let tables = setup_leases(server, plan, global, progress).await?;
        if !plan.leases.is_empty() {
            measure_leases(server, plan, &tables, &mut collector, progress).await?;
        }
        if plan.renewal_leases > 0 {
            if let Some(largest) = tables.last() {
                progress.phase(&format!(
                    "renewal cost of {} leases held by one process",
                    plan.renewal_leases
                ));
                renewal = Some(measure_renewal(largest, plan.renewal_leases, global).await?);
            }
        }
    }
    Ok(Outcome {
        measurements: collector.measurements(),
        renewal,
        server_time,
        takeovers,
        pgbench_version,
    })
}

struct Outcome {
    measurements: Vec<Measurement>,
    renewal: Option<RenewalCost>,
    server_time: Vec<ServerCost>,
    takeovers: Vec<takeover::TakeoverCost>,
    pgbench_version: Option<String>,
}

/// `--plot-from`: one chart of the measurements of earlier runs.
fn plot_from(files: &[PathBuf], out: Option<&PathBuf>) -> CliResult {
    let Some(out) = out else {
        return Err(Failure::new(
            2,
            "--plot-from draws a chart: give --plot PATH.svg",
        ));
    };
    let mut all = Vec::new();
    let mut runs = Vec::new();
    for path in files {
        let read = |e: String| Failure::new(2, format!("{}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| read(e.to_string()))?;
        let doc: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| read(e.to_string()))?;
        let fsync = doc["environment"]["settings"]["fsync"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        let variant = format!("fsync {fsync}");
        let measurements: Vec<Measurement> =
            serde_json::from_value(doc["measurements"].clone()).map_err(|e| read(e.to_string()))?;
        all.extend(measurements.into_iter().map(|mut m| {
            m.variant = Some(variant.clone());
            m
        }));
        runs.push(format!(
            "{} ({variant}, PostgreSQL {})",
            path.display(),
            doc["environment"]["server_version"].as_str().unwrap_or("?")
        ));
    }
    let title = format!("pgfence bench: {}", runs.join(" and "));
    plot::write_svg(out, &all, &title)
        .map_err(|e| Failure::new(1, format!("writing {}: {e}", out.display())))?;
    Ok(())
}

pub(super) async fn run(global: &Global, args: BenchArgs) -> CliResult {
    if !args.plot_from.is_empty() {
        return plot_from(&args.plot_from, args.plot.as_ref());
    }
    let started_at = chrono::Utc::now();
    let started = Instant::now();
    let load_at_start = load_average();
    if let Some(path) = &args.plot {
        if path.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err(Failure::new(
                2,
                "--plot writes SVG: give a path ending in .svg",
            ));
        }
    }
    let server_bin = pgfence::embedded::find_bin_dir().ok();
    let pgbench_exe = if args.no_pgbench {
        None
    } else {
        pgbench::find(server_bin.as_deref())
    };
    let mut plan = Plan::new(&args, pgbench_exe.is_some())?;
    let mut server = match &global.database_url {
        Some(url) if !args.yes => {
            return Err(Failure::new(
                2,
                format!(
                    "bench writes: it creates scratch databases on {} and drops them at the end; repeat with \
                     --yes to run it there (without --database-url it starts a throwaway server)",
                    pgfence::redact(url)
                ),
            ));
        }
        Some(url) => Server::remote(url, &plan).await?,
        None => {
            eprintln!("pgfence bench: starting a throwaway PostgreSQL server");
            Server::embedded(&plan, args.fsync).await?
        }
    };
    if cfg!(debug_assertions) {
        eprintln!(
            "pgfence bench: this is a debug build; build with --release for figures worth comparing"
        );
    }
    if pgbench_exe.is_none() && !args.no_pgbench {
        eprintln!("pgfence bench: pgbench not found on PATH; the pgbench workloads are skipped");
    }
    eprintln!(
        "pgfence bench: {} steps, about {:.0} s of measurement",
        plan.steps(),
        plan.estimate().as_secs_f64()
    );
    let progress = Progress::new(plan.steps());
    let outcome = measure(&mut server, &mut plan, global, pgbench_exe, &progress).await;
    progress.bar.finish_and_clear();
    let Outcome {
        measurements,
        renewal,
        server_time,
        takeovers,
        pgbench_version,
    } = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            server.cleanup().await;
            return Err(e);
        }
    };
    let targets = report::targets(&measurements, renewal.as_ref());
    let mut env = environment(&server, &plan, started_at, started.elapsed()).await?;
    env.pgbench = pgbench_version;
    env.load_average.0 = load_at_start;
    server.cleanup().await;

    println!(
        "pgfence bench: PostgreSQL {} on {} ({} cores, fsync {}, synchronous_commit {}), {} build",
        env.server_version,
        if env.embedded {
            "a throwaway server"
        } else {
            env.server.as_str()
        },
        env.cores,
        env.settings.get("fsync").map_or("?", String::as_str),
        env.settings
            .get("synchronous_commit")
            .map_or("?", String::as_str),
        env.build
    );
    println!(
        "{} interleaved rounds of {:?} per workload (pgbench: {} s), paths: {}",
        plan.rounds,
        plan.duration,
        env.pgbench_round_s,
        report::paths(&plan.writes).join(", ")
    );
    println!(
        "load average (1/5/15 min) at the start: {}, at the end: {}",
        env.load_average.0.as_deref().unwrap_or("?"),
        env.load_average.1.as_deref().unwrap_or("?")
    );
    println!("reproduce: {}", env.command);
    report::print_tables(&measurements, renewal.as_ref(), &server_time, &targets);
    takeover::print(&takeovers);

    let document = Document {
        environment: env,
        measurements,
        renewal,
        server_time,
        takeovers,
        targets,
    };
    if let Some(path) = &args.json {
        let text =
            serde_json::to_string_pretty(&document).map_err(|e| Failure::new(1, e.to_string()))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| Failure::new(1, format!("writing {}: {e}", path.display())))?;
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "pgfence bench: PostgreSQL {}, {} cores, medians of {} interleaved rounds",
            document.environment.server_version, document.environment.cores, plan.rounds
        );
        plot::write_svg(path, &document.measurements, &title)
            .map_err(|e| Failure::new(1, format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}
