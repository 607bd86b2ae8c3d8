//! A small controller on pgfence: two "processes" (supervisors) run a `scheduler` controller and a `reporter`
//! controller on a throwaway PostgreSQL server. They join one group and spread the two controllers between them:
//! `process-a` starts first and leads both, and as soon as `process-b` joins, the group's assignment gives it one
//! of them — handed over cooperatively (the callback is told `handed over`, the tenure released, the new leader
//! acquires at once with a larger epoch). The scheduler leader creates, claims and completes tasks, every write
//! carrying its tenure's fence; the reporter leader prints the leases. Each writes only while its tenure is
//! believed held and says why it stopped. Halfway through, `process-a` shuts down and leaves the group; the other
//! takes its controller over within milliseconds (LISTEN/NOTIFY) with a larger epoch. Then an operator
//! force-releases `reporter`: its leader is told of the loss and its supervisor campaigns again on its own.
//!
//! Run with `cargo run --example controller` (needs the PostgreSQL server binaries; or set DATABASE_URL).

use std::time::Duration;

use pgfence::leader::{BoxError, LeaderContext, LeadershipOptions, PgElector, Supervisor};
use pgfence::tasks::TaskState;
use pgfence::{Epoch, Error, Next, Store, StoreConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Why a tenure ended, in a line: what happened, and what comes next ([`TenureEnd::next`]).
///
/// [`TenureEnd::next`]: pgfence::leader::TenureEnd::next
fn why_stopped(ctx: &LeaderContext) -> String {
    // `Some` once the token is cancelled or `is_held` has answered false: the loops below stop only then.
    match ctx.end_cause() {
        Some(end) => match end.next() {
            Next::Recampaign => format!("lost ({end}); campaigning again"),
            Next::Stop | Next::Retry => end.to_string(),
        },
        None => "still leading".to_owned(),
    }
}

/// One job under the tenure's fence: create, claim and complete a task.
async fn run_job(store: &Store, ctx: &LeaderContext, key: &str, who: &str) -> Result<Epoch, Error> {
    let fence = ctx.fence();
    store
        .tasks()
        .create(&fence, key, &json!({"by": who}))
        .await?;
    store.tasks().claim(&fence, key, who).await?;
    let done = store
        .tasks()
        .transition(
            &fence,
            key,
            TaskState::Claimed,
            TaskState::Succeeded,
            &json!({}),
        )
        .await?;
    Ok(done.task.fence)
}

async fn schedule(store: Store, ctx: LeaderContext, who: &'static str) -> Result<(), BoxError> {
    println!("[{who}] leads scheduler with epoch {}", ctx.epoch());
    let mut n = 0;
    loop {
        tokio::select! {
            _ = ctx.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        // The token can fire late on a starved runtime; `is_held` reads the monotonic clock and cannot: no new
        // work past the local deadline.
        if !ctx.is_held() {
            break;
        }
        // Every write presents this tenure's fence; the database refuses it once another epoch exists. What to
        // do about an error is one match: try again, leave it to the supervisor's next campaign, or give up.
        let key = format!("job-{}-{n}", ctx.epoch());
        match run_job(&store, &ctx, &key, who).await {
            Ok(fence) => {
                println!("[{who}] ran {key} (fence {fence})");
                n += 1;
            }
            Err(e) => match e.next() {
                // Transient (a lost connection, a deadlock): the same job again at the next tick — its task key
                // makes the create idempotent (a claim already committed answers a conflict: a real controller
                // reads the task back first).
                Next::Retry => println!("[{who}] {key} failed ({e}); trying again"),
                // The tenure is over: stop; the supervisor campaigns again for a new epoch.
                Next::Recampaign => {
                    println!("[{who}] {key} refused ({e}); leaving it to the next tenure");
                    break;
                }
                // Nothing a retry or a new tenure changes: the controller fails (and is restarted with backoff).
                Next::Stop => return Err(e.into()),
            },
        }
    }
    println!(
        "[{who}] scheduler stopped at epoch {}: {}",
        ctx.epoch(),
        why_stopped(&ctx)
    );
    Ok(())
}

async fn report(store: Store, ctx: LeaderContext, who: &'static str) -> Result<(), BoxError> {
    println!("[{who}] leads reporter with epoch {}", ctx.epoch());
    loop {
        tokio::select! {
            _ = ctx.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(700)) => {}
        }
        if !ctx.is_held() {
            break;
        }
        for lease in store.admin().leases().await? {
            println!(
                "[{who}] {}: {:?} by {} at epoch {}",
                lease.name,
                lease.state,
                lease.holder.as_deref().unwrap_or("-"),
                lease
                    .epoch
                    .map_or_else(|| "-".to_owned(), |e| e.to_string())
            );
        }
    }
    println!(
        "[{who}] reporter stopped at epoch {}: {}",
        ctx.epoch(),
        why_stopped(&ctx)
    );
    Ok(())
}

fn supervisor(store: &Store, elector: &PgElector, who: &'static str) -> Supervisor<PgElector> {
    let options = LeadershipOptions::new(Duration::from_secs(3));
    let (s1, s2) = (store.clone(), store.clone());
    Supervisor::new(elector.clone(), who)
        .controller("scheduler", options, move |ctx| {
            schedule(s1.clone(), ctx, who)
        })
        .controller("reporter", options, move |ctx| report(s2.clone(), ctx, who))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server;
    let url = match std::env::var("DATABASE_URL") {
        Ok(url) => url,
        Err(_) => {
            server = pgfence::embedded::EmbeddedServer::start()?;
            server.url()
        }
    };
    let store = Store::connect(StoreConfig::new(url, "example")).await?;
    store.migrate().await?;
    let elector = PgElector::new(store.clone());

    let (a_stop, b_stop) = (CancellationToken::new(), CancellationToken::new());
    let a = tokio::spawn(supervisor(&store, &elector, "process-a").run(a_stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = supervisor(&store, &elector, "process-b");
    let b_status = b.status();
    let b = tokio::spawn(b.run(b_stop.clone()));

    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("-- process-a shuts down; process-b takes over");
    a_stop.cancel();
    a.await??;
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "-- readiness of process-b: {:?}",
        b_status.readiness().await
    );
    println!("-- an operator force-releases reporter");
    store.admin().force_release("reporter").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    b_stop.cancel();
    b.await??;

    for tenure in store.history().tenures("scheduler").await? {
        println!(
            "scheduler tenure: epoch {} held by {} ({})",
            tenure.epoch,
            tenure.holder,
            tenure.end_reason.as_deref().unwrap_or("current")
        );
    }
    Ok(())
}
