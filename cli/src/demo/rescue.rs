//! `pgfence demo --scenario rescue`: work in flight when leadership moves.
//!
//! Worker processes (`pgfence rescue-worker`) lead one lease in turn and call a real workload engine — a second
//! database the fence does not cover, which applies each effect once per idempotency key — for each task, under the
//! effect ledger. The story places each fault at an exact point, by pausing a worker there and freezing it:
//!
//! 1. worker-a called the engine for task-00000 and froze before recording the outcome: its successor worker-b
//!    finds the effect in doubt, asks the engine by the key, and **confirms** it (no second launch);
//! 2. worker-b recorded the intent for task-00001 and froze before calling: worker-c finds it in doubt and froze
//!    too, before settling; worker-d finds it, the engine has no such key, and **retries** it under the same key;
//! 3. worker-c wakes and tries to settle: refused, its tenure ended (a stale settle never commits);
//! 4. worker-b wakes and makes its call — the engine absorbs it by the key — and reports the outcome: refused,
//!    and kept as a **late report**; worker-a's late outcome too.
//!
//! With `--handovers N` a fault run follows on several leases at once: leaders killed (`kill -9`), frozen past
//! their ttl, their connections dropped, engine replies lost or delivered late, until N handovers happened;
//! then every task is finished by a last worker per lease. The closing verdict reads the ledger and the engine
//! back and exits non-zero if any effect ran twice, any intent or work was lost, any attempt was settled twice,
//! or any ledger write of an ended tenure committed.

mod chaos;
mod verdict;
mod workers;

use std::time::{Duration, Instant};

use pgfence::embedded::EmbeddedServer;
use serde::Serialize;
use serde_json::Value;

use super::{admin_store, Narrator};
use crate::rescue::engine::{self, Engine};
use crate::{CliResult, Failure, Global};
use verdict::Check;
use workers::{Spec, Workers};

/// The story's lease.
const LEASE: &str = "rescue";
/// Its ttl: a frozen leader is replaced one ttl after its last renewal.
const TTL: Duration = Duration::from_secs(1);
/// How long any one step may take before the story gives up (a loaded machine is slow, never this slow).
const STEP: Duration = Duration::from_secs(30);

/// The closing report.
#[derive(Debug, Serialize)]
struct Report {
    scenario: &'static str,
    lease: String,
    story: verdict::Account,
    chaos: Option<chaos::Summary>,
    checks: Vec<Check>,
    seconds: f64,
    verdict: bool,
}

/// The engine's database beside the story's (created fresh), and its URL.
async fn engine_database(url: &str, cluster: &str) -> Result<String, Failure> {
    let admin = engine::client(url).await.map_err(|e| Failure::new(1, e))?;
    let name: String = format!("pgfence_engine_{cluster}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    for statement in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin.batch_execute(&statement).await.map_err(|e| {
            Failure::new(
                1,
                format!(
                    "cannot create the engine's database {name} (the rescue story needs CREATEDB): {}",
                    engine::describe(&e)
                ),
            )
        })?;
    }
    Ok(pgfence::connection::with_database(url, &name))
}

pub(super) async fn run(
    global: &Global,
    story: &Narrator,
    server: Option<EmbeddedServer>,
    url: String,
    cluster: String,
    json: bool,
    handovers: u32,
) -> CliResult {
    let started = Instant::now();
    let admin = admin_store(global, &url, &cluster).await?;
    let engine_url = engine_database(&url, &cluster).await?;
    let engine = Engine::connect(&engine_url)
        .await
        .map_err(|e| Failure::new(1, e))?;
    engine.install().await.map_err(|e| Failure::new(1, e))?;
    story.say(
        "setup",
        format!(
            "pgfence schema ready on {}; lease {cluster}/{LEASE}, ttl {TTL:?}; the workload engine is a database of \
             its own, which the fence does not cover, applying each effect once per key",
            admin.admin().target()
        ),
    );
    // The engine delivers requests in transit when they are due, on its own clock, until the end.
    let stop = pgfence::reexports::tokio_util::sync::CancellationToken::new();
    let courier = {
        let (engine, stop) = (
            Engine::connect(&engine_url)
                .await
                .map_err(|e| Failure::new(1, e))?,
            stop.clone(),
        );
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let _ = engine.deliver_due(false).await;
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        })
    };
    let exe = std::env::current_exe()
        .map_err(|e| Failure::new(1, format!("cannot find this program to start workers: {e}")))?;
    // Declared after `server`: dropped first, so the workers are gone before the server is removed.
    let mut workers = Workers::new(
        exe,
        url.clone(),
        engine_url.clone(),
        super::child_flags(global, &cluster),
    );
    let outcome = async {
        let steps = tell(story, &mut workers).await?;
        let chaos = if handovers > 0 {
            Some(chaos::run(story, &mut workers, &url, &cluster, handovers).await?)
        } else {
            None
        };
        Ok::<_, Failure>((steps, chaos))
    }
    .await;
    // After a failed step the workers are stopped at once (some are frozen); otherwise each finishes its work.
    let killed = workers
        .finish(if outcome.is_ok() {
            STEP
        } else {
            Duration::ZERO
        })
        .await;
    stop.cancel();
    let _ = courier.await;
    engine
        .deliver_due(true)
        .await
        .map_err(|e| Failure::new(1, e))?;
    let (mut checks, chaos) = outcome?;
    if !killed.is_empty() {
        story.say(
            "verdict",
            format!("workers still running at the end, killed: {killed:?}"),
        );
    }

    let db = engine::client(&url).await.map_err(|e| Failure::new(1, e))?;
    let applied = engine.all_applied().await.map_err(|e| Failure::new(1, e))?;
    let mut leases = vec![format!("{cluster}/{LEASE}")];
    if let Some(summary) = &chaos {
        leases.extend(summary.leases.iter().cloned());
    }
    let refused = verdict::refused_outcomes(&workers.log, |m| {
        workers.lease_of(m).map(|l| format!("{cluster}/{l}"))
    });
    let (account, mut judged) = verdict::judge(&db, &leases, &applied, &refused)
        .await
        .map_err(|e| Failure::new(1, e))?;
    checks.append(&mut judged);
    let held = checks.iter().all(|c| c.held);
    let report = Report {
        scenario: "rescue",
        lease: format!("{cluster}/{LEASE}"),
        story: account,
        chaos,
        checks,
        seconds: started.elapsed().as_secs_f64(),
        verdict: held,
    };
    print_report(story, &report, json)?;
    drop(server);
    if held {
        Ok(())
    } else {
        Err(Failure::new(
            1,
            "rescue: an invariant failed (see the checks above)",
        ))
    }
}

fn print_report(story: &Narrator, report: &Report, json: bool) -> Result<(), Failure> {
    if json {
        println!("{}", crate::output::json_line(report)?);
        return Ok(());
    }
    let a = &report.story;
    story.say(
        "account",
        format!(
            "{} handovers; {} tasks, {} done; {} intents: {} confirmed, {} retried under their key; {} late reports \
             kept; {} repeated deliveries absorbed by their key",
            a.handovers, a.tasks, a.succeeded, a.intents, a.confirmed, a.retried, a.late_reports, a.deduplicated
        ),
    );
    if let Some([p50, p99, max]) = a.in_doubt_ms {
        story.say(
            "account",
            format!("in doubt from the end of the tenure to the settle: median {p50} ms, p99 {p99} ms, max {max} ms"),
        );
    }
    for check in &report.checks {
        let mark = if check.held { "held" } else { "FAILED" };
        story.say(
            "verdict",
            format!("{mark}: {} ({})", check.invariant, check.detail),
        );
    }
    story.say(
        "verdict",
        format!(
            "{} in {:.1} s",
            if report.verdict {
                "every invariant held"
            } else {
                "AN INVARIANT FAILED"
            },
            report.seconds
        ),
    );
    Ok(())
}

fn is(event: &Value, kind: &str, member: &str) -> bool {
    event["event"] == kind && event["member"] == member
}

/// The story's four episodes, each fault placed exactly; answers the checks of what each episode must show.
async fn tell(story: &Narrator, w: &mut Workers) -> Result<Vec<Check>, Failure> {
    let spec = |pause: &[&str]| Spec {
        tasks: 3,
        ttl: TTL,
        pause_at: pause.iter().map(|p| (*p).to_owned()).collect(),
        ..Spec::default()
    };
    let mut checks = Vec::new();

    w.spawn(LEASE, "worker-a", &spec(&["after-call@task-00000"]))?;
    w.wait_for("worker-a calls the engine", STEP, |e| {
        is(e, "paused", "worker-a")
    })
    .await?;
    w.signal("worker-a", "STOP").await?;
    story.say(
        "worker-a",
        "recorded the intent for task-00000, called the engine (key rescue:task-00000/launch) and froze before recording \
         the outcome — did the launch happen?",
    );

    w.spawn(LEASE, "worker-b", &spec(&["after-intent@task-00001"]))?;
    let lead = w
        .wait_for("worker-b takes over", STEP, |e| is(e, "lead", "worker-b"))
        .await?;
    story.say(
        "worker-b",
        format!(
            "leads with epoch {}; {} effect in doubt",
            lead["epoch"], lead["in_doubt"]
        ),
    );
    let settled = w
        .wait_for("worker-b settles task-00000", STEP, |e| {
            is(e, "settled", "worker-b")
        })
        .await?;
    story.say(
        "worker-b",
        format!(
            "asked the engine about {}: {} (no second launch)",
            text(&settled["key"]),
            text(&settled["resolution"])
        ),
    );
    checks.push(Check {
        invariant: "a successor confirms an effect the engine applied (never launches it again)",
        held: settled["resolution"] == "confirmed" && settled["key"] == "rescue:task-00000/launch",
        detail: format!("worker-b: {settled}"),
    });
    w.wait_for("worker-b records its next intent", STEP, |e| {
        is(e, "paused", "worker-b")
    })
    .await?;
    w.signal("worker-b", "STOP").await?;
    story.say(
        "worker-b",
        "recorded the intent for task-00001 and froze before calling the engine",
    );

    w.spawn(LEASE, "worker-c", &spec(&["before-settle@task-00001"]))?;
    let lead = w
        .wait_for("worker-c takes over", STEP, |e| is(e, "lead", "worker-c"))
        .await?;
    w.wait_for("worker-c lists the doubt", STEP, |e| {
        is(e, "paused", "worker-c")
    })
    .await?;
    w.signal("worker-c", "STOP").await?;
    story.say(
        "worker-c",
        format!("leads with epoch {}, found rescue:task-00001/launch in doubt, and froze before settling it", lead["epoch"]),
    );

    w.spawn(LEASE, "worker-d", &spec(&["before-settle@task-00001"]))?;
    let lead = w
        .wait_for("worker-d takes over", STEP, |e| is(e, "lead", "worker-d"))
        .await?;
    w.wait_for("worker-d lists the doubt", STEP, |e| {
        is(e, "paused", "worker-d")
    })
    .await?;
    story.say(
        "worker-d",
        format!(
            "leads with epoch {}, found rescue:task-00001/launch in doubt",
            lead["epoch"]
        ),
    );

    w.signal("worker-c", "CONT").await?;
    w.go("worker-c").await?;
    let stale = w
        .wait_for("worker-c's settle is answered", STEP, |e| {
            (is(e, "refused", "worker-c") && e["op"] == "settle_effect")
                || is(e, "settled", "worker-c")
        })
        .await?;
    story.say(
        "worker-c",
        format!("woke and tried to settle it: {}", describe(&stale)),
    );
    checks.push(Check {
        invariant: "an ended tenure's settle is refused (a stale successor settles nothing)",
        held: stale["event"] == "refused",
        detail: format!("worker-c: {stale}"),
    });

    w.go("worker-d").await?;
    // (Or finds it settled already, and goes on: then it never says `settled`.)
    let settled = w
        .wait_for("worker-d settles task-00001", STEP, |e| {
            is(e, "settled", "worker-d") || (is(e, "done", "worker-d") && e["task"] == "task-00001")
        })
        .await?;
    story.say(
        "worker-d",
        if settled["event"] == "settled" {
            format!(
                "asked the engine about {}: {}, under the same key",
                text(&settled["key"]),
                text(&settled["resolution"])
            )
        } else {
            "found task-00001's effect settled already — by a tenure that had ended".to_owned()
        },
    );
    checks.push(Check {
        invariant: "a successor retries an effect the engine never received, under the same key",
        held: settled["resolution"] == "retried" && settled["key"] == "rescue:task-00001/launch",
        detail: format!("worker-d: {settled}"),
    });
    w.wait_for("worker-d finishes the tasks", STEP, |e| {
        is(e, "exit", "worker-d")
    })
    .await?;

    for (member, task) in [("worker-b", "task-00001"), ("worker-a", "task-00000")] {
        w.signal(member, "CONT").await?;
        w.go(member).await?;
        let late = w
            .wait_for(&format!("{member}'s late outcome"), STEP, |e| {
                is(e, "refused", member) && e["op"] == "record_outcome"
            })
            .await?;
        story.say(
            member,
            format!(
                "woke, reported the outcome of {task}: {} — kept as a late report",
                describe(&late)
            ),
        );
    }
    Ok(checks)
}

/// A text field of an event as it reads (a non-text value as JSON).
fn text(value: &Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

fn describe(event: &Value) -> String {
    match event["event"].as_str() {
        Some("refused") => format!(
            "refused ({}, epoch {})",
            text(&event["reason"]),
            event["epoch"]
        ),
        Some("settled") => format!(
            "ACCEPTED ({} by epoch {})",
            text(&event["resolution"]),
            event["epoch"]
        ),
        _ => event.to_string(),
    }
}
