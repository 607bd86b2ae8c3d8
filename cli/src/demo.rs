//! `pgfence demo`: the main job in about ten seconds.
//!
//! Two controller instances (separate pools, separate `application_name`s, as two processes would have) contend
//! for one cluster-qualified lease. The leader creates and claims tasks, then freezes — no renewals, no writes,
//! as in a long GC pause or a partition — past its ttl. The other takes over with epoch + 1 and continues. The
//! frozen one wakes, still believing it leads, and writes with its old epoch: the database refuses and records
//! it. The report reads the tenures and the audit back from the database and checks the invariants.
//!
//! `--scenario spread` ([`spread`]) tells another story: replica processes sharing controllers; `--scenario rescue`
//! ([`rescue`]) the work in flight when leadership moves.

use std::io::Write;
use std::time::{Duration, Instant};

use pgfence::admin::{Rejection, RejectionFilter};
use pgfence::embedded::EmbeddedServer;
use pgfence::history::Tenure;
use pgfence::leader::{Elector, HeldLease, LeaseOptions, PgElector};
use pgfence::tasks::TaskState;
use pgfence::{Error, Fence, Store};
use serde::Serialize;
use serde_json::json;

use super::{table, CliResult, Failure, Global};

mod fleet;
mod rescue;
mod spread;

pub(crate) use fleet::FleetArgs;

/// The demo's stories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Scenario {
    /// Two controllers, a frozen leader, a takeover, the old leader's writes refused and audited.
    Takeover,
    /// Replica processes spreading six controllers: a split, a join, a kill, an overrunning drain.
    Spread,
    /// Work in flight when leadership moves: leaders frozen between an engine call and its outcome, successors
    /// that ask the engine by the effect key and confirm or retry, late outcomes refused and kept.
    Rescue,
    /// A fleet of replica processes sharing one sharded controller, measured: convergence after a rolling
    /// start, stability, server work, connections, memory, a kill, a stop and a join (`--replicas`, `--names`).
    Fleet,
}

const LEASE: &str = "scheduler";
const TTL: Duration = Duration::from_secs(2);
/// How long the leader stays frozen: past its ttl, so that the database can grant a successor meanwhile.
const FREEZE: Duration = Duration::from_millis(3500);

/// Prints the story with the time since the start; to stderr when stdout carries JSON. The text may quote
/// values read back from the database (a holder, an error), so it is escaped like every stored value.
struct Narrator {
    started: Instant,
    to_stderr: bool,
}

impl Narrator {
    fn say(&self, who: &str, text: impl AsRef<str>) {
        let line = format!(
            "[{:>5.2}s] {who:<12} {}\n",
            self.started.elapsed().as_secs_f64(),
            table::escape(text.as_ref(), table::MESSAGE_CHARS)
        );
        // A reader that went away does not stop the story (its verdict is the exit code), nor panics it.
        let _ = if self.to_stderr {
            std::io::stderr().write_all(line.as_bytes())
        } else {
            std::io::stdout().write_all(line.as_bytes())
        };
    }
}

/// One invariant and whether it held.
#[derive(Debug, Serialize)]
struct Check {
    invariant: &'static str,
    held: bool,
    detail: String,
}

#[derive(Debug, Serialize)]
struct Report {
    lease: String,
    tenures: Vec<Tenure>,
    rejections: Vec<Rejection>,
    checks: Vec<Check>,
    verdict: bool,
}

async fn scalar(store: &Store, sql: &str, lease: &str) -> Result<i64, Failure> {
    use diesel::sql_types::{BigInt, Text};
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut conn = store.admin().conn().await?;
    let row: Count = diesel::sql_query(sql)
        .bind::<Text, _>(lease)
        .get_result(&mut *conn)
        .await
        .map_err(Error::from)?;
    Ok(row.n)
}

/// Campaigns as `holder` until the lease is acquired: waits for the time left as computed by the database, or a
/// release notification, whichever comes first.
async fn campaign(
    elector: &PgElector,
    holder: &str,
    options: &LeaseOptions,
) -> Result<HeldLease, Error> {
    let qualified = elector.qualify(LEASE);
    loop {
        let mut wakeups = elector.wakeups();
        match elector.acquire(LEASE, holder, options).await {
            Ok(lease) => return Ok(lease),
            Err(Error::Held { expires_in, .. }) => {
                wakeups
                    .wait(&qualified, expires_in.min(Duration::from_millis(250)))
                    .await;
            }
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn run(
    global: &Global,
    scenario: Scenario,
    json: bool,
    handovers: u32,
    fleet_args: FleetArgs,
) -> CliResult {
    let story = Narrator {
        started: Instant::now(),
        to_stderr: json,
    };
    if scenario == Scenario::Fleet {
        // A server of its own size (connections, pg_stat_statements) when none is given.
        return fleet::run(
            global,
            &story,
            global.database_url.clone(),
            fleet_args,
            json,
        )
        .await;
    }
    let (server, url, cluster) = database(global, &story).await?;
    if scenario == Scenario::Spread {
        return spread::run(global, &story, server, url, cluster, json).await;
    }
    if scenario == Scenario::Rescue {
        return rescue::run(global, &story, server, url, cluster, json, handovers).await;
    }
    takeover(global, &story, server, url, cluster, json).await
}

/// The database of a demo: the one given, in a fresh cluster of its own, or a throwaway server (removed when the
/// returned value is dropped: at the end, on an error, on Ctrl-C).
async fn database(
    global: &Global,
    story: &Narrator,
) -> Result<(Option<EmbeddedServer>, String, String), Failure> {
    Ok(match &global.database_url {
        Some(url) => {
            // A fresh cluster name keeps this run apart from earlier ones and from real leases.
            let cluster = format!("demo-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%3f"));
            (None, url.clone(), cluster)
        }
        None => {
            story.say(
                "setup",
                "starting a throwaway PostgreSQL server from the system binaries",
            );
            let server = tokio::task::spawn_blocking(EmbeddedServer::start)
                .await
                .map_err(|e| Failure::new(1, e.to_string()))??;
            let url = server.url();
            story.say(
                "setup",
                format!(
                    "PostgreSQL on 127.0.0.1:{} (removed at exit)",
                    server.port()
                ),
            );
            (Some(server), url, "demo".to_owned())
        }
    })
}

/// The global flags a scenario's child processes (replicas, workers) share with this one: the cluster, the
/// connect timeout and the identity they must find.
fn child_flags(global: &Global, cluster: &str) -> Vec<String> {
    let mut flags = vec![
        "--cluster".to_owned(),
        cluster.to_owned(),
        "--connect-timeout".to_owned(),
        format!("{}ms", global.connect_timeout.as_millis()),
    ];
    if let Some(id) = &global.expect_system_identifier {
        flags.extend(["--expect-system-identifier".to_owned(), id.clone()]);
    }
    if let Some(id) = &global.expect_instance_id {
        flags.extend(["--expect-instance-id".to_owned(), id.clone()]);
    }
    flags
}

/// The demo's own store on the database (migrated): what every scenario sets up first.
async fn admin_store(global: &Global, url: &str, cluster: &str) -> Result<Store, Failure> {
    let admin =
        Store::connect(global.config(url, cluster).application_name("pgfence-demo")).await?;
    admin.migrate().await?;
    Ok(admin)
}

async fn takeover(
    global: &Global,
    story: &Narrator,
    server: Option<EmbeddedServer>,
    url: String,
    cluster: String,
    json: bool,
) -> CliResult {
    let admin = admin_store(global, &url, &cluster).await?;
    let qualified = format!("{cluster}/{LEASE}");
    story.say(
        "setup",
        format!(
            "pgfence schema ready on {}; lease {qualified}, ttl {TTL:?}",
            admin.admin().target()
        ),
    );

    // Two controller processes: each its own pool and application_name (the audit records who wrote).
    let a_store = Store::connect(
        global
            .config(&url, &cluster)
            .application_name("controller-a"),
    )
    .await?;
    let b_store = Store::connect(
        global
            .config(&url, &cluster)
            .application_name("controller-b"),
    )
    .await?;
    let (a, b) = (
        PgElector::new(a_store.clone()),
        PgElector::new(b_store.clone()),
    );
    let mut options = LeaseOptions::new(TTL);
    options.renew_every = Duration::from_millis(400);

    let a_lease = a.acquire(LEASE, "controller-a", &options).await?;
    story.say(
        "controller-a",
        format!("acquired {qualified}: epoch {}", a_lease.epoch()),
    );
    match b.acquire(LEASE, "controller-b", &options).await {
        Err(Error::Held {
            holder,
            epoch,
            expires_in,
            ..
        }) => story.say(
            "controller-b",
            format!(
                "{qualified} is held by {holder} (epoch {epoch}, {:.1}s left by the database clock); campaigning",
                expires_in.as_secs_f64()
            ),
        ),
        Ok(_) => return Err(Failure::new(10, "controller-b acquired a lease that controller-a holds")),
        Err(e) => return Err(e.into()),
    }
    let b_campaign = {
        let (b, options) = (b.clone(), options);
        tokio::spawn(async move { campaign(&b, "controller-b", &options).await })
    };

    // The leader works: every write presents its fence.
    let a_fence = a_lease.fence();
    for i in 1..=3 {
        let key = format!("job-{i}");
        let write = a_store
            .tasks()
            .create(&a_fence, &key, &json!({"image": format!("api:1.{i}")}))
            .await?;
        story.say(
            "controller-a",
            format!("created task {key} (fence {})", write.task.fence),
        );
    }
    for i in 1..=2 {
        let key = format!("job-{i}");
        a_store.tasks().claim(&a_fence, &key, "worker-a").await?;
        story.say("controller-a", format!("claimed {key} for worker-a"));
    }

    // The leader freezes: its renewals stop and it writes nothing, but it keeps its fence and its belief.
    let frozen_at = Instant::now();
    a_lease.abandon();
    story.say(
        "controller-a",
        format!("FROZEN (a GC pause / a partition): no renewals, no writes for {FREEZE:?}"),
    );

    let b_lease = b_campaign
        .await
        .map_err(|e| Failure::new(1, e.to_string()))??;
    let b_fence = b_lease.fence();
    story.say(
        "controller-b",
        format!(
            "took over {qualified} with epoch {} ({:.1}s after the freeze: the ttl ran out by the database clock)",
            b_lease.epoch(),
            frozen_at.elapsed().as_secs_f64()
        ),
    );
    b_store.tasks().claim(&b_fence, "job-3", "worker-b").await?;
    story.say("controller-b", "claimed job-3 for worker-b");
    let write = b_store
        .tasks()
        .create(&b_fence, "job-4", &json!({"image": "api:1.4"}))
        .await?;
    story.say(
        "controller-b",
        format!("created task job-4 (fence {})", write.task.fence),
    );

    tokio::time::sleep(FREEZE.saturating_sub(frozen_at.elapsed())).await;
    story.say(
        "controller-a",
        format!(
            "wakes up, still believing it leads, and writes with epoch {}",
            a_fence.epoch()
        ),
    );
    let mut stale_errors = 0;
    let attempts: Vec<(&str, Result<(), Error>)> = vec![
        (
            "mark job-2 succeeded",
            a_store
                .tasks()
                .transition(
                    &a_fence,
                    "job-2",
                    TaskState::Claimed,
                    TaskState::Succeeded,
                    &json!({}),
                )
                .await
                .map(|_| ()),
        ),
        (
            "create task job-5",
            a_store
                .tasks()
                .create(&a_fence, "job-5", &json!({}))
                .await
                .map(|_| ()),
        ),
    ];
    let mut stale_write_accepted = false;
    for (what, result) in attempts {
        match result {
            Err(err @ Error::Stale { .. }) => {
                stale_errors += 1;
                story.say("database", format!("REFUSED controller-a's {what}: {err}"));
            }
            Ok(()) => {
                stale_write_accepted = true;
                story.say(
                    "database",
                    format!("ACCEPTED controller-a's stale {what} (invariant violated)"),
                );
            }
            Err(other) => return Err(other.into()),
        }
    }
    b_lease.release().await?;
    story.say("controller-b", "released the lease");

    let report = build_report(
        &admin,
        &qualified,
        &a_fence,
        stale_errors,
        stale_write_accepted,
    )
    .await?;
    if json {
        crate::output::print_json(&report)?;
    } else {
        crate::output::emit(&report_text(&report, &qualified))?;
    }
    drop(server);
    if report.verdict {
        Ok(())
    } else {
        Err(Failure::new(10, "verdict: an invariant was violated"))
    }
}

async fn build_report(
    admin: &Store,
    qualified: &str,
    stale: &Fence,
    stale_errors: usize,
    stale_write_accepted: bool,
) -> Result<Report, Failure> {
    let tenures = admin.history().tenures(LEASE).await?;
    let mut filter = RejectionFilter::default();
    filter.lease = Some(LEASE.to_owned());
    let rejections = admin.admin().rejections(&filter).await?;

    // Each tenure ended before the next began: never two holders at once, one holder per epoch.
    let overlapping = scalar(
        admin,
        "SELECT count(*) AS n FROM pgfence.tenures t1 JOIN pgfence.tenures t2 \
           ON t2.lease = t1.lease AND t2.epoch = t1.epoch + 1 \
          WHERE t1.lease = $1 AND (t1.ended_at IS NULL OR t1.ended_at > t2.acquired_at)",
        qualified,
    )
    .await?;
    // No event of an older epoch was written after a newer tenure began (both times from the database clock).
    let late_writes = scalar(
        admin,
        "SELECT count(*) AS n FROM pgfence.task_events e JOIN pgfence.tenures t \
           ON t.lease = e.lease AND t.epoch > e.epoch \
          WHERE e.lease = $1 AND e.created_at >= t.acquired_at",
        qualified,
    )
    .await?;
    let audited: i64 = rejections
        .iter()
        .filter(|r| r.presented_epoch == stale.epoch().get())
        .map(|r| r.count)
        .sum();
    let job2 = admin.tasks().get(LEASE, "job-2").await?.map(|t| t.state);
    let job5 = admin.tasks().get(LEASE, "job-5").await?;

    let checks = vec![
        Check {
            invariant: "epochs strictly increase, one holder per epoch",
            held: overlapping == 0
                && tenures
                    .windows(2)
                    .all(|w| w[1].epoch.get() == w[0].epoch.get() + 1)
                && tenures.len() == 2,
            detail: format!("{} tenures, {overlapping} overlapping", tenures.len()),
        },
        Check {
            invariant: "no stale write accepted",
            held: !stale_write_accepted
                && late_writes == 0
                && job2 == Some(TaskState::Claimed)
                && job5.is_none(),
            detail: format!(
                "{late_writes} old-epoch events after the takeover; job-2 is {}; job-5 {}",
                job2.map_or("missing".to_owned(), |s| s.to_string()),
                if job5.is_some() {
                    "exists"
                } else {
                    "does not exist"
                }
            ),
        },
        Check {
            invariant: "every refused write is audited",
            held: stale_errors > 0 && audited == stale_errors as i64,
            detail: format!("{stale_errors} refused, {audited} counted in pgfence.rejections"),
        },
    ];
    let verdict = checks.iter().all(|c| c.held);
    Ok(Report {
        lease: qualified.to_owned(),
        tenures,
        rejections,
        checks,
        verdict,
    })
}

/// The closing report as text: the tenures and refused writes read back, then the verdict.
fn report_text(report: &Report, qualified: &str) -> String {
    let qualified = table::value(qualified);
    let mut text = format!(
        "\nTenure timeline of {qualified} (pgfence.tenure_history):\n{}\n\
         Refused writes, read back with: SELECT * FROM pgfence.rejections WHERE lease = '{qualified}' ORDER BY id DESC;\n{}\n\
         Verdict:\n",
        table::tenures(&report.tenures),
        table::rejections(&report.rejections),
    );
    text.push_str(&verdict(&report.checks, report.verdict));
    text
}

/// The closing verdict of a demo: one line per check, then the conclusion.
fn verdict(checks: &[Check], held: bool) -> String {
    let mut text = String::new();
    for check in checks {
        text.push_str(&format!(
            "  [{}] {} ({})\n",
            if check.held { "ok" } else { "VIOLATED" },
            check.invariant,
            table::value(&check.detail)
        ));
    }
    text.push_str(if held {
        "  => every invariant held\n"
    } else {
        "  => an invariant was violated\n"
    });
    text
}
