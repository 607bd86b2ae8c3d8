//! `pgfence replica`: one replica process of a spreading supervisor, for operators trying pgfence and for tests
//! (and `pgfence demo --scenario spread`) that need real OS processes.
//!
//! It runs `Supervisor::new(PgElector::new(store), member)` with the controllers named on the command line,
//! until SIGTERM or SIGINT, then stops in order: every callback is cancelled and gets its grace, every lease is
//! released and the group left, and the process exits 0. What it does is printed as one JSON object per line on
//! stdout, flushed line by line (logs go to stderr), so that a test or the demo can follow every replica of a
//! group and compare what each believed with what the database recorded:
//!
//! - `joined` / `left_group`: this replica became (stopped being) a live member of its group;
//! - `lead`: a controller's callback started (`name`, `epoch`);
//! - `write`: with `--write-every`, a task written with the tenure's fence and whether the database took it;
//! - `stop`: the callback saw its context cancelled, and why (`handover`, `shutdown`, `lost`, `released`);
//! - `aborted`: the runtime stopped waiting for the callback at the end of its grace (a `--drain` longer
//!   than `--grace`); the callback's work goes on in its own task until the drain ends, as work a controller
//!   handed to a task of its own would;
//! - `returned`: the callback's work ended;
//! - `exit`: the process is about to exit 0.
//!
//! Every event has `member` and `at_us`, microseconds since the UNIX epoch by this machine's wall clock, taken
//! as the line is printed (right after the event), so that the stamps increase down the output: the replicas of
//! one test or demo run on one machine, so their stamps are comparable there (and only there).

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use pgfence::groups::MemberSpec;
use pgfence::leader::{
    BoxError, Elector, LeaderContext, LeadershipOptions, MemoryElector, PgElector, Spread,
    Supervisor, TenureEnd,
};
use pgfence::limits::{MAX_GROUP_NAMES, MAX_SHARDS};
use pgfence::reexports::tokio_util::sync::CancellationToken;
use pgfence::{Error, Store};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::output::json_line;
use super::{parse_duration, CliResult, Failure, Global};

/// `pgfence replica`'s flags.
#[derive(Debug, Args)]
pub(crate) struct ReplicaArgs {
    /// The group to spread over (without cluster: --cluster qualifies it).
    #[arg(long, default_value = "default")]
    group: String,
    /// This replica's member name: the holder of its leases (unique per replica, e.g. the pod name).
    #[arg(long)]
    member: String,
    /// Lead N controllers named controller-00, controller-01, … (zero-padded to 2 digits).
    #[arg(long, value_name = "N", default_value_t = 0)]
    controllers: u32,
    /// Lead these controllers too (comma-separated).
    #[arg(long, value_name = "NAME,…", value_delimiter = ',')]
    names: Vec<String>,
    /// A sharded controller: its shards are the names NAME/0 … NAME/(S-1) (with --shards).
    #[arg(long, value_name = "NAME", requires = "shards")]
    sharded: Option<String>,
    /// How many shards --sharded has.
    #[arg(long, value_name = "S", requires = "sharded")]
    shards: Option<u32>,
    /// The lease (and membership) ttl, e.g. 2s or 500ms.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    ttl: Duration,
    /// Longest wait between acquisition attempts and between roster reads (default ttl / 2).
    #[arg(long, value_parser = parse_duration)]
    poll: Option<Duration>,
    /// How long a callback gets to return once its context is cancelled.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    grace: Duration,
    /// This replica's capacity: a weight of 2 is assigned about twice the names of a weight of 1.
    #[arg(long, default_value_t = 1)]
    weight: u32,
    /// Names this replica leads whenever it is live (comma-separated; each one of its names).
    #[arg(long, value_name = "NAME,…", value_delimiter = ',')]
    pin: Vec<String>,
    /// Names this replica never leads (comma-separated).
    #[arg(long, value_name = "NAME,…", value_delimiter = ',')]
    exclude: Vec<String>,
    /// While leading a name, write a task with the tenure's fence this often and print each outcome.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    write_every: Option<Duration>,
    /// After its context is cancelled, a callback keeps running (and writing, with --write-every) this long
    /// before it returns: a drain. Longer than --grace, it overruns: the lease is released at the grace and the
    /// writes after the successor's acquisition are refused.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_drain)]
    drain: Duration,
    /// Do not spread: campaign for every name, as a supervisor without a group does.
    #[arg(long, conflicts_with_all = ["group", "weight", "pin", "exclude"])]
    no_spread: bool,
}

/// A drain: 0 (none, the default) or a duration as `parse_duration` reads it.
fn parse_drain(text: &str) -> Result<Duration, String> {
    match text.trim() {
        "0" | "0s" | "0ms" => Ok(Duration::ZERO),
        other => parse_duration(other),
    }
}

impl ReplicaArgs {
    /// The names this replica leads, in the order given: `--controllers`, then `--names`, then the shards.
    /// Checked here for what the library would only refuse once the command line had become a supervisor (or
    /// never: a count so large that expanding it would exhaust memory).
    fn names(&self) -> Result<Vec<String>, Failure> {
        let bad = |message: String| Failure::new(2, message);
        let shards = self.shards.unwrap_or(0);
        if self.sharded.is_some() && (shards == 0 || shards > MAX_SHARDS) {
            return Err(bad(format!(
                "--shards must be between 1 and {MAX_SHARDS}, got {shards}"
            )));
        }
        let total = self.controllers as usize + self.names.len() + shards as usize;
        if total > MAX_GROUP_NAMES {
            return Err(bad(format!(
                "at most {MAX_GROUP_NAMES} names in all (--controllers, --names and shards), got {total}"
            )));
        }
        let mut names: Vec<String> = (0..self.controllers)
            .map(|i| format!("controller-{i:02}"))
            .collect();
        names.extend(self.names.iter().cloned());
        if let Some(name) = &self.sharded {
            names.extend((0..shards).map(|i| format!("{name}/{i}")));
        }
        if names.is_empty() {
            return Err(bad(
                "nothing to lead: give --controllers N, --names A,B or --sharded NAME --shards S"
                    .to_owned(),
            ));
        }
        let mut seen = BTreeSet::new();
        if let Some(twice) = names.iter().find(|n| !seen.insert(n.as_str())) {
            return Err(bad(format!("{twice:?} is named twice")));
        }
        Ok(names)
    }

    fn leadership(&self) -> LeadershipOptions {
        let mut options = LeadershipOptions::new(self.ttl);
        options.grace = self.grace;
        options.poll_every = self.poll.unwrap_or(self.ttl / 2);
        options
    }
}

/// One event line. Fields that an event does not have are left out; `reason` is `null` on an accepted write.
#[derive(Debug, Serialize)]
struct Event<'a> {
    event: &'static str,
    member: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ok: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Option<&'static str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    at_us: i64,
}

impl<'a> Event<'a> {
    fn new(event: &'static str, member: &'a str) -> Event<'a> {
        Event {
            event,
            member,
            name: None,
            epoch: None,
            cause: None,
            detail: None,
            ok: None,
            reason: None,
            error: None,
            // Stamped when printed (`Events::emit`).
            at_us: 0,
        }
    }

    fn tenure(event: &'static str, member: &'a str, name: &'a str, epoch: i64) -> Event<'a> {
        Event {
            name: Some(name),
            epoch: Some(epoch),
            ..Event::new(event, member)
        }
    }
}

/// Microseconds since the UNIX epoch by this machine's wall clock (comparable between the processes of one
/// machine only).
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Prints the events of one replica: one line each, written whole and flushed, so lines from concurrent tasks
/// never interleave and a reader sees each as it happens. A reader that went away only stops the output: the
/// replica goes on (its exit code, not its output, says how it ended).
#[derive(Debug)]
struct Events {
    member: String,
    /// Set once `exit` is printed (or the run ends otherwise): nothing follows it, not even the `aborted` of a
    /// callback dropped as the process ends.
    closed: AtomicBool,
}

impl Events {
    /// Prints `event`, stamped as it is printed: under the lock of stdout, so that the stamps of the lines
    /// increase down the output (events of concurrent tasks are printed in the order they are stamped).
    fn emit(&self, mut event: Event<'_>) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        event.at_us = now_us();
        let Ok(mut line) = json_line(&event) else {
            return;
        };
        line.push('\n');
        let _ = stdout
            .write_all(line.as_bytes())
            .and_then(|()| stdout.flush());
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

/// Closes the events when the run ends, whichever way.
struct CloseOnDrop(Arc<Events>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// What every callback of this replica shares.
#[derive(Clone)]
struct Work {
    events: Arc<Events>,
    store: Store,
    write_every: Option<Duration>,
    drain: Duration,
    /// Held by every callback's work until it ends: the run waits for the channel to close before `exit`, so a
    /// drain that overran its grace still ends (and prints `returned`) before the process does.
    _alive: mpsc::Sender<()>,
}

/// `ctx.end_cause()` as a short word, and the loss's detail.
fn cause(ctx: &LeaderContext) -> (&'static str, Option<String>) {
    match ctx.end_cause() {
        Some(TenureEnd::Handover) => ("handover", None),
        Some(TenureEnd::Shutdown) => ("shutdown", None),
        Some(end) if end.is_loss() => ("lost", Some(end.to_string())),
        Some(TenureEnd::Released) => ("released", None),
        Some(other) => ("other", Some(other.to_string())),
        None => ("unknown", None),
    }
}

/// Prints `aborted` if the callback's future is dropped before its work ended: the runtime gave up waiting at
/// the end of the grace.
struct AbortNotice {
    events: Arc<Events>,
    name: String,
    epoch: i64,
    armed: bool,
}

impl Drop for AbortNotice {
    fn drop(&mut self) {
        if self.armed {
            let member = self.events.member.clone();
            self.events
                .emit(Event::tenure("aborted", &member, &self.name, self.epoch));
        }
    }
}

impl Work {
    /// The callback of one tenure of `name`. Its work runs in a task of its own: cancelled at the end of the
    /// grace, the callback is dropped, but a drain that overruns goes on writing — which is the case the fence
    /// exists for: the database refuses those writes once the successor acquired.
    async fn callback(self, name: String, ctx: LeaderContext) -> Result<(), BoxError> {
        let epoch = ctx.epoch().get();
        self.events
            .emit(Event::tenure("lead", &self.events.member, &name, epoch));
        let mut notice = AbortNotice {
            events: self.events.clone(),
            name: name.clone(),
            epoch,
            armed: true,
        };
        let work = tokio::spawn(self.tenure(name, ctx));
        let ended = work.await;
        notice.armed = false;
        ended.map_err(|e| Box::new(e) as BoxError)
    }

    /// Leads until the context is cancelled (writing, with `--write-every`), then drains.
    async fn tenure(self, name: String, ctx: LeaderContext) {
        let epoch = ctx.epoch().get();
        let member = self.events.member.as_str();
        let token = ctx.cancellation_token();
        let mut seq = 0u64;
        match self.write_every {
            Some(every) => {
                while !token.is_cancelled() {
                    self.write(&ctx, &name, &mut seq).await;
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = tokio::time::sleep(every) => {}
                    }
                }
            }
            None => token.cancelled().await,
        }
        let (cause, detail) = cause(&ctx);
        self.events.emit(Event {
            cause: Some(cause),
            detail,
            ..Event::tenure("stop", member, &name, epoch)
        });
        if !self.drain.is_zero() {
            let until = tokio::time::Instant::now() + self.drain;
            match self.write_every {
                Some(every) => {
                    // Writes on, with the same fence, whatever the context says: an overrunning drain.
                    while tokio::time::Instant::now() < until {
                        self.write(&ctx, &name, &mut seq).await;
                        tokio::time::sleep_until(until.min(tokio::time::Instant::now() + every))
                            .await;
                    }
                }
                None => tokio::time::sleep_until(until).await,
            }
        }
        self.events
            .emit(Event::tenure("returned", member, &name, epoch));
    }

    /// One task written with the tenure's fence, and its outcome.
    async fn write(&self, ctx: &LeaderContext, name: &str, seq: &mut u64) {
        *seq += 1;
        let epoch = ctx.epoch().get();
        // Epochs of a lease are unique, so keys of different tenures never collide.
        let key = format!("e{epoch}-{seq}");
        let outcome = self
            .store
            .tasks()
            .create(&ctx.fence(), &key, &json!({}))
            .await;
        let (ok, reason, error) = match outcome {
            Ok(_) => (true, None, None),
            Err(Error::Stale { reason, .. }) => (false, Some(reason.as_str()), None),
            Err(Error::Denied { reason, .. }) => (false, Some(reason.as_str()), None),
            Err(e) => (false, Some("error"), Some(e.to_string())),
        };
        self.events.emit(Event {
            ok: Some(ok),
            reason: Some(reason),
            error,
            ..Event::tenure("write", &self.events.member, name, epoch)
        });
    }
}

/// SIGTERM and SIGINT, registered before anything else so that a signal that arrives while the replica connects
/// is not lost (nor kills it unhandled): it is seen as soon as the supervisor runs, and stops it in order.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, Failure> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let fail = |e: std::io::Error| Failure::new(1, format!("cannot handle signals: {e}"));
            Ok(Signals {
                term: signal(SignalKind::terminate()).map_err(fail)?,
                int: signal(SignalKind::interrupt()).map_err(fail)?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The application_name of the replica's connections: its member name when PostgreSQL keeps it as it is
/// (printable ASCII, at most 63 bytes), so that the audit names the replica that wrote; else `pgfence-replica`.
fn application_name(member: &str) -> String {
    if !member.is_empty() && member.len() <= 63 && member.bytes().all(|b| (0x20..0x7f).contains(&b))
    {
        member.to_owned()
    } else {
        "pgfence-replica".to_owned()
    }
}

pub(crate) async fn run(global: &Global, args: ReplicaArgs) -> CliResult {
    let mut signals = Signals::new()?;
    let names = args.names()?;
    let options = args.leadership();
    // Bad input ends the replica before anything is written: a join to an in-memory group applies the library's
    // own checks (group, member name, names, weight, pins, exclusions, lease timing) without a database. The
    // supervisor checks most of them again before it runs, but not the member name: with a bad one it would
    // retry its join for ever.
    let mut spec = MemberSpec::new(names.iter().cloned());
    if !args.no_spread {
        spec = spec
            .weight(args.weight)
            .pin(args.pin.iter().cloned())
            .exclude(args.exclude.iter().cloned());
    }
    drop(
        MemoryElector::new()
            .join(&args.group, &args.member, &spec, &options.lease)
            .await?,
    );
    let url = global.url()?;
    let store = Store::connect(
        global
            .config(url, &global.cluster)
            // Acquisitions, the group's reads, belief reports and `--write-every` writes share 2 connections
            // (they queue for one; renewals have a connection of their own, and so has the listener): a fleet
            // converging at once opens at most 4 per replica, not 12. Idle connections close after 10 s: at
            // steady state a replica keeps its renewal connection and its listener, so a fleet of 100 replicas
            // holds about 200 backends.
            .pool_size(2)
            .idle_timeout(Duration::from_secs(10))
            .application_name(application_name(&args.member)),
    )
    .await?;
    // One read before the supervisor starts: a missing schema (exit 5) or a role without a grant on the cluster
    // (exit 8) ends the replica here, where the supervisor's loops would retry them for ever.
    store.groups().assignment(&args.group).await?;

    let events = Arc::new(Events {
        member: args.member.clone(),
        closed: AtomicBool::new(false),
    });
    let _close = CloseOnDrop(events.clone());
    let (alive, mut ended) = mpsc::channel::<()>(1);
    let work = Work {
        events: events.clone(),
        store: store.clone(),
        write_every: args.write_every,
        drain: args.drain,
        _alive: alive,
    };
    let mut supervisor = Supervisor::new(PgElector::new(store), args.member.clone());
    supervisor = if args.no_spread {
        supervisor.no_spread()
    } else {
        supervisor.spread(
            Spread::new(args.group.clone())
                .weight(args.weight)
                .pin(args.pin.iter().cloned())
                .exclude(args.exclude.iter().cloned()),
        )
    };
    // The plain controllers come first in `names`; the shards, last, are added as one sharded controller.
    let plain = args.controllers as usize + args.names.len();
    for name in names.into_iter().take(plain) {
        let work = work.clone();
        supervisor = supervisor.controller(name.clone(), options, move |ctx| {
            work.clone().callback(name.clone(), ctx)
        });
    }
    if let (Some(sharded), Some(shards)) = (&args.sharded, args.shards) {
        let (work, sharded_name) = (work.clone(), sharded.clone());
        supervisor = supervisor.sharded(sharded.clone(), shards, options, move |shard, ctx| {
            work.clone()
                .callback(format!("{sharded_name}/{}", shard.index), ctx)
        })?;
    }
    // Only the callbacks hold the channel from here: it closes once the supervisor is gone and every work ended.
    drop(work);

    // `joined` / `left_group`, from the status handle, which the supervisor updates as its membership changes.
    // (Waited for, not polled: a fleet of 100 replicas polling every 10 ms woke the machine 10,000 times a second.)
    let mut membership = supervisor.status().membership();
    let watcher = tokio::spawn({
        let events = events.clone();
        async move {
            let mut member = false;
            loop {
                let now = membership.borrow_and_update().unwrap_or(false);
                if now != member {
                    member = now;
                    let event = if now { "joined" } else { "left_group" };
                    events.emit(Event::new(event, &events.member));
                }
                if membership.changed().await.is_err() {
                    return;
                }
            }
        }
    });

    let shutdown = CancellationToken::new();
    let mut running = tokio::spawn(supervisor.run(shutdown.clone()));
    let ran = tokio::select! {
        // It returns by itself only with bad input, before it ran anything.
        ran = &mut running => ran,
        () = signals.recv() => {
            shutdown.cancel();
            tokio::select! {
                ran = &mut running => ran,
                () = signals.recv() => {
                    watcher.abort();
                    return Err(Failure::new(130, "interrupted again while stopping in order"));
                }
            }
        }
    };
    watcher.abort();
    ran.map_err(|e| Failure::new(1, format!("the supervisor stopped abnormally: {e}")))??;
    // Work that overran its grace is still draining: wait for it (bounded by the drain), so that its writes and
    // its `returned` come before `exit`.
    let _ = tokio::time::timeout(args.drain + Duration::from_secs(1), ended.recv()).await;
    events.emit(Event::new("exit", &events.member));
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(line: &[&str]) -> ReplicaArgs {
        match crate::Cli::try_parse_from(["pgfence", "replica"].iter().chain(line)) {
            Ok(crate::Cli {
                command: crate::Command::Replica(args),
                ..
            }) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn names_come_from_controllers_names_and_shards_in_that_order() {
        let names = args(&[
            "--member",
            "m",
            "--controllers",
            "2",
            "--names",
            "a,b",
            "--sharded",
            "rec",
            "--shards",
            "3",
        ])
        .names()
        .unwrap();
        assert_eq!(
            names,
            [
                "controller-00",
                "controller-01",
                "a",
                "b",
                "rec/0",
                "rec/1",
                "rec/2"
            ]
        );
        assert_eq!(
            args(&["--member", "m", "--controllers", "101"])
                .names()
                .unwrap()[100],
            "controller-100"
        );
    }

    #[test]
    fn bad_counts_are_refused_before_anything_is_built() {
        for line in [
            &["--member", "m"][..],
            &["--member", "m", "--sharded", "r", "--shards", "0"],
            &["--member", "m", "--sharded", "r", "--shards", "131073"],
            &["--member", "m", "--controllers", "4294967295"],
            &[
                "--member",
                "m",
                "--controllers",
                "1",
                "--names",
                "controller-00",
            ],
        ] {
            let failure = args(line).names().unwrap_err();
            assert_eq!(failure.code, 2, "{line:?}: {}", failure.message);
        }
    }

    #[test]
    fn a_drain_may_be_zero_and_events_are_one_escaped_line() {
        assert_eq!(parse_drain("0"), Ok(Duration::ZERO));
        assert_eq!(parse_drain("1s"), Ok(Duration::from_secs(1)));
        let line = json_line(&Event {
            ok: Some(false),
            reason: Some(Some("superseded")),
            ..Event::tenure("write", "pod\u{202e}a", "controller-00", 7)
        })
        .unwrap();
        assert!(
            line.starts_with(
                r#"{"event":"write","member":"pod\u202ea","name":"controller-00","epoch":7,"ok":false,"reason":"superseded","at_us":"#
            ),
            "{line}"
        );
        assert!(!line.contains('\n'));
        let accepted = json_line(&Event {
            ok: Some(true),
            reason: Some(None),
            ..Event::tenure("write", "m", "n", 1)
        })
        .unwrap();
        assert!(
            accepted.contains(r#""ok":true,"reason":null,"#),
            "{accepted}"
        );
    }
}
