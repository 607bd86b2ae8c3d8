//! The `pgfence` command: the demos on an embedded default database, operator reads (status, audit, history,
//! identity) and writes (migrate, force-release, grants), the guarded-write benchmark, and `replica`, one replica
//! process of a spreading supervisor.
//!
//! A separate package of the workspace, so that a controller depending on the `pgfence` library compiles none of
//! the command line's crates (clap, the benchmark's histograms, progress bar and chart, tracing-subscriber).
#![forbid(unsafe_code)]

mod bench;
mod commands;
mod demo;
#[cfg(test)]
mod fixtures;
mod groups;
mod output;
mod replica;
mod rescue;
mod status;
mod svg;
mod table;
mod tasks;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use pgfence::sqlstate::SqlState;
use pgfence::{Error, ExpectedIdentity, Store, StoreConfig};

/// Fencing-token leases on PostgreSQL rows: epochs that the database checks on every write, and an audit of
/// the stale writes it refused.
#[derive(Debug, Parser)]
#[command(name = "pgfence", version, about, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    #[command(flatten)]
    global: Global,

    #[command(subcommand)]
    command: Command,
}

const EXIT_CODES: &str = "Exit codes: 0 ok; 1 unexpected error; 2 usage or bad input (incl. a malformed URL, a \
missing --yes, a role that grant and revoke refuse or that does not exist); \
3 database unreachable or refusing the connection; 4 standby or wrong database identity; 5 pgfence \
schema missing (run `pgfence migrate`); 6 unknown lease (or group: `status --group`); 7 a lock wait ended at its bound \
(the message names \
who blocks); 8 denied (no grant on the cluster, not an operator, a wrong tenure secret); 9 TLS refused the \
connection (the server's certificate failed verification, or the server offers no TLS that sslmode demands); \
10 demo verdict: an invariant was violated; 130 \
interrupted.";

#[derive(Debug, Args)]
struct Global {
    /// PostgreSQL connection string (URL or key=value). Credentials are never printed. `demo` starts a throwaway
    /// server when it is not given.
    ///
    /// TLS as in libpq: sslmode=disable|prefer (default)|require|verify-ca|verify-full, sslrootcert (a PEM CA
    /// file, or `system`), sslcert and sslkey, from the URL or else from PGSSLMODE, PGSSLROOTCERT, PGSSLCERT and
    /// PGSSLKEY. A TLS-only managed server:
    /// postgres://app@db.example.com/control?sslmode=verify-full&sslrootcert=/etc/ssl/certs/rds-ca.pem
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

    /// The cluster that qualifies lease names given without one (`NAME` means `CLUSTER/NAME`).
    #[arg(
        long,
        env = "PGFENCE_CLUSTER",
        default_value = "default",
        global = true
    )]
    cluster: String,

    /// Refuse the database unless its system identifier is this (see `pgfence identity`).
    #[arg(long, global = true)]
    expect_system_identifier: Option<String>,

    /// Refuse the database unless its pgfence instance id is this (see `pgfence identity`).
    #[arg(long, global = true)]
    expect_instance_id: Option<String>,

    /// How long to wait for the database when connecting.
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration)]
    connect_timeout: Duration,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the story of pgfence in about ten seconds: two controllers, a frozen leader, a takeover, and the
    /// database refusing (and auditing) the old leader's write. Exits 0 only if every invariant held.
    ///
    /// `--scenario spread` instead runs replica processes (`pgfence replica`) that spread six controllers over
    /// their group: a split, a replica joining, one killed, and a drain that overruns its handover.
    Demo {
        /// Which story: `takeover` (a frozen leader and its successor), `spread` (replicas sharing
        /// controllers) or `rescue` (work in flight when leadership moves).
        #[arg(long, value_enum, default_value_t = demo::Scenario::Takeover)]
        scenario: demo::Scenario,
        /// Print the closing report as JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// `rescue` only: after the story, throw faults at the leaders of several leases until this many
        /// handovers happened, then judge everything (0: the story alone).
        #[arg(long, value_name = "N", default_value_t = 0)]
        handovers: u32,
        #[command(flatten)]
        fleet: demo::FleetArgs,
    },
    /// Every lease: holder, epoch, held/expired/released, time left (database clock), transitions, last write;
    /// then every replica group: its members, the names each leads and the names the group's assignment gives
    /// it.
    ///
    /// Readable at any size: above 50 leases the leases are summed up per cluster (held, expired, released,
    /// distinct holders and those holding the most), and a group of more than 50 names or members gets one line
    /// of counts per member instead of its name lists. --group, --lease and --all go deeper; --json is
    /// complete whatever the size. See docs/cli.md.
    Status(status::StatusArgs),
    /// Stale writes the database refused, newest first (`audit prune` removes old ones).
    #[command(args_conflicts_with_subcommands = true)]
    Audit {
        #[command(subcommand)]
        action: Option<AuditAction>,
        /// Only this lease (`CLUSTER/NAME`, or `NAME` in --cluster).
        #[arg(long)]
        lease: Option<String>,
        /// Only rejections at or after this time (RFC 3339, e.g. 2026-11-30T10:00:00Z).
        #[arg(long)]
        since: Option<DateTime<Utc>>,
        /// At most this many rows.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The overlap review of one lease: each tenure by the database and by its holder, and whether the holder
    /// believed it led after its successor's acquisition.
    ///
    /// Per tenure, oldest first: the database's interval (database clock) beside the holder's reported belief
    /// (holder clock; "unknown" where no report arrived: a killed holder never reports its end), the endpoint
    /// as each side saw it, where the belief's end lies on the database's clock, the clock offset bounds, the
    /// last accepted write and the verdict: CERTAIN, POSSIBLE, none or UNKNOWN. Overlaps are flagged (`!!`)
    /// with the writes the database accepted in the window (0, or FENCE BROKEN) and the refusals it audited.
    /// Under each tenure, the effects it intended (outcome, settlement, in doubt, late reports) and those it
    /// settled, when the effect ledger has any. All times UTC. See docs/cli.md.
    History {
        /// The lease (`CLUSTER/NAME`, or `NAME` in --cluster).
        #[arg(long)]
        lease: String,
        /// Print the review as JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also write a timeline picture of the tenures to this SVG file.
        #[arg(long, value_name = "FILE")]
        svg: Option<std::path::PathBuf>,
    },
    /// The effect ledger: the effects in doubt that a successor has to settle (`--in-doubt`), or every attempt
    /// of one task's effects (`--lease L --task K`).
    ///
    /// An effect is in doubt when a tenure recorded its intent (before calling an external system) and ended
    /// without recording its outcome, or recorded `unknown`: the call may or may not have happened. Each row
    /// shows the lease, task, effect key (the idempotency key to ask the external system about), attempt, the
    /// epoch and holder of the tenure that left it, how and when that tenure ended, its last accepted write,
    /// any late report (an outcome the old tenure sent after it ended: refused as a write, kept as evidence)
    /// and the intent. Times UTC, database clock. See docs/cli.md.
    #[command(group(clap::ArgGroup::new("listing").required(true).args(["in_doubt", "task"])))]
    Tasks {
        /// List the effects in doubt: of --lease, or else of every lease of every cluster the role may read.
        #[arg(long)]
        in_doubt: bool,
        /// Only this lease (`CLUSTER/NAME`, or `NAME` in --cluster); required with --task.
        #[arg(long)]
        lease: Option<String>,
        /// List every attempt of this task's effects (settled or not), oldest first; needs --lease.
        #[arg(long, requires = "lease", value_name = "KEY")]
        task: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The database identity: system identifier, database, pgfence instance id, primary or standby.
    Identity {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Create or upgrade the pgfence schema (idempotent; concurrent runs take turns).
    Migrate,
    /// Grant a role the application rights on clusters (acquire, renew, release, guarded writes, reading their
    /// rows; no direct table writes), or with --operator also force-release there (and, with --all-clusters,
    /// enforcement, takeover grace and audit retention). Run as the role that migrated. PUBLIC, pseudo-roles,
    /// pg_* roles, superusers, BYPASSRLS roles and the owner (or its members) are refused (exit 2).
    Grant {
        /// The role to grant to (it must exist: CREATE ROLE is the DBA's job).
        #[arg(long)]
        role: String,
        /// A cluster the role may use (repeat for several).
        #[arg(
            long = "on-cluster",
            value_name = "CLUSTER",
            required_unless_present = "all_clusters"
        )]
        clusters: Vec<String>,
        /// Every cluster, present and future, instead of --on-cluster.
        #[arg(long, conflicts_with = "clusters")]
        all_clusters: bool,
        /// Also grant the operator rights.
        #[arg(long)]
        operator: bool,
    },
    /// Remove a role's grant of clusters (once it has none left, also its privileges on pgfence's objects).
    /// Refuses the roles grant refuses (exit 2), the owner among them: its own privileges are not revoked.
    Revoke {
        /// The role.
        #[arg(long)]
        role: String,
        /// A cluster to revoke (repeat for several).
        #[arg(
            long = "on-cluster",
            value_name = "CLUSTER",
            required_unless_present = "all_clusters"
        )]
        clusters: Vec<String>,
        /// The role's every-cluster grant instead of --on-cluster.
        #[arg(long, conflicts_with = "clusters")]
        all_clusters: bool,
    },
    /// Measure what fencing costs: guarded writes against the unguarded write, raw prepared statements and
    /// pgbench, in interleaved rounds (on a throwaway server unless --database-url and --yes are given).
    Bench(bench::BenchArgs),
    /// Run one replica of a spreading supervisor until SIGTERM or SIGINT: it joins a group, leads the names the
    /// group's assignment gives it and prints one JSON event per line on stdout (joined, lead, stop, write,
    /// returned, exit). For trying pgfence and for tests that need real processes; see docs/cli.md.
    Replica(replica::ReplicaArgs),
    /// One controller process of the rescue story and its fault test: leads a lease and calls the workload
    /// engine for each task under the effect ledger (see `pgfence demo --scenario rescue`).
    #[command(hide = true)]
    RescueWorker(rescue::RescueWorkerArgs),
    /// End the current tenure of a lease so its epoch can no longer write (the holder is fenced).
    ForceRelease {
        /// The lease (`CLUSTER/NAME`, or `NAME` in --cluster).
        name: String,
        /// Confirm: this cuts off the current leader.
        #[arg(long)]
        yes: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum AuditAction {
    /// Delete audit rows last seen longer ago than --older-than, in bounded batches (short transactions).
    Prune {
        /// Age, e.g. 30d, 12h, 90m.
        #[arg(long, value_parser = parse_age)]
        older_than: Duration,
        /// Rows per batch.
        #[arg(long, default_value_t = 10_000)]
        batch: u32,
    },
}

fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("not an age: {text:?} (try 30d, 12h, 90m)"))?;
    let unit_seconds = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err(format!("unknown unit {unit:?} (d, h, m, s)")),
    };
    value
        .checked_mul(unit_seconds)
        .filter(|s| *s <= 100 * 365 * 86_400)
        .map(Duration::from_secs)
        .ok_or_else(|| "age too large".to_owned())
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((text, "s"), |i| text.split_at(i));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (try 5s or 500ms)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit {unit:?} (ms, s, m)")),
    };
    if !(seconds > 0.0 && seconds < 3600.0) {
        return Err("must be between 0 and 1 hour".to_owned());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A failure with the exit code the CLI documents.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Failure {
        let code = match &err {
            Error::InvalidUrl { .. } | Error::InvalidInput { .. } => 2,
            // The role named to grant or revoke does not exist: bad input.
            Error::Database {
                sqlstate: Some(SqlState::UndefinedObject),
                message,
                ..
            } if message.starts_with("pgfence: role ") => 2,
            Error::Connect { .. } | Error::PoolTimeout { .. } => 3,
            Error::NotPrimary { .. } | Error::WrongDatabase { .. } => 4,
            Error::SchemaMissing => 5,
            // A bounded lock wait ended; the message names the blocking backends.
            e if matches!(
                e.sqlstate(),
                Some(SqlState::LockWaitEnded | SqlState::LockNotAvailable)
            ) =>
            {
                7
            }
            // The role may not do this (no grant on the cluster, not an operator, a wrong tenure secret).
            Error::Denied { .. } => 8,
            // The server's certificate failed verification, or the server offers no TLS that sslmode demands.
            Error::Tls { .. } => 9,
            e if e.sqlstate() == Some(SqlState::InsufficientPrivilege) => 8,
            _ => 1,
        };
        Failure::new(code, err.to_string())
    }
}

impl From<pgfence::embedded::EmbeddedError> for Failure {
    fn from(err: pgfence::embedded::EmbeddedError) -> Failure {
        Failure::new(
            1,
            format!("cannot start the embedded PostgreSQL server: {err}"),
        )
    }
}

type CliResult = Result<(), Failure>;

impl Global {
    fn url(&self) -> Result<&str, Failure> {
        self.database_url.as_deref().ok_or_else(|| {
            Failure::new(
                2,
                "this command needs a database: pass --database-url or set DATABASE_URL",
            )
        })
    }

    fn config(&self, url: &str, cluster: &str) -> StoreConfig {
        StoreConfig::new(url, cluster)
            .pool_size(2)
            .connect_timeout(self.connect_timeout)
            .checkout_timeout(self.connect_timeout)
            .application_name("pgfence-cli")
            .expect(ExpectedIdentity {
                system_identifier: self.expect_system_identifier.clone(),
                instance_id: self.expect_instance_id.clone(),
                database: None,
            })
    }

    async fn store(&self, cluster: &str) -> Result<Store, Failure> {
        let url = self.url()?;
        Ok(Store::connect(self.config(url, cluster)).await?)
    }
}

/// Splits `CLUSTER/NAME`; a bare `NAME` belongs to `default_cluster`.
pub(crate) fn split_lease(lease: &str, default_cluster: &str) -> (String, String) {
    match lease.split_once('/') {
        Some((cluster, name)) if !cluster.is_empty() => (cluster.to_owned(), name.to_owned()),
        _ => (default_cluster.to_owned(), lease.to_owned()),
    }
}

/// Fails with exit code 6 unless the lease exists.
pub(crate) async fn require_lease(store: &Store, name: &str) -> CliResult {
    if store.lease_status(name).await?.is_none() {
        return Err(Failure::new(
            6,
            format!("unknown lease {}/{name}", store.admin().cluster()),
        ));
    }
    Ok(())
}

async fn run(cli: Cli) -> CliResult {
    let global = &cli.global;
    match cli.command {
        Command::Demo {
            scenario,
            json,
            handovers,
            fleet,
        } => demo::run(global, scenario, json, handovers, fleet).await,
        Command::Bench(args) => bench::run(global, args).await,
        Command::Replica(args) => replica::run(global, args).await,
        Command::RescueWorker(args) => rescue::run(global, args).await,
        Command::Status(args) => status::status(global, args).await,
        Command::Audit {
            action: Some(AuditAction::Prune { older_than, batch }),
            ..
        } => commands::audit_prune(global, older_than, batch).await,
        Command::Grant {
            role,
            clusters,
            all_clusters,
            operator,
        } => commands::grant(global, role, clusters, all_clusters, operator).await,
        Command::Revoke {
            role,
            clusters,
            all_clusters,
        } => commands::revoke(global, role, clusters, all_clusters).await,
        Command::Audit {
            action: None,
            lease,
            since,
            limit,
            json,
        } => commands::audit(global, lease, since, limit, json).await,
        Command::History {
            lease,
            json,
            svg: picture,
        } => commands::history(global, lease, json, picture).await,
        Command::Tasks {
            in_doubt,
            lease,
            task,
            json,
        } => {
            let listing = match task {
                Some(task) if !in_doubt => tasks::Listing::Task {
                    lease: lease.unwrap_or_default(),
                    task,
                },
                _ => tasks::Listing::InDoubt { lease },
            };
            tasks::tasks(global, listing, json).await
        }
        Command::Identity { json } => commands::identity(global, json).await,
        Command::Migrate => commands::migrate(global).await,
        Command::ForceRelease { name, yes, json } => {
            commands::force_release(global, name, yes, json).await
        }
    }
}

/// Parses the command line, runs it, prints a one-line error on failure and returns the documented exit code.
/// Log output (`PGFENCE_LOG`, an `EnvFilter` directive; errors only by default) goes to stderr.
fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PGFENCE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log written to a file or a journal holds no escape sequences.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    // A replica handles SIGINT itself, as an orderly stop (exit 0); every other command ends at once (130).
    let interruptible = !matches!(cli.command, Command::Replica(_) | Command::RescueWorker(_));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("pgfence: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(async {
        if !interruptible {
            return run(cli).await;
        }
        tokio::select! {
            result = run(cli) => result,
            _ = tokio::signal::ctrl_c() => Err(Failure::new(130, "interrupted")),
        }
    });
    // Dropping the runtime ends background tasks; an embedded server was dropped with `run`'s future.
    drop(runtime);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let _ = std::io::stdout().flush();
            // The message may quote stored values (a holder, a lease name, a server's error text): escaped like
            // them, on one line.
            let _ = writeln!(
                std::io::stderr(),
                "pgfence: {}",
                table::escape(&failure.message, table::MESSAGE_CHARS)
            );
            ExitCode::from(failure.code)
        }
    }
}
