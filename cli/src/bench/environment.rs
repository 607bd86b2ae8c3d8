//! Where and how the figures were measured: the server's version and settings, the machine, the command line
//! as run, the MultiXact counter's cross-check and the load average.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::plan::Plan;
use super::server::Server;
use super::{db_error, Failure};

/// Where and how the figures were measured.
#[derive(Debug, Serialize)]
pub(super) struct Environment {
    pgfence_version: &'static str,
    pub(super) build: &'static str,
    pub(super) command: String,
    started_at: String,
    elapsed_s: f64,
    /// `user@host:port` of the server; "embedded" when the command started it.
    pub(super) server: String,
    pub(super) embedded: bool,
    pub(super) server_version: String,
    pub(super) settings: BTreeMap<String, String>,
    pub(super) cores: usize,
    cpu: Option<String>,
    os: Option<String>,
    pub(super) pgbench: Option<String>,
    duration_per_round_s: f64,
    pub(super) pgbench_round_s: u64,
    rounds: u32,
    concurrency: Vec<u32>,
    batches: Vec<u32>,
    lease_rows: Vec<u32>,
    /// The MultiXact counter as computed from `mxid_age` and as written by a CHECKPOINT, at the end of the
    /// run (they agree when the method is right; `null` without the privilege to CHECKPOINT).
    multixact_crosscheck: Option<(u64, u64)>,
    /// `/proc/loadavg` at the start and the end: other work on the machine shows here.
    pub(super) load_average: (Option<String>, Option<String>),
}

pub(super) fn load_average() -> Option<String> {
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

pub(super) async fn environment(
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
            pgfence::connection::redact(&server.url)
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
