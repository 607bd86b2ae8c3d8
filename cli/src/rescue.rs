//! `pgfence rescue-worker` (hidden): one controller process of the rescue story (`pgfence demo --scenario
//! rescue`) and its fault test. It leads one lease with the leadership runtime and works through the lease's
//! tasks `task-00000`, `task-00001`, … in order; each task's work is one external call to the workload engine
//! ([`engine`]) under the effect key `<task>/launch`:
//!
//! 1. record the intent under the tenure's fence
//!    ([`Effects::intend`](pgfence::effects::Effects::intend)) — refused once the tenure ended, so a stale leader
//!    never calls;
//! 2. call the engine with the key (after a random latency; with `--lose-reply` percent the engine applies and
//!    the reply is lost; with `--late` percent the request is delivered `--late-by` later and never answered);
//! 3. record the outcome (`done`, or `unknown` without a reply; an ended tenure's outcome is refused and kept as a
//!    late report);
//! 4. move the task to `succeeded`.
//!
//! A new tenure first settles what earlier tenures left in doubt ([`LeaderContext::in_doubt`]): it asks the
//! engine about each key and confirms what the engine applied, or retries the same key — never guessing. Its own
//! `unknown` outcomes it settles the same way.
//!
//! Everything it does is one JSON object per line on stdout (`lead`, `settled`, `done`, `refused`, `paused`,
//! `stuck`, `exit`), for the driver to follow. `--pause-at POINT@TASK` stops at that point of that task — after
//! the intent (`after-intent`), after the engine applied (`after-call`), before settling an effect of the task
//! (`before-settle`) — prints `paused`, and goes on when a line arrives on stdin: the driver freezes or kills it
//! there, which is how the story places a fault exactly.

pub(crate) mod engine;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use pgfence::effects::{EffectConflict, InDoubt, Outcome, Settlement};
use pgfence::leader::{run_with_leadership, LeaderContext, LeadershipOptions, PgElector};
use pgfence::reexports::tokio_util::sync::CancellationToken;
use pgfence::tasks::TaskState;
use pgfence::{Error, Fence, Store};
use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Mutex;

use super::output::json_line;
use super::{parse_duration, CliResult, Failure, Global};
use engine::Engine;

/// Where `--pause-at` can stop a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Point {
    AfterIntent,
    AfterCall,
    BeforeSettle,
}

impl Point {
    fn as_str(self) -> &'static str {
        match self {
            Point::AfterIntent => "after-intent",
            Point::AfterCall => "after-call",
            Point::BeforeSettle => "before-settle",
        }
    }
}

/// `POINT@TASK`, e.g. `after-call@task-00000`.
fn parse_pause(text: &str) -> Result<(Point, String), String> {
    let (point, task) = text
        .split_once('@')
        .ok_or_else(|| format!("expected POINT@TASK, got {text:?}"))?;
    let point = match point {
        "after-intent" => Point::AfterIntent,
        "after-call" => Point::AfterCall,
        "before-settle" => Point::BeforeSettle,
        other => return Err(format!("unknown pause point {other:?}")),
    };
    Ok((point, task.to_owned()))
}

/// `pgfence rescue-worker`'s flags.
#[derive(Debug, Args)]
pub(crate) struct RescueWorkerArgs {
    /// The lease this worker's controller leads (without cluster: --cluster qualifies it).
    #[arg(long)]
    lease: String,
    /// This worker's holder name (also its connections' application_name).
    #[arg(long)]
    member: String,
    /// The workload engine's database (a connection URL; never shown by `ps` when given in the environment).
    #[arg(long, env = "PGFENCE_ENGINE_URL", hide_env_values = true)]
    engine_url: String,
    /// How many tasks the lease has: task-00000 … (created as the work reaches them).
    #[arg(long, default_value_t = 1000)]
    tasks: u32,
    /// The lease's ttl.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ttl: Duration,
    /// Longest wait between acquisition attempts (default ttl / 4).
    #[arg(long, value_parser = parse_duration)]
    poll: Option<Duration>,
    /// The engine's latency: each call takes a random time up to this.
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    call: Duration,
    /// Percent of calls whose reply is lost after the engine applied the effect.
    #[arg(long, default_value_t = 0)]
    lose_reply: u8,
    /// Percent of calls delivered late (after --late-by) and never answered.
    #[arg(long, default_value_t = 0)]
    late: u8,
    /// How late a late call arrives.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    late_by: Duration,
    /// Stop at POINT of TASK until a line arrives on stdin (repeatable).
    #[arg(long, value_name = "POINT@TASK", value_parser = parse_pause)]
    pause_at: Vec<(Point, String)>,
    /// Exit (0) once every task that exists is done and nothing is in doubt, instead of going on to new tasks.
    #[arg(long)]
    until_done: bool,
}

/// The worker's shared state.
struct Worker {
    args: RescueWorkerArgs,
    /// Set when the work reached its end (every task done, or with --until-done every existing one).
    finished: std::sync::atomic::AtomicBool,
    store: Store,
    engine: Engine,
    stdin: Mutex<tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>>,
}

/// Why a tenure's work stopped.
enum Stop {
    /// The tenure ended (a write was refused, or the context cancelled): campaign again.
    Lost,
    /// `--until-done`: everything is done.
    Finished,
}

fn emit(value: serde_json::Value) {
    if let Ok(line) = json_line(&value) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

fn task_key(i: u32) -> String {
    format!("task-{i:05}")
}

/// The effect key of `task`'s launch: stable across retries and successors, and unique in the engine, which
/// every lease shares (so it names the lease too).
fn effect_key(lease: &str, task: &str) -> String {
    format!("{lease}:{task}/launch")
}

/// A ledger or task error: a refusal ends the tenure's work (reported), anything else is the run's failure.
fn refused(member: &str, op: &str, key: &str, fence: &Fence, error: &Error) -> Option<Stop> {
    match error {
        Error::Stale { reason, .. } => {
            emit(
                json!({"event": "refused", "member": member, "op": op, "key": key,
                        "epoch": fence.epoch().get(), "reason": reason.as_str()}),
            );
            Some(Stop::Lost)
        }
        Error::Denied { reason, .. } => {
            emit(
                json!({"event": "refused", "member": member, "op": op, "key": key,
                        "epoch": fence.epoch().get(), "reason": reason.as_str()}),
            );
            Some(Stop::Lost)
        }
        _ => None,
    }
}

type Work<T> = Result<T, Stop>;

impl Worker {
    async fn pause(&self, point: Point, task: &str) {
        if !self
            .args
            .pause_at
            .iter()
            .any(|(p, t)| *p == point && t == task)
        {
            return;
        }
        emit(
            json!({"event": "paused", "member": self.args.member, "point": point.as_str(), "task": task}),
        );
        // A closed stdin goes on at once.
        let _ = self.stdin.lock().await.next_line().await;
    }

    /// A failure that is not a refusal: reported, and the tenure's work stops (the runtime campaigns again).
    fn trouble(&self, op: &str, key: &str, fence: &Fence, error: &Error) -> Stop {
        if let Some(stop) = refused(&self.args.member, op, key, fence, error) {
            return stop;
        }
        emit(
            json!({"event": "error", "member": self.args.member, "op": op, "key": key,
                    "epoch": fence.epoch().get(), "error": error.to_string()}),
        );
        Stop::Lost
    }

    /// One call to the engine under `key`, with the faults the flags ask for: the outcome to record.
    async fn call(&self, task: &str, key: &str, faults: bool) -> Outcome {
        let payload = json!({"task": task, "image": "api:1.7"});
        let task = &format!("{}:{task}", self.args.lease);
        if faults && fastrand::u8(0..100) < self.args.late {
            return match self
                .engine
                .send_late(key, task, &payload, self.args.late_by)
                .await
            {
                Ok(()) => Outcome::Unknown(json!({"timeout": "no reply"})),
                Err(e) => Outcome::Unknown(json!({ "error": e })),
            };
        }
        let latency = self.args.call.mul_f64(fastrand::f64());
        tokio::time::sleep(latency).await;
        match self.engine.apply(key, task, &payload).await {
            Ok(_) if faults && fastrand::u8(0..100) < self.args.lose_reply => {
                Outcome::Unknown(json!({"timeout": "reply lost"}))
            }
            Ok(deliveries) => Outcome::Done(json!({ "deliveries": deliveries })),
            Err(e) => Outcome::Unknown(json!({ "error": e })),
        }
    }

    /// Settles one effect in doubt: asks the engine about its key; confirms what it applied, retries the same
    /// key otherwise (and reports the retry's outcome).
    async fn settle(&self, fence: &Fence, doubt: &InDoubt) -> Work<()> {
        let key = &doubt.effect.key;
        self.pause(Point::BeforeSettle, &doubt.effect.task_key)
            .await;
        let known = match self.engine.inquire(key).await {
            Ok(known) => known,
            Err(e) => {
                emit(
                    json!({"event": "error", "member": self.args.member, "op": "inquire", "error": e}),
                );
                return Err(Stop::Lost);
            }
        };
        let settlement = match &known {
            Some(applied) => Settlement::Confirmed {
                observed: json!({"applied": true, "deliveries": applied.deliveries}),
            },
            None => Settlement::Retry {
                observed: json!({"applied": false}),
            },
        };
        let written = match self.store.effects().settle(fence, key, &settlement).await {
            Ok(written) => written,
            Err(Error::EffectConflict {
                reason: EffectConflict::Settled { .. },
                ..
            }) => return Ok(()),
            Err(e) => return Err(self.trouble("settle_effect", key, fence, &e)),
        };
        emit(
            json!({"event": "settled", "member": self.args.member, "key": key,
                    "attempt": doubt.effect.attempt, "from_epoch": doubt.effect.epoch.get(),
                    "resolution": if known.is_some() { "confirmed" } else { "retried" },
                    "epoch": fence.epoch().get(),
                    "in_doubt_ms": written.in_doubt_for.map(|d| d.as_millis() as u64),
                    "late_report": doubt.late_report.as_ref().map(|r| r.state.as_str())}),
        );
        if known.is_none() {
            // The retry is this tenure's attempt, as the ledger answered it (the same key): call the engine with
            // it, report its outcome.
            let (task, key) = (&written.effect.task_key, &written.effect.key);
            let outcome = self.call(task, key, false).await;
            self.record(fence, key, &outcome).await?;
        }
        Ok(())
    }

    async fn record(&self, fence: &Fence, key: &str, outcome: &Outcome) -> Work<()> {
        match self
            .store
            .effects()
            .record_outcome(fence, key, outcome)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(self.trouble("record_outcome", key, fence, &e)),
        }
    }

    /// Settles everything in doubt of the lease now (a new tenure's list, or this tenure's own unknowns).
    async fn settle_all(&self, fence: &Fence, listed: &[InDoubt]) -> Work<()> {
        for doubt in listed {
            self.settle(fence, doubt).await?;
        }
        Ok(())
    }

    async fn list(&self, fence: &Fence) -> Work<Vec<InDoubt>> {
        self.store
            .effects()
            .in_doubt(&self.args.lease)
            .await
            .map_err(|e| self.trouble("in_doubt", "-", fence, &e))
    }

    /// The task's effect, from the intent to the recorded outcome; `Ok(false)` when the key's effect was done
    /// already.
    async fn effect(&self, fence: &Fence, task: &str) -> Work<()> {
        let key = effect_key(&self.args.lease, task);
        let intent = json!({"launch": task, "image": "api:1.7"});
        let mut blocked_by = None;
        loop {
            match self
                .store
                .effects()
                .intend(fence, task, &key, &intent)
                .await
            {
                Ok(_) => break,
                Err(Error::EffectConflict {
                    reason: EffectConflict::Done,
                    ..
                }) => return Ok(()),
                Err(Error::InDoubt { effect_key, .. }) => {
                    let listed = self.list(fence).await?;
                    if !listed.iter().any(|d| d.effect.key == effect_key)
                        || blocked_by.as_ref() == Some(&effect_key)
                    {
                        // The ledger says the task waits for an effect that the in-doubt list does not show (or
                        // that settling did not clear): work would stop here for good.
                        emit(
                            json!({"event": "stuck", "member": self.args.member, "task": task,
                                    "key": effect_key, "epoch": fence.epoch().get()}),
                        );
                        return Err(Stop::Lost);
                    }
                    blocked_by = Some(effect_key);
                    self.settle_all(fence, &listed).await?;
                }
                Err(e) => return Err(self.trouble("record_intent", &key, fence, &e)),
            }
        }
        self.pause(Point::AfterIntent, task).await;
        let outcome = self.call(task, &key, true).await;
        self.pause(Point::AfterCall, task).await;
        self.record(fence, &key, &outcome).await?;
        if matches!(outcome, Outcome::Unknown(_)) {
            let listed = self.list(fence).await?;
            self.settle_all(fence, &listed).await?;
        }
        Ok(())
    }

    /// A tenure's work: settle what is in doubt, then the tasks in order.
    async fn lead(&self, ctx: &LeaderContext) -> Work<()> {
        let fence = ctx.fence();
        emit(
            json!({"event": "lead", "member": self.args.member, "epoch": fence.epoch().get(),
                    "in_doubt": ctx.in_doubt().len()}),
        );
        self.settle_all(&fence, ctx.in_doubt()).await?;
        let mut i = self
            .first_unfinished()
            .await
            .map_err(|e| self.trouble("read", "-", &fence, &e))?;
        while i < self.args.tasks {
            if !ctx.is_held() {
                return Err(Stop::Lost);
            }
            let task = task_key(i);
            let existing = self
                .store
                .tasks()
                .get(&self.args.lease, &task)
                .await
                .map_err(|e| self.trouble("read", &task, &fence, &e))?;
            match existing {
                Some(t) if t.state == TaskState::Succeeded => {
                    i += 1;
                    continue;
                }
                None if self.args.until_done => return Err(Stop::Finished),
                None => {
                    if let Err(e) = self.store.tasks().create(&fence, &task, &json!({})).await {
                        return Err(self.trouble("create_task", &task, &fence, &e));
                    }
                }
                Some(_) => {}
            }
            self.effect(&fence, &task).await?;
            match self
                .store
                .tasks()
                .transition(
                    &fence,
                    &task,
                    TaskState::Pending,
                    TaskState::Succeeded,
                    &json!({}),
                )
                .await
            {
                Ok(_)
                | Err(Error::Conflict {
                    actual: TaskState::Succeeded,
                    ..
                }) => {}
                Err(e) => return Err(self.trouble("transition_task", &task, &fence, &e)),
            }
            emit(
                json!({"event": "done", "member": self.args.member, "task": task, "epoch": fence.epoch().get()}),
            );
            i += 1;
        }
        Err(Stop::Finished)
    }

    /// Tasks are worked in order by one leader at a time, so every task before the first unfinished one is done.
    async fn first_unfinished(&self) -> pgfence::Result<u32> {
        use diesel::sql_types::{BigInt, Text};
        use diesel_async::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let mut conn = self.store.admin().conn().await?;
        let row: Count = diesel::sql_query(
            "SELECT count(*) AS n FROM pgfence.tasks WHERE lease = $1 AND state = 'succeeded'",
        )
        .bind::<Text, _>(format!(
            "{}/{}",
            self.store.admin().cluster(),
            self.args.lease
        ))
        .get_result(&mut *conn)
        .await
        .map_err(Error::from)?;
        Ok(u32::try_from(row.n).unwrap_or(u32::MAX))
    }
}

pub(super) async fn run(global: &Global, args: RescueWorkerArgs) -> CliResult {
    let url = global.url()?;
    let store = Store::connect(
        global
            .config(url, &global.cluster)
            .pool_size(2)
            .application_name(&args.member),
    )
    .await?;
    let engine = Engine::connect(&args.engine_url)
        .await
        .map_err(|e| Failure::new(1, e))?;
    let mut options = LeadershipOptions::new(args.ttl);
    options.poll_every = args.poll.unwrap_or(args.ttl / 4);
    // A tenure that ended mid-call still reports its outcome (refused, kept as a late report) before its callback
    // returns: the callback is never aborted for that.
    options.grace = Duration::from_secs(30);
    let worker = Arc::new(Worker {
        store: store.clone(),
        engine,
        stdin: Mutex::new(tokio::io::BufReader::new(tokio::io::stdin()).lines()),
        finished: std::sync::atomic::AtomicBool::new(false),
        args,
    });
    let elector = PgElector::new(store);
    let never = CancellationToken::new();
    loop {
        let w = worker.clone();
        let ended = run_with_leadership(
            &elector,
            &worker.args.lease,
            &worker.args.member,
            &options,
            &never,
            move |ctx| async move {
                if let Err(Stop::Finished) = w.lead(&ctx).await {
                    w.finished.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                Ok::<(), Failure>(())
            },
        )
        .await?;
        let _ = ended;
        if worker.finished.load(std::sync::atomic::Ordering::SeqCst)
            && worker
                .store
                .effects()
                .in_doubt(&worker.args.lease)
                .await?
                .is_empty()
        {
            emit(json!({"event": "exit", "member": worker.args.member}));
            return Ok(());
        }
    }
}
