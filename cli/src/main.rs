//! The `pgfence` command: the demos on an embedded default database, operator reads (status, audit, history,
//! identity) and writes (migrate, force-release, grants), the guarded-write benchmark, and `replica`, one replica
//! process of a spreading supervisor.
//!
//! A separate package of the workspace, so that a controller depending on the `pgfence` library compiles none of
//! the command line's crates (clap, the benchmark's histograms, progress bar and chart, tracing-subscriber).
#![forbid(unsafe_code)]

mod bench;
mod demo;
#[cfg(test)]
mod fixtures;
mod groups;
mod replica;
mod svg;
mod table;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use pgfence::{Error, ExpectedIdentity, ForceReleased, RejectionFilter, Store, StoreConfig};

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
schema missing (run `pgfence migrate`); 6 unknown lease; 7 a lock wait ended at its bound (the message names \
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
        /// Which story: `takeover` (a frozen leader and its successor) or `spread` (replicas sharing
        /// controllers).
        #[arg(long, value_enum, default_value_t = demo::Scenario::Takeover)]
        scenario: demo::Scenario,
        /// Print the closing report as JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Every lease: holder, epoch, held/expired/released, time left (database clock), transitions, last write;
    /// then every replica group: its members, the names each leads and the names the group's assignment gives
    /// it.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
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
    /// All times UTC. See docs/cli.md.
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

fn parse_duration(text: &str) -> Result<Duration, String> {
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
                sqlstate: Some(code),
                message,
                ..
            } if code == "42704" && message.starts_with("pgfence: role ") => 2,
            Error::Connect { .. } | Error::PoolTimeout { .. } => 3,
            Error::NotPrimary { .. } | Error::WrongDatabase { .. } => 4,
            Error::SchemaMissing => 5,
            // A bounded lock wait ended; the message names the blocking backends.
            e if matches!(e.sqlstate(), Some("PF003" | "55P03")) => 7,
            // The role may not do this (no grant on the cluster, not an operator, a wrong tenure secret).
            Error::Denied { .. } => 8,
            // The server's certificate failed verification, or the server offers no TLS that sslmode demands.
            Error::Tls { .. } => 9,
            e if e.sqlstate() == Some("42501") => 8,
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

/// Prints to stderr what the database's advisory-lock and role layout lacks (docs/security.md), one escaped
/// line each; what would stop pgfence is refused by `migrate` and `grant` themselves.
async fn warn_layout(store: &Store) -> CliResult {
    for problem in store.layout_problems().await? {
        let line = format!("{}. To fix: {}", problem.problem, problem.fix);
        eprintln!(
            "pgfence: warning: {}",
            table::escape(&line, table::MESSAGE_CHARS)
        );
    }
    Ok(())
}

/// Splits `CLUSTER/NAME`; a bare `NAME` belongs to `default_cluster`.
fn split_lease(lease: &str, default_cluster: &str) -> (String, String) {
    match lease.split_once('/') {
        Some((cluster, name)) if !cluster.is_empty() => (cluster.to_owned(), name.to_owned()),
        _ => (default_cluster.to_owned(), lease.to_owned()),
    }
}

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

/// Writes human output to standard output. A reader that went away (`pgfence status | head -1`) ends the
/// output quietly, where `println!` would panic; any other write error is exit 1.
fn emit(text: &str) -> CliResult {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::new(
            1,
            format!("cannot write to standard output: {e}"),
        )),
    }
}

/// `--json` output: pretty JSON that parses back to exactly the values read, with no character in it that a
/// terminal would act on.
fn print_json<T: serde::Serialize>(value: &T) -> CliResult {
    let mut text = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(
        &mut text,
        TerminalJson(serde_json::ser::PrettyFormatter::new()),
    );
    value
        .serialize(&mut serializer)
        .map_err(|e| Failure::new(1, e.to_string()))?;
    text.push(b'\n');
    // serde_json writes UTF-8 only.
    emit(&String::from_utf8_lossy(&text))
}

/// `value` as one line of JSON (no newline in it), escaped for terminals as `--json` output is: the event lines
/// of `pgfence replica`.
pub(crate) fn json_line<T: serde::Serialize>(value: &T) -> Result<String, Failure> {
    let mut text = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(
        &mut text,
        TerminalJson(serde_json::ser::CompactFormatter),
    );
    value
        .serialize(&mut serializer)
        .map_err(|e| Failure::new(1, e.to_string()))?;
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// A serde_json formatter (pretty for `--json`, compact for event lines), escaping for terminals: serde_json
/// itself writes the C0 controls, `"` and `\` as escapes; this writes every other terminal control (DEL, C1,
/// the bidirectional controls: see [`table::is_terminal_control`]) as `\uXXXX` too. JSON decodes those
/// escapes, so the strings stay exact.
struct TerminalJson<F>(F);

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for TerminalJson<F> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (at, c) in fragment.char_indices() {
            if table::is_terminal_control(c) {
                writer.write_all(&fragment.as_bytes()[start..at])?;
                for unit in c.encode_utf16(&mut [0; 2]) {
                    write!(writer, "\\u{unit:04x}")?;
                }
                start = at + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    // The layout is the inner formatter's.
    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_array(writer)
    }
    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_array(writer)
    }
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(writer, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(writer)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_object(writer)
    }
    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object(writer)
    }
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(writer, first)
    }
    fn end_object_key<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object_key(writer)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(writer)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(writer)
    }
}

/// `pgfence status --json`: every lease, then every replica group the role can read.
#[derive(serde::Serialize)]
struct StatusReport {
    leases: Vec<pgfence::LeaseStatus>,
    groups: Vec<groups::GroupView>,
}

/// Fails with exit code 6 unless the lease exists.
async fn require_lease(store: &Store, name: &str) -> CliResult {
    if store.lease_status(name).await?.is_none() {
        return Err(Failure::new(
            6,
            format!("unknown lease {}/{name}", store.cluster()),
        ));
    }
    Ok(())
}

async fn run(cli: Cli) -> CliResult {
    let global = &cli.global;
    match cli.command {
        Command::Demo { scenario, json } => demo::run(global, scenario, json).await,
        Command::Bench(args) => bench::run(global, args).await,
        Command::Replica(args) => replica::run(global, args).await,
        Command::Status { json } => {
            let store = global.store(&global.cluster).await?;
            let leases = store.all_leases().await?;
            let groups = groups::read(&store).await?;
            if json {
                return print_json(&StatusReport { leases, groups });
            }
            let mut text = table::leases(&leases);
            for group in &groups {
                text.push('\n');
                text.push_str(&table::group(group));
            }
            emit(&text)
        }
        Command::Audit {
            action: Some(AuditAction::Prune { older_than, batch }),
            ..
        } => {
            let store = global.store(&global.cluster).await?;
            let deleted = store.prune_rejections(older_than, batch).await?;
            emit(&format!(
                "deleted {deleted} audit rows last seen more than {older_than:?} ago\n"
            ))
        }
        Command::Grant {
            role,
            clusters,
            all_clusters,
            operator,
        } => {
            let store = global.store(&global.cluster).await?;
            let targets: Vec<Option<&str>> = if all_clusters {
                vec![None]
            } else {
                clusters.iter().map(|c| Some(c.as_str())).collect()
            };
            let rights = if operator { "operator" } else { "application" };
            for cluster in targets {
                if operator {
                    store.grant_operator(&role, cluster).await?;
                } else {
                    store.grant_application(&role, cluster).await?;
                }
                println!(
                    "granted {} the {rights} rights on {}",
                    role,
                    cluster
                        .map_or_else(|| "every cluster".to_owned(), |c| format!("cluster {}", c))
                );
            }
            warn_layout(&store).await
        }
        Command::Revoke {
            role,
            clusters,
            all_clusters,
        } => {
            let store = global.store(&global.cluster).await?;
            let targets: Vec<Option<&str>> = if all_clusters {
                vec![None]
            } else {
                clusters.iter().map(|c| Some(c.as_str())).collect()
            };
            for cluster in targets {
                let removed = store.revoke(&role, cluster).await?;
                let on = cluster
                    .map_or_else(|| "every cluster".to_owned(), |c| format!("cluster {}", c));
                if removed {
                    println!("revoked {}'s grant on {on}", role);
                } else {
                    println!("{} had no grant on {on}", role);
                }
            }
            Ok(())
        }
        Command::Audit {
            action: None,
            lease,
            since,
            limit,
            json,
        } => {
            if limit < 1 {
                return Err(Failure::new(2, "--limit must be at least 1"));
            }
            let (cluster, name) = match &lease {
                Some(lease) => {
                    let (cluster, name) = split_lease(lease, &global.cluster);
                    (cluster, Some(name))
                }
                None => (global.cluster.clone(), None),
            };
            let store = global.store(&cluster).await?;
            if let Some(name) = &name {
                require_lease(&store, name).await?;
            }
            let mut filter = RejectionFilter::default();
            filter.all_clusters = name.is_none();
            filter.lease = name;
            filter.since = since;
            filter.limit = Some(limit);
            let rows = store.rejections(&filter).await?;
            if json {
                return print_json(&rows);
            }
            emit(&table::rejections(&rows))
        }
        Command::History {
            lease,
            json,
            svg: picture,
        } => {
            let (cluster, name) = split_lease(&lease, &global.cluster);
            let store = global.store(&cluster).await?;
            require_lease(&store, &name).await?;
            let reviews = store.review(&name).await?;
            let qualified = format!("{cluster}/{name}");
            if let Some(path) = &picture {
                std::fs::write(path, svg::timeline(&qualified, &reviews)).map_err(|e| {
                    Failure::new(1, format!("cannot write {}: {e}", path.display()))
                })?;
            }
            if json {
                return print_json(&reviews);
            }
            emit(&table::review(&qualified, &reviews))
        }
        Command::Identity { json } => {
            let store = global.store(&global.cluster).await?;
            let identity = store.identity().await?;
            if json {
                return print_json(&identity);
            }
            emit(&table::identity(&identity, store.target()))
        }
        Command::Migrate => {
            let store = global.store(&global.cluster).await?;
            let applied = store.migrate().await?;
            warn_layout(&store).await?;
            let target = table::value(store.target());
            emit(&if applied.is_empty() {
                format!("pgfence schema is up to date on {target}\n")
            } else {
                format!(
                    "applied migrations on {target}: {}\n",
                    table::value(&applied.join(", "))
                )
            })
        }
        Command::ForceRelease { name, yes, json } => {
            let (cluster, name) = split_lease(&name, &global.cluster);
            if !yes {
                return Err(Failure::new(
                    2,
                    format!("force-release cuts off the current holder of {cluster}/{name}: repeat with --yes"),
                ));
            }
            let store = global.store(&cluster).await?;
            let outcome = store.force_release(&name).await?;
            if matches!(outcome, ForceReleased::Unknown) {
                return Err(Failure::new(6, format!("unknown lease {cluster}/{name}")));
            }
            if json {
                return print_json(&outcome);
            }
            let lease = table::value(&format!("{cluster}/{name}"));
            emit(&match outcome {
                ForceReleased::Ended { epoch, holder } => format!(
                    "ended epoch {epoch} of {lease} (held by {}); writes presenting it are refused now, \
                     and the next acquisition issues a larger epoch\n",
                    table::value(&holder)
                ),
                _ => format!("{lease} was not held; nothing changed\n"),
            })
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
        .init();
    let cli = Cli::parse();
    // A replica handles SIGINT itself, as an orderly stop (exit 0); every other command ends at once (130).
    let interruptible = !matches!(cli.command, Command::Replica(_));
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
