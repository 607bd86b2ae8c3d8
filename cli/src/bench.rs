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

mod environment;
mod leases;
mod pgbench;
mod plan;
mod plot;
mod progress;
mod renewal;
mod report;
mod server;
mod takeover;
mod timed;
mod workload;
mod writes;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;

use self::environment::{environment, load_average, Environment};
use self::leases::{measure_leases, setup_leases};
use self::pgbench::Pgbench;
use self::plan::Plan;
use self::progress::Progress;
use self::renewal::measure_renewal;
use self::report::{Collector, Measurement, RenewalCost, ServerCost, Target};
pub(crate) use self::server::connect_admin;
use self::server::{raw_config, Server};
use self::writes::{measure_writes, setup_writes};
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
    /// raw-fenced-pipelined, raw-guarded-update, guarded-update, raw-advisory-update, pgbench-fenced, append,
    /// append-unguarded, claim-transition, append-own-lease, raw-append, pgbench-append, effect-pair,
    /// event-pair, acquire, renew. Default: all.
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

    /// Start the throwaway server from the PostgreSQL binaries (initdb, pg_ctl, postgres) in this directory
    /// instead of PG_BIN's (or the ones found on PATH). Repeatable: the whole benchmark runs once per directory,
    /// one after the other on the same machine (e.g. Debian's 15 and a packaged 18, to compare versions in one
    /// command); --json and --plot then write one file per server, named with its major version
    /// (bench.json -> bench-pg18.json).
    #[arg(long, value_name = "DIR", conflicts_with = "yes")]
    pg_bin: Vec<PathBuf>,
}

pub(super) fn new_histogram() -> Histogram<u64> {
    // Microseconds from 1 µs to 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// A failure of the benchmark's own statements, with the error's sources (tokio-postgres shows "db error" and
/// keeps the server's message as its source).
pub(super) fn db_error(context: &str, e: impl std::error::Error) -> Failure {
    Failure::new(
        1,
        format!("{context}: {}", pgfence::connection::error_chain(&e)),
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
        server_time = writes::server_time(&setup).await?;
        if plan.takeovers > 0 {
            progress.phase(&format!(
                "{} takeovers per guard under {} busy writers",
                plan.takeovers,
                workload::TAKEOVER_WRITERS
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
    if args.pg_bin.is_empty() {
        return run_one(global, &args, None, args.json.clone(), args.plot.clone()).await;
    }
    if global.database_url.is_some() {
        return Err(Failure::new(
            2,
            "--pg-bin starts throwaway servers: it cannot be combined with --database-url",
        ));
    }
    // Every directory is checked before anything is measured: a wrong one fails at once, saying which.
    let mut servers = Vec::new();
    for dir in &args.pg_bin {
        let bin = pgfence::embedded::find_bin_dir_from(Some(dir.as_os_str()), None)
            .map_err(|e| Failure::new(2, format!("--pg-bin {}: {e}", dir.display())))?;
        let major = server_major(&bin).ok_or_else(|| {
            Failure::new(
                2,
                format!(
                    "--pg-bin {}: `postgres --version` answered no version",
                    dir.display()
                ),
            )
        })?;
        servers.push((bin, major));
    }
    let several = servers.len() > 1;
    for (bin, major) in &servers {
        let named = |path: &Option<PathBuf>| {
            path.as_ref().map(|p| {
                if several {
                    with_suffix(p, &format!("-pg{major}"))
                } else {
                    p.clone()
                }
            })
        };
        eprintln!("pgfence bench: PostgreSQL {major} from {}", bin.display());
        run_one(
            global,
            &args,
            Some(bin),
            named(&args.json),
            named(&args.plot),
        )
        .await?;
        if several {
            println!();
        }
    }
    Ok(())
}

/// The major version of the server binaries in `bin` (`postgres --version`: "postgres (PostgreSQL) 18.4").
fn server_major(bin: &std::path::Path) -> Option<String> {
    let out = std::process::Command::new(bin.join("postgres"))
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = text
        .split(") ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .to_owned();
    Some(version.split('.').next()?.to_owned())
}

/// `dir/name.ext` -> `dir/name<suffix>.ext`.
fn with_suffix(path: &std::path::Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}{suffix}.{}", ext.to_string_lossy()),
        None => format!("{stem}{suffix}"),
    };
    path.with_file_name(name)
}

/// One benchmark run: on the server of `pg_bin` (else PG_BIN's, or --database-url's), reports to stdout, `json`
/// and `plot`.
async fn run_one(
    global: &Global,
    args: &BenchArgs,
    pg_bin: Option<&PathBuf>,
    json: Option<PathBuf>,
    plot: Option<PathBuf>,
) -> CliResult {
    let started_at = chrono::Utc::now();
    let started = Instant::now();
    let load_at_start = load_average();
    if let Some(path) = &plot {
        if path.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err(Failure::new(
                2,
                "--plot writes SVG: give a path ending in .svg",
            ));
        }
    }
    let server_bin = match pg_bin {
        Some(bin) => Some(bin.clone()),
        None => pgfence::embedded::find_bin_dir().ok(),
    };
    let pgbench_exe = if args.no_pgbench {
        None
    } else {
        pgbench::find(server_bin.as_deref())
    };
    let mut plan = Plan::new(args, pgbench_exe.is_some())?;
    let mut server = match &global.database_url {
        Some(url) if !args.yes => {
            return Err(Failure::new(
                2,
                format!(
                    "bench writes: it creates scratch databases on {} and drops them at the end; repeat with \
                     --yes to run it there (without --database-url it starts a throwaway server)",
                    pgfence::connection::redact(url)
                ),
            ));
        }
        Some(url) => Server::remote(url, &plan).await?,
        None => {
            eprintln!("pgfence bench: starting a throwaway PostgreSQL server");
            Server::embedded(&plan, args.fsync, pg_bin.cloned()).await?
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
    if let Some(path) = &json {
        let text =
            serde_json::to_string_pretty(&document).map_err(|e| Failure::new(1, e.to_string()))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| Failure::new(1, format!("writing {}: {e}", path.display())))?;
    }
    if let Some(path) = &plot {
        let title = format!(
            "pgfence bench: PostgreSQL {}, {} cores, medians of {} interleaved rounds",
            document.environment.server_version, document.environment.cores, plan.rounds
        );
        plot::write_svg(path, &document.measurements, &title)
            .map_err(|e| Failure::new(1, format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}
