//! `pgfence demo --scenario fleet`: a fleet of real `pgfence replica` processes sharing one sharded controller,
//! measured. `--replicas M` replicas are started one every 100 ms (a rolling deploy), each able to lead all
//! `--names S` shards; the scenario then measures, from the database and the operating system:
//!
//! - **convergence**: how long after the last start every shard is led and every replica leads ⌊S/M⌋ or ⌈S/M⌉;
//! - **stability**: that no tenure begins for `--stable` afterwards (nothing moves while nothing changes);
//! - **steady-state server work**: statements per second and the server time of each replica's renewal
//!   statement (its heartbeat and its leases in one), from `pg_stat_statements`, and client connections;
//! - **memory**: each replica's resident set;
//! - **a kill**: one replica SIGKILLed: how long until each of its shards is led again, and whether any other
//!   shard moved;
//! - **a stop**: one replica SIGTERMed: the gap of each of its handovers (release to the successor's
//!   acquisition, database clock), p50/p99/max;
//! - **a join**: a new replica: how long until it leads its quota, and how many shards moved.
//!
//! It prints a table (or `--json`) and, with `--plot FILE`, the number of shards led over time as SVG. Every
//! figure is measured in this run: nothing is assumed. docs/leadership.md ("Fleets") has the figures and the
//! command.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use pgfence::embedded::{EmbeddedOptions, EmbeddedServer};
use serde::Serialize;

use super::{admin_store, child_flags, Narrator};
use crate::{CliResult, Failure, Global};

mod report;
use report::{plot, print_report};

/// The group of the fleet, and its sharded controller's name.
const GROUP: &str = "fleet";
const SHARDED: &str = "shard";
/// The spacing of a rolling start.
const START_EVERY: Duration = Duration::from_millis(100);
/// How often the database is sampled while waiting for something.
const SAMPLE: Duration = Duration::from_millis(250);

/// What the fleet scenario is asked to do.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct FleetArgs {
    /// `fleet` only: how many replica processes.
    #[arg(long, value_name = "M", default_value_t = 10)]
    pub(crate) replicas: u32,
    /// `fleet` only: how many shards (names) the group leads.
    #[arg(long, value_name = "S", default_value_t = 1000)]
    pub(crate) names: u32,
    /// `fleet` only: the lease and membership ttl of the replicas.
    #[arg(long = "fleet-ttl", value_name = "DURATION", default_value = "15s", value_parser = crate::parse_duration)]
    pub(crate) ttl: Duration,
    /// `fleet` only: how long the converged fleet is watched for a name that moves (and its server work
    /// measured).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::parse_duration)]
    pub(crate) stable: Duration,
    /// `fleet` only: how long to wait for convergence before giving up.
    #[arg(long, value_name = "DURATION", default_value = "300s", value_parser = crate::parse_duration)]
    pub(crate) within: Duration,
    /// `fleet` only: write the number of names led over time as an SVG picture to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// `fleet` only: keep each replica's warnings and errors in this directory, one `<member>.log` each (by
    /// default they go to a temporary directory removed at the end; the report counts them either way).
    #[arg(long, value_name = "DIR")]
    pub(crate) replica_logs: Option<std::path::PathBuf>,
}

/// The scenario's figures.
#[derive(Debug, Default, Serialize)]
pub(crate) struct FleetReport {
    replicas: u32,
    names: u32,
    ttl_ms: u128,
    /// From the last start to balanced (every name led, every replica within its quota).
    converged_ms: Option<u128>,
    /// From the first start to balanced: every statement's calls and server time, and the statements with the
    /// most server time (calls, total server ms, the statement) — where the convergence went.
    converging_calls: f64,
    converging_server_ms: f64,
    converging_statements: Vec<(f64, f64, String)>,
    /// The convergence's timeline (seconds after the last start, database clock): when the group's assignments
    /// were first and last stored before it balanced and how many were stored, and when the fleet's tenures
    /// began (the first, the median, the 90th percentile, the last) and how many began (a name taken more than
    /// once counts each time: above the names is churn).
    first_assignment_s: Option<f64>,
    last_assignment_s: Option<f64>,
    assignments_stored: i64,
    tenures_until_balanced: i64,
    tenure_starts_s: Vec<f64>,
    /// Tenures begun during the stable window (0: nothing moved).
    moved_while_stable: i64,
    stable_ms: u128,
    /// Statements per second over the stable window, every backend.
    statements_per_s: f64,
    /// Mean server time of one renewal statement (a replica's heartbeat and leases), and how many ran.
    renewal_ms: Option<f64>,
    renewal_calls: i64,
    /// Server time of every statement per second of the window.
    server_ms_per_s: f64,
    /// The statements of the window with the most calls: (calls per second, mean server ms, the statement).
    top_statements: Vec<(f64, f64, String)>,
    /// Client backends of the replicas at steady state: total, and the most of one replica.
    connections: i64,
    connections_max_per_replica: i64,
    /// Resident memory of the replicas, MiB: median and max.
    rss_median_mib: f64,
    rss_max_mib: f64,
    /// SIGKILL of one replica: its names, and how long until each is led again (the last of them).
    killed_names: usize,
    killed_releds_ms: Option<u128>,
    /// Names that moved although their leader was not the one killed.
    moved_by_kill: i64,
    /// SIGTERM of one replica: its names and their handover gaps (release → acquisition), ms.
    stopped_names: usize,
    handover_p50_ms: Option<f64>,
    handover_p99_ms: Option<f64>,
    handover_max_ms: Option<f64>,
    /// A replica joining: how long until it leads its quota, and how many names moved.
    join_ms: Option<u128>,
    join_led: usize,
    moved_by_join: i64,
    /// Lines the replicas logged at warning and error level over the whole run (a fleet that converges and
    /// hands over cleanly logs none: an orderly stop is logged at info level), and the most frequent message
    /// with its count.
    replica_warnings: u64,
    replica_errors: u64,
    most_logged: Option<(u64, String)>,
    /// (seconds since the first start, names led) samples.
    #[serde(skip)]
    samples: Vec<(f64, u64)>,
    /// (seconds since the first start, the group's assignment generation) samples, while converging.
    #[serde(skip)]
    generations: Vec<(f64, i64)>,
}

/// A replica process.
struct Replica {
    member: String,
    child: tokio::process::Child,
}

/// The running fleet and what measures it.
struct Fleet {
    exe: std::path::PathBuf,
    url: String,
    flags: Vec<String>,
    args: FleetArgs,
    replicas: Vec<Replica>,
    admin: tokio_postgres::Client,
    qualified_group: String,
    cluster: String,
    began: Instant,
    /// Where each replica's log goes (`<member>.log`), and the temporary directory that holds it when no
    /// `--replica-logs` was given.
    logs: std::path::PathBuf,
    _logs_dir: Option<tempfile::TempDir>,
}

impl Fleet {
    fn spawn(&mut self, member: &str) -> Result<(), Failure> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let path = self.logs.join(format!("{member}.log"));
        let log = std::fs::File::create(&path)
            .map_err(|e| Failure::new(1, format!("cannot create {}: {e}", path.display())))?;
        let child = tokio::process::Command::new(&self.exe)
            .args(&self.flags)
            .args(["replica", "--group", GROUP, "--member", member])
            .args([
                "--sharded",
                SHARDED,
                "--shards",
                &self.args.names.to_string(),
            ])
            .args(["--ttl", &ms(self.args.ttl), "--grace", "1s"])
            // The URL travels in the environment, never on a command line that `ps` shows.
            .env("DATABASE_URL", &self.url)
            .env_remove("PGFENCE_CLUSTER")
            .env("PGFENCE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Failure::new(1, format!("cannot start a replica: {e}")))?;
        self.replicas.push(Replica {
            member: member.to_owned(),
            child,
        });
        Ok(())
    }

    async fn query(&self, sql: &str) -> Result<Vec<tokio_postgres::Row>, Failure> {
        self.admin
            .query(sql, &[])
            .await
            .map_err(|e| Failure::new(1, format!("fleet: {e}")))
    }

    /// Names led now by each live member (assigned names it holds).
    async fn leads(&self) -> Result<BTreeMap<String, BTreeSet<String>>, Failure> {
        let rows = self
            .admin
            .query(
                "SELECT member, leads FROM pgfence.group_members WHERE \"group\" = $1 AND live",
                &[&self.qualified_group],
            )
            .await
            .map_err(|e| Failure::new(1, format!("fleet: {e}")))?;
        Ok(rows
            .iter()
            .map(|r| {
                let leads: Vec<String> = r.get(1);
                (r.get::<_, String>(0), leads.into_iter().collect())
            })
            .collect())
    }

    /// Whether `leads` is balanced over `members` live replicas: every name led, each within ⌊S/M⌋..⌈S/M⌉.
    fn balanced(&self, leads: &BTreeMap<String, BTreeSet<String>>, members: usize) -> bool {
        let s = self.args.names as usize;
        let (low, high) = (s / members, s.div_ceil(members));
        leads.len() == members
            && leads.values().map(BTreeSet::len).sum::<usize>() == s
            && leads.values().all(|l| (low..=high).contains(&l.len()))
    }

    /// Samples until balanced over `members` replicas or `within` passes (the names led, and each new
    /// generation of the group's assignment); the time it took.
    async fn until_balanced(
        &self,
        members: usize,
        within: Duration,
        report: &mut FleetReport,
    ) -> Result<Option<Duration>, Failure> {
        let started = Instant::now();
        while started.elapsed() < within {
            let leads = self.leads().await?;
            let led: usize = leads.values().map(BTreeSet::len).sum();
            let at = self.began.elapsed().as_secs_f64();
            report.samples.push((at, led as u64));
            let generation = self
                .admin
                .query_opt(
                    "SELECT generation FROM pgfence.groups WHERE grp = $1",
                    &[&self.qualified_group],
                )
                .await
                .map_err(|e| Failure::new(1, format!("fleet: {e}")))?
                .map_or(0, |r| r.get::<_, i64>(0));
            if report.generations.last().is_none_or(|g| g.1 != generation) {
                report.generations.push((at, generation));
            }
            if self.balanced(&leads, members) {
                return Ok(Some(started.elapsed()));
            }
            tokio::time::sleep(SAMPLE).await;
        }
        Ok(None)
    }

    /// The database's clock now, as text (for comparisons with the tenures' times, never with this machine's).
    async fn db_now(&self) -> Result<String, Failure> {
        Ok(self.query("SELECT clock_timestamp()::text").await?[0].get(0))
    }

    /// Tenures of the fleet's names begun after `since` (database clock), optionally only of `names`.
    async fn tenures_since(
        &self,
        since: String,
        names: Option<&BTreeSet<String>>,
    ) -> Result<i64, Failure> {
        let prefix = format!("{}/{SHARDED}/", self.cluster);
        let rows = self
            .admin
            .query(
                "SELECT lease FROM pgfence.tenures WHERE acquired_at > $1::text::timestamptz AND starts_with(lease, $2)",
                &[&since, &prefix],
            )
            .await
            .map_err(|e| Failure::new(1, format!("fleet: {e}")))?;
        Ok(rows
            .iter()
            .filter(|r| {
                let lease: String = r.get(0);
                names.is_none_or(|n| n.contains(&lease[self.cluster.len() + 1..]))
            })
            .count() as i64)
    }

    fn pid_of(&self, member: &str) -> Option<u32> {
        self.replicas
            .iter()
            .find(|r| r.member == member)
            .and_then(|r| r.child.id())
    }

    async fn signal(&mut self, member: &str, signal: &str) -> Result<(), Failure> {
        let pid = self
            .pid_of(member)
            .ok_or_else(|| Failure::new(1, format!("fleet: replica {member} is not running")))?;
        let status = tokio::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .await
            .map_err(|e| Failure::new(1, format!("fleet: kill: {e}")))?;
        if !status.success() {
            return Err(Failure::new(
                1,
                format!("fleet: kill {signal} {pid} failed"),
            ));
        }
        Ok(())
    }

    async fn reap(&mut self, member: &str) {
        if let Some(i) = self.replicas.iter().position(|r| r.member == member) {
            let mut replica = self.replicas.remove(i);
            let _ = tokio::time::timeout(Duration::from_secs(30), replica.child.wait()).await;
        }
    }
}

/// Resident memory of a process, MiB (Linux: /proc/PID/status), if readable.
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    Some(sorted[rank.min(sorted.len() - 1)])
}

pub(super) async fn run(
    global: &Global,
    story: &Narrator,
    url: Option<String>,
    args: FleetArgs,
    json: bool,
) -> CliResult {
    if args.replicas < 2 || args.names < args.replicas {
        return Err(Failure::new(
            2,
            "--replicas must be at least 2 and --names at least --replicas",
        ));
    }
    let (server, url, cluster) = server(global, story, url, &args).await?;
    let _server = server;
    let admin_store = admin_store(global, &url, &cluster).await?;
    drop(admin_store);
    let admin = crate::bench::connect_admin(&url).await?;
    let statements = admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .is_ok();
    let exe = std::env::current_exe().map_err(|e| Failure::new(1, e.to_string()))?;
    let (logs, logs_dir) = match &args.replica_logs {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| Failure::new(1, format!("cannot create {}: {e}", dir.display())))?;
            (dir.clone(), None)
        }
        None => {
            let dir = tempfile::tempdir().map_err(|e| Failure::new(1, e.to_string()))?;
            (dir.path().to_owned(), Some(dir))
        }
    };
    let mut fleet = Fleet {
        exe,
        url: url.clone(),
        flags: child_flags(global, &cluster),
        qualified_group: format!("{cluster}/{GROUP}"),
        cluster,
        args: args.clone(),
        replicas: Vec::new(),
        admin,
        began: Instant::now(),
        logs,
        _logs_dir: logs_dir,
    };
    let mut report = FleetReport {
        replicas: args.replicas,
        names: args.names,
        ttl_ms: args.ttl.as_millis(),
        stable_ms: args.stable.as_millis(),
        ..FleetReport::default()
    };
    let result = measure(&mut fleet, &mut report, story, statements).await;
    for replica in &mut fleet.replicas {
        let _ = replica.child.start_kill();
    }
    report::count_logs(&fleet.logs, &mut report);
    result?;
    if let Some(path) = &args.plot {
        plot(path, &report.samples)?;
    }
    if json {
        crate::output::print_json(&report)?;
    } else {
        print_report(&report);
    }
    if report.converged_ms.is_none() {
        return Err(Failure::new(1, "the fleet did not converge"));
    }
    Ok(())
}

/// The database of the scenario: the one given (with pg_stat_statements if it has it), or a throwaway server
/// sized for the fleet (fsync off, connections for every replica, pg_stat_statements loaded).
async fn server(
    global: &Global,
    story: &Narrator,
    url: Option<String>,
    args: &FleetArgs,
) -> Result<(Option<EmbeddedServer>, String, String), Failure> {
    if let Some(url) = url {
        let cluster = format!("fleet-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%3f"));
        return Ok((None, url, cluster));
    }
    let mut options = EmbeddedOptions::default();
    // A replica opens at most 4 (its listener, its renewal connection, a pool of 2) while it converges.
    let connections = (args.replicas as u64 * 4 + 60).max(200);
    options.extra_settings = vec![
        ("max_connections".into(), connections.to_string()),
        (
            "shared_preload_libraries".into(),
            "pg_stat_statements".into(),
        ),
        ("synchronous_commit".into(), "off".into()),
    ];
    let _ = global;
    story.say(
        "setup",
        format!("starting a throwaway PostgreSQL server (max_connections {connections})"),
    );
    let server = tokio::task::spawn_blocking(move || EmbeddedServer::start_with(options))
        .await
        .map_err(|e| Failure::new(1, e.to_string()))??;
    let url = server.url();
    Ok((Some(server), url, "fleet".to_owned()))
}

/// The scenario's steps, in order; each fills its part of `report`.
async fn measure(
    fleet: &mut Fleet,
    report: &mut FleetReport,
    story: &Narrator,
    statements: bool,
) -> Result<(), Failure> {
    let m = fleet.args.replicas as usize;
    story.say(
        "fleet",
        format!(
            "starting {m} replicas, one every {START_EVERY:?}, each able to lead {} shards",
            fleet.args.names
        ),
    );
    if statements {
        fleet.query("SELECT pg_stat_statements_reset()").await?;
    }
    let first_start = fleet.db_now().await?;
    for i in 0..m {
        fleet.spawn(&format!("r{i:03}"))?;
        tokio::time::sleep(START_EVERY).await;
    }
    let last_start = fleet.db_now().await?;
    let last_started = fleet.began.elapsed().as_secs_f64();
    let within = fleet.args.within;
    let took = fleet.until_balanced(m, within, report).await?;
    report::timeline(fleet, report, &first_start, &last_start).await?;
    report.first_assignment_s = report
        .generations
        .iter()
        .find(|g| g.1 > 0)
        .map(|g| g.0 - last_started);
    report.converged_ms = took.map(|t| t.as_millis());
    let Some(took) = took else {
        story.say("fleet", format!("not balanced within {within:?}"));
        return Ok(());
    };
    story.say("fleet", format!("balanced {took:?} after the last start"));
    if statements {
        (
            report.converging_calls,
            report.converging_server_ms,
            report.converging_statements,
        ) = report::statement_profile(fleet).await?;
    }
    steady(fleet, report, story, statements).await?;
    kill(fleet, report, story).await?;
    stop(fleet, report, story).await?;
    join(fleet, report, story).await
}

/// The stable window: nothing may move; the server's work, the connections and the memory are measured.
async fn steady(
    fleet: &mut Fleet,
    report: &mut FleetReport,
    story: &Narrator,
    statements: bool,
) -> Result<(), Failure> {
    let since = fleet.db_now().await?;
    if statements {
        fleet.query("SELECT pg_stat_statements_reset()").await?;
    }
    let window = Instant::now();
    let stable = fleet.args.stable;
    while window.elapsed() < stable {
        let leads = fleet.leads().await?;
        let led: usize = leads.values().map(BTreeSet::len).sum();
        report
            .samples
            .push((fleet.began.elapsed().as_secs_f64(), led as u64));
        tokio::time::sleep(Duration::from_secs(1).min(stable)).await;
    }
    let seconds = window.elapsed().as_secs_f64();
    report.moved_while_stable = fleet.tenures_since(since, None).await?;
    if statements {
        let rows = fleet
            .query(
                "SELECT coalesce(sum(calls), 0)::float8, coalesce(sum(total_exec_time), 0)::float8, \
                        coalesce(sum(calls) FILTER (WHERE query LIKE '%pgfence.heartbeat(%renew_many%'), 0)::int8, \
                        sum(total_exec_time) FILTER (WHERE query LIKE '%pgfence.heartbeat(%renew_many%')::float8 \
                   FROM pg_stat_statements",
            )
            .await?;
        let (calls, total, renewals, renewal_time): (f64, f64, i64, Option<f64>) = (
            rows[0].get(0),
            rows[0].get(1),
            rows[0].get(2),
            rows[0].get(3),
        );
        report.statements_per_s = calls / seconds;
        report.server_ms_per_s = total / seconds;
        report.renewal_calls = renewals;
        report.renewal_ms = renewal_time
            .filter(|_| renewals > 0)
            .map(|t| t / renewals as f64);
        let top = fleet
            .query(
                "SELECT calls::float8, mean_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 100) \
                   FROM pg_stat_statements ORDER BY calls DESC LIMIT 6",
            )
            .await?;
        report.top_statements = top
            .iter()
            .map(|r| (r.get::<_, f64>(0) / seconds, r.get(1), r.get(2)))
            .collect();
    }
    let members: Vec<String> = fleet.replicas.iter().map(|r| r.member.clone()).collect();
    let rows = fleet
        .admin
        .query(
            "SELECT application_name, count(*) FROM pg_stat_activity \
              WHERE application_name = ANY($1) GROUP BY 1",
            &[&members],
        )
        .await
        .map_err(|e| Failure::new(1, format!("fleet: {e}")))?;
    report.connections = rows.iter().map(|r| r.get::<_, i64>(1)).sum();
    report.connections_max_per_replica = rows.iter().map(|r| r.get::<_, i64>(1)).max().unwrap_or(0);
    let mut rss: Vec<f64> = fleet
        .replicas
        .iter()
        .filter_map(|r| r.child.id().and_then(rss_mib))
        .collect();
    rss.sort_by(f64::total_cmp);
    report.rss_median_mib = percentile(&rss, 50.0).unwrap_or(0.0);
    report.rss_max_mib = rss.last().copied().unwrap_or(0.0);
    story.say(
        "fleet",
        format!(
            "stable for {stable:?}: {} tenures began; {:.0} statements/s; {} connections",
            report.moved_while_stable, report.statements_per_s, report.connections
        ),
    );
    Ok(())
}

/// One replica SIGKILLed: its names must be led again by the others, and nothing else may move.
async fn kill(
    fleet: &mut Fleet,
    report: &mut FleetReport,
    story: &Narrator,
) -> Result<(), Failure> {
    let leads = fleet.leads().await?;
    let victim = fleet.replicas[0].member.clone();
    let names = leads.get(&victim).cloned().unwrap_or_default();
    report.killed_names = names.len();
    let since = fleet.db_now().await?;
    let killed = Instant::now();
    fleet.signal(&victim, "-KILL").await?;
    fleet.reap(&victim).await;
    let bound = fleet.args.ttl * 4 + Duration::from_secs(10);
    let others = fleet.replicas.len();
    let took = fleet.until_balanced(others, bound, report).await?;
    report.killed_releds_ms = took.map(|_| killed.elapsed().as_millis());
    let all = fleet.tenures_since(since.clone(), None).await?;
    let of_victim = fleet.tenures_since(since, Some(&names)).await?;
    report.moved_by_kill = all - of_victim;
    story.say(
        "fleet",
        format!(
            "killed {victim} ({} names): led again after {:?} ms; {} other names moved",
            names.len(),
            report.killed_releds_ms,
            report.moved_by_kill
        ),
    );
    Ok(())
}

/// One replica SIGTERMed: its names are handed over; the gap of each handover, by the database clock.
async fn stop(
    fleet: &mut Fleet,
    report: &mut FleetReport,
    story: &Narrator,
) -> Result<(), Failure> {
    let leads = fleet.leads().await?;
    let member = fleet.replicas[0].member.clone();
    let names = leads.get(&member).cloned().unwrap_or_default();
    report.stopped_names = names.len();
    fleet.signal(&member, "-TERM").await?;
    fleet.reap(&member).await;
    let bound = fleet.args.ttl * 4 + Duration::from_secs(10);
    let others = fleet.replicas.len();
    fleet.until_balanced(others, bound, report).await?;
    let leases: Vec<String> = names
        .iter()
        .map(|n| format!("{}/{n}", fleet.cluster))
        .collect();
    let rows = fleet
        .admin
        .query(
            "SELECT (extract(epoch FROM (t.acquired_at - p.ended_at)) * 1000)::float8 \
               FROM pgfence.tenures p JOIN pgfence.tenures t ON t.lease = p.lease AND t.epoch = p.epoch + 1 \
              WHERE p.lease = ANY($1) AND p.holder = $2 AND p.end_reason = 'released'",
            &[&leases, &member],
        )
        .await
        .map_err(|e| Failure::new(1, format!("fleet: {e}")))?;
    let mut gaps: Vec<f64> = rows.iter().map(|r| r.get::<_, f64>(0)).collect();
    gaps.sort_by(f64::total_cmp);
    report.handover_p50_ms = percentile(&gaps, 50.0);
    report.handover_p99_ms = percentile(&gaps, 99.0);
    report.handover_max_ms = gaps.last().copied();
    story.say(
        "fleet",
        format!(
            "stopped {member} ({} names, {} handed over): gap p50 {:?} ms, p99 {:?} ms",
            names.len(),
            gaps.len(),
            report.handover_p50_ms,
            report.handover_p99_ms
        ),
    );
    Ok(())
}

/// A replica joins: it takes its quota, and only that moves.
async fn join(
    fleet: &mut Fleet,
    report: &mut FleetReport,
    story: &Narrator,
) -> Result<(), Failure> {
    let since = fleet.db_now().await?;
    let joined = Instant::now();
    fleet.spawn("r-joined")?;
    let bound = fleet.args.ttl * 4 + Duration::from_secs(10);
    let members = fleet.replicas.len();
    let took = fleet.until_balanced(members, bound, report).await?;
    report.join_ms = took.map(|_| joined.elapsed().as_millis());
    report.join_led = fleet
        .leads()
        .await?
        .get("r-joined")
        .map_or(0, BTreeSet::len);
    report.moved_by_join = fleet.tenures_since(since, None).await?;
    story.say(
        "fleet",
        format!(
            "a replica joined: leads {} names after {:?} ms; {} tenures began",
            report.join_led, report.join_ms, report.moved_by_join
        ),
    );
    Ok(())
}
