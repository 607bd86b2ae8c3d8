//! `pgfence demo --scenario spread`: leaders spread over replica processes, in about ten seconds.
//!
//! Three `pgfence replica` child processes (this same binary, each with its own connections) join one group with
//! six controllers and split them 2/2/2. A fourth joins and takes its share: exactly the names its quota needs
//! move, all to it, each by a cooperative handover. Every replica writes with its fence every 20 ms while it
//! leads and keeps writing through a slow drain (1 s) that overruns its grace (300 ms): the runtime releases the
//! lease at the grace, the successor acquires at once, and the database refuses (and audits) every write of the
//! old epoch from then on. Then one replica is killed with SIGKILL: no release, no leave; the survivors take its
//! names once its ttl ran out. The rest stop in order (SIGTERM). The closing report reads the tenures of the moved
//! names back through the library's overlap review — what each holder believed beside what the database
//! recorded — and counts the writes: accepted, refused (as each replica reported them) and audited (as the
//! database recorded them).
//!
//! The replicas' event lines (`pgfence replica`) carry wall-clock stamps of this machine; the database's times are
//! the database's clock. On the embedded server both are this machine's clock, and the report says which is which
//! all the same.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use pgfence::embedded::EmbeddedServer;
use pgfence::{Overlap, RejectionFilter, Store, TenureReview};
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{scalar, Check, Narrator};
use crate::groups::{self, GroupView};
use crate::{table, CliResult, Failure, Global};

/// The group, without cluster.
const GROUP: &str = "demo";
/// Controllers per replica: `controller-00` … `controller-05`.
const NAMES: usize = 6;
const TTL: Duration = Duration::from_secs(2);
/// The callbacks' grace: shorter than the drain, so that every drain overruns it.
const GRACE: Duration = Duration::from_millis(300);
const WRITE_EVERY: Duration = Duration::from_millis(20);
const DRAIN: Duration = Duration::from_secs(1);
/// How many lines of a replica's stderr are kept, to show when it fails.
const STDERR_LINES: usize = 20;

/// Every event line of every replica, in arrival order.
type Log = Arc<Mutex<Vec<Value>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Replica {
    member: String,
    child: tokio::process::Child,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// The task reading its event lines: done once it read the last one (end of file).
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Replica {
    /// Waits (bounded) until its last event line is in the log: a process that exited may still have lines in
    /// the pipe.
    async fn read_out(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
    }
}

/// The replica processes. Each is killed when dropped (`kill_on_drop`): an error, a failed check or Ctrl-C
/// never leaves one running against a server that is about to be removed.
struct Fleet {
    exe: std::path::PathBuf,
    url: String,
    /// The global flags the replicas share with this process (cluster, timeouts, expected identity).
    flags: Vec<String>,
    log: Log,
    replicas: Vec<Replica>,
}

impl Fleet {
    fn spawn(&mut self, member: &str) -> Result<(), Failure> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut child = tokio::process::Command::new(&self.exe)
            .args(&self.flags)
            .args(["replica", "--group", GROUP, "--member", member])
            .args(["--controllers", &NAMES.to_string()])
            .args(["--ttl", &ms(TTL), "--grace", &ms(GRACE)])
            .args(["--write-every", &ms(WRITE_EVERY), "--drain", &ms(DRAIN)])
            // The URL travels in the environment, never on a command line that `ps` shows.
            .env("DATABASE_URL", &self.url)
            .env_remove("PGFENCE_CLUSTER")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Failure::new(1, format!("cannot start a replica: {e}")))?;
        let reader = child.stdout.take().map(|stdout| {
            let log = self.log.clone();
            let member = member.to_owned();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let event = serde_json::from_str::<Value>(&line).unwrap_or_else(
                        |_| serde_json::json!({"event": "unreadable", "member": member, "line": line}),
                    );
                    lock(&log).push(event);
                }
            })
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let tail = stderr.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut tail = lock(&tail);
                    if tail.len() == STDERR_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        self.replicas.push(Replica {
            member: member.to_owned(),
            child,
            stderr,
            reader,
        });
        Ok(())
    }

    /// SIGKILL: no release, no leave, no last words.
    async fn kill(&mut self, member: &str) -> Result<(), Failure> {
        let Some(i) = self.replicas.iter().position(|r| r.member == member) else {
            return Ok(());
        };
        let mut replica = self.replicas.remove(i);
        replica
            .child
            .kill()
            .await
            .map_err(|e| Failure::new(1, format!("cannot kill {member}: {e}")))?;
        replica.read_out().await;
        Ok(())
    }

    /// SIGTERM to every replica at once (each drains, releases and leaves), then each one's exit code (`None`:
    /// still running 10 s later, and killed) and, for those that did not exit 0, the last lines of their stderr.
    async fn stop_all(&mut self) -> (BTreeMap<String, Option<i32>>, Vec<(String, Vec<String>)>) {
        for replica in &self.replicas {
            if let Some(pid) = replica.child.id() {
                let _ = tokio::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
        }
        let mut exits = BTreeMap::new();
        let mut tails = Vec::new();
        for mut replica in self.replicas.drain(..) {
            let code =
                match tokio::time::timeout(Duration::from_secs(10), replica.child.wait()).await {
                    Ok(Ok(status)) => status.code(),
                    _ => {
                        let _ = replica.child.kill().await;
                        None
                    }
                };
            replica.read_out().await;
            if code != Some(0) {
                tails.push((
                    replica.member.clone(),
                    lock(&replica.stderr).iter().cloned().collect(),
                ));
            }
            exits.insert(replica.member, code);
        }
        (exits, tails)
    }

    /// A replica that is no longer running, with its exit code and the last lines of its stderr.
    fn crashed(&mut self) -> Option<(String, Option<i32>, Vec<String>)> {
        self.replicas
            .iter_mut()
            .find_map(|r| match r.child.try_wait() {
                Ok(Some(status)) => Some((
                    r.member.clone(),
                    status.code(),
                    lock(&r.stderr).iter().cloned().collect(),
                )),
                _ => None,
            })
    }

    fn events(&self) -> Vec<Value> {
        lock(&self.log).clone()
    }

    fn mark(&self) -> usize {
        lock(&self.log).len()
    }
}

/// One step of the story: names led per replica before and after, what moved, and how it moved.
#[derive(Debug, Serialize)]
struct Step {
    step: &'static str,
    /// Names led by each live member when the step began.
    before: BTreeMap<String, Vec<String>>,
    /// Names led by each live member once the group converged (or when the wait for it ended).
    after: BTreeMap<String, Vec<String>>,
    /// Names whose tenure changed during the step.
    moved: Vec<String>,
    /// The fewest moves the step allows (the newcomer's share; the killed replica's names).
    minimum_moves: Option<usize>,
    /// Tenures handed over during the step (`stop` events with cause `handover`).
    handovers: usize,
    /// Whether the group converged (every live member leads what the assignment gives it, every name led).
    converged: bool,
    took_ms: u64,
}

/// A tenure of a moved name: the library's review of it, and the writes of its epoch as its holder reported
/// them and as the database audited the refused ones.
#[derive(Debug, Serialize)]
struct TenureRow {
    #[serde(flatten)]
    review: TenureReview,
    writes_accepted: u64,
    writes_refused: u64,
    audited: i64,
}

#[derive(Debug, Serialize)]
struct NameReview {
    name: String,
    /// The steps that moved it (`join`, `kill`).
    moved_in: Vec<&'static str>,
    tenures: Vec<TenureRow>,
}

#[derive(Debug, Default, Serialize)]
struct Writes {
    accepted: u64,
    refused: u64,
    audited: i64,
    /// Writes of an epoch accepted after its successor's acquisition (the review, every name).
    accepted_after_successor: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    scenario: &'static str,
    cluster: String,
    group: String,
    names: usize,
    ttl_ms: u64,
    grace_ms: u64,
    write_every_ms: u64,
    drain_ms: u64,
    steps: Vec<Step>,
    reviews: Vec<NameReview>,
    writes: Writes,
    /// Exit codes of the replicas stopped with SIGTERM (`null`: did not exit within 10 s).
    exits: BTreeMap<String, Option<i32>>,
    checks: Vec<Check>,
    verdict: bool,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn names() -> Vec<String> {
    (0..NAMES).map(|i| format!("controller-{i:02}")).collect()
}

/// The group's view now (`None` before any member joined).
async fn group_view(admin: &Store, qualified: &str) -> Result<Option<GroupView>, Failure> {
    Ok(groups::read_group(admin, Some(qualified))
        .await?
        .into_iter()
        .next())
}

/// Names led by each live member.
fn live_leads(view: Option<&GroupView>) -> BTreeMap<String, Vec<String>> {
    let Some(view) = view else {
        return BTreeMap::new();
    };
    let live = view.live();
    view.leads()
        .into_iter()
        .filter(|(m, _)| live.contains(m))
        .collect()
}

/// Waits (bounded) until exactly `members` are live and lead what the group's assignment gives them, every name
/// led; returns the last view and whether it converged. Stops early when a replica exited.
async fn converge(
    admin: &Store,
    qualified: &str,
    fleet: &mut Fleet,
    members: &BTreeSet<String>,
    within: Duration,
) -> Result<(Option<GroupView>, bool), Failure> {
    let started = Instant::now();
    loop {
        let view = group_view(admin, qualified).await?;
        if let Some(v) = &view {
            if &v.live() == members && v.balanced && v.assignment.len() == NAMES {
                return Ok((view, true));
            }
        }
        if started.elapsed() > within || fleet.crashed().is_some() {
            return Ok((view, false));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Says so when a replica exited while the group was converging (it should run until stopped).
fn tell_crash(story: &Narrator, fleet: &mut Fleet) {
    if let Some((member, code, tail)) = fleet.crashed() {
        story.say(
            &member,
            format!(
                "exited unexpectedly ({}); its last log lines: {}",
                code.map_or_else(
                    || "killed by a signal".to_owned(),
                    |c| format!("exit code {c}")
                ),
                tail.join(" | ")
            ),
        );
    }
}

/// Epoch of each controller's lease in the cluster.
async fn epochs(admin: &Store, cluster: &str) -> Result<BTreeMap<String, i64>, Failure> {
    let prefix = format!("{cluster}/");
    Ok(admin
        .all_leases()
        .await?
        .into_iter()
        .filter_map(|l| {
            let name = l.name.strip_prefix(&prefix)?.to_owned();
            Some((name, l.epoch?.get()))
        })
        .collect())
}

fn moved(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) -> Vec<String> {
    after
        .iter()
        .filter(|(name, epoch)| before.get(*name) != Some(epoch))
        .map(|(name, _)| name.clone())
        .collect()
}

fn handovers(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["event"] == "stop" && e["cause"] == "handover")
        .count()
}

/// Waits (bounded by the drain and a second) until every callback cancelled since `from` returned, so that a
/// step's drains end before the next step.
async fn drained(fleet: &Fleet, from: usize) {
    let deadline = Instant::now() + DRAIN + Duration::from_secs(1);
    while Instant::now() < deadline {
        let events = fleet.events();
        let key = |e: &Value| {
            (
                e["member"].to_string(),
                e["name"].to_string(),
                e["epoch"].as_i64(),
            )
        };
        let stops: BTreeSet<_> = events[from.min(events.len())..]
            .iter()
            .filter(|e| e["event"] == "stop")
            .map(key)
            .collect();
        let returned: BTreeSet<_> = events
            .iter()
            .filter(|e| e["event"] == "returned")
            .map(key)
            .collect();
        if stops.is_subset(&returned) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// "r1 2, r2 2, r3 2"
fn counts(leads: &BTreeMap<String, Vec<String>>) -> String {
    if leads.is_empty() {
        return "-".to_owned();
    }
    leads
        .iter()
        .map(|(m, n)| format!("{m} {}", n.len()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "r1: controller-00, controller-03; r2: …"
fn listing(leads: &BTreeMap<String, Vec<String>>) -> String {
    leads
        .iter()
        .map(|(m, n)| format!("{m}: {}", n.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Names each replica leads by its own events (`lead` adds, `stop` removes), leaving out `gone` replicas.
fn believed(events: &[Value], gone: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut leading: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in events {
        let (Some(member), Some(name)) = (e["member"].as_str(), e["name"].as_str()) else {
            continue;
        };
        if gone.contains(member) {
            continue;
        }
        match e["event"].as_str() {
            Some("lead") => {
                leading
                    .entry(member.to_owned())
                    .or_default()
                    .insert(name.to_owned());
            }
            Some("stop") => {
                leading.entry(member.to_owned()).or_default().remove(name);
            }
            _ => {}
        }
    }
    leading.retain(|_, names| !names.is_empty());
    leading
}

/// The writes of a drain: those of tenure `epoch` of `name` after its holder's `stop`.
#[derive(Debug, Default)]
struct Drain {
    accepted: u64,
    /// Refused writes by reason.
    refused: BTreeMap<String, u64>,
}

fn drain_writes(events: &[Value], name: &str, epoch: i64) -> Drain {
    let of = |e: &&Value| e["name"] == name && e["epoch"].as_i64() == Some(epoch);
    let mut drain = Drain::default();
    let Some(stop) = events.iter().filter(of).position(|e| e["event"] == "stop") else {
        return drain;
    };
    for e in events
        .iter()
        .filter(of)
        .skip(stop)
        .filter(|e| e["event"] == "write")
    {
        if e["ok"] == true {
            drain.accepted += 1;
        } else {
            let reason = e["reason"].as_str().unwrap_or("unknown").to_owned();
            *drain.refused.entry(reason).or_default() += 1;
        }
    }
    drain
}

/// Writes per (name, epoch) as the replicas reported them: (accepted, refused).
fn reported_writes(events: &[Value]) -> BTreeMap<(String, i64), (u64, u64)> {
    let mut writes: BTreeMap<(String, i64), (u64, u64)> = BTreeMap::new();
    for e in events.iter().filter(|e| e["event"] == "write") {
        let (Some(name), Some(epoch)) = (e["name"].as_str(), e["epoch"].as_i64()) else {
            continue;
        };
        let entry = writes.entry((name.to_owned(), epoch)).or_default();
        if e["ok"] == true {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }
    writes
}

pub(super) async fn run(
    global: &Global,
    story: &Narrator,
    server: Option<EmbeddedServer>,
    url: String,
    cluster: String,
    json: bool,
) -> CliResult {
    let admin = super::admin_store(global, &url, &cluster).await?;
    let qualified = format!("{cluster}/{GROUP}");
    story.say(
        "setup",
        format!(
            "pgfence schema ready on {}; group {qualified}: {NAMES} controllers, ttl {TTL:?}; every replica writes \
             every {WRITE_EVERY:?} with its fence while it leads, and through a {DRAIN:?} drain that overruns \
             its {GRACE:?} grace",
            admin.target()
        ),
    );
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            1,
            format!("cannot find this program to start replicas: {e}"),
        )
    })?;
    let mut flags = vec![
        "--cluster".to_owned(),
        cluster.clone(),
        "--connect-timeout".to_owned(),
        format!("{}ms", global.connect_timeout.as_millis()),
    ];
    if let Some(id) = &global.expect_system_identifier {
        flags.extend(["--expect-system-identifier".to_owned(), id.clone()]);
    }
    if let Some(id) = &global.expect_instance_id {
        flags.extend(["--expect-instance-id".to_owned(), id.clone()]);
    }
    // Declared after `server`: dropped first, so the replicas are gone before the server is removed.
    let mut fleet = Fleet {
        exe,
        url: url.clone(),
        flags,
        log: Arc::default(),
        replicas: Vec::new(),
    };
    let mut steps = Vec::new();
    let mut checks = Vec::new();
    let mut members: BTreeSet<String> = BTreeSet::new();

    // 1. Three replicas split the names.
    story.say(
        "fleet",
        "starting r1, r2, r3: `pgfence replica` processes, each with its own connections",
    );
    let started = Instant::now();
    let mark = fleet.mark();
    for member in ["r1", "r2", "r3"] {
        fleet.spawn(member)?;
        members.insert(member.to_owned());
    }
    let (view, converged) = converge(
        &admin,
        &qualified,
        &mut fleet,
        &members,
        Duration::from_secs(15),
    )
    .await?;
    tell_crash(story, &mut fleet);
    let after = live_leads(view.as_ref());
    let split = converged && after.values().all(|n| n.len() == NAMES / 3);
    let handed = handovers(&fleet.events()[mark..]);
    story.say(
        "group",
        if converged {
            format!(
                "{} after {:.1}s ({handed} handover{} on the way): {}",
                counts(&after),
                started.elapsed().as_secs_f64(),
                if handed == 1 { "" } else { "s" },
                listing(&after)
            )
        } else {
            format!("did not converge within 15s: {}", listing(&after))
        },
    );
    checks.push(Check {
        invariant: "three replicas split the 6 names 2/2/2",
        held: split,
        detail: counts(&after),
    });
    steps.push(Step {
        step: "start",
        before: BTreeMap::new(),
        after: after.clone(),
        moved: Vec::new(),
        minimum_moves: None,
        handovers: handed,
        converged,
        took_ms: ms(started.elapsed()),
    });
    drained(&fleet, mark).await;

    // 2. A fourth joins and takes its share; the names it takes are handed over through overrunning drains.
    let before = after;
    let epochs_before = epochs(&admin, &cluster).await?;
    story.say("fleet", "starting r4");
    let started = Instant::now();
    let mark = fleet.mark();
    fleet.spawn("r4")?;
    members.insert("r4".to_owned());
    let (view, converged) = converge(
        &admin,
        &qualified,
        &mut fleet,
        &members,
        Duration::from_secs(8),
    )
    .await?;
    tell_crash(story, &mut fleet);
    let took = started.elapsed();
    let after = live_leads(view.as_ref());
    let epochs_after = epochs(&admin, &cluster).await?;
    let join_moved = moved(&epochs_before, &epochs_after);
    let share = view
        .as_ref()
        .map_or(0, |v| v.assignment.names_of("r4").len());
    let r4: Vec<String> = after.get("r4").cloned().unwrap_or_default();
    let from = |name: &str| {
        before
            .iter()
            .find(|(_, names)| names.iter().any(|n| n == name))
            .map_or("nobody", |(m, _)| m.as_str())
            .to_owned()
    };
    story.say(
        "group",
        format!(
            "r4 took {} after {:.1}s: {} move{}, its share of {share}; now {}",
            if r4.is_empty() {
                "nothing".to_owned()
            } else {
                r4.iter()
                    .map(|n| format!("{n} (from {})", from(n)))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            took.as_secs_f64(),
            join_moved.len(),
            if join_moved.len() == 1 { "" } else { "s" },
            counts(&after)
        ),
    );
    drained(&fleet, mark).await;
    let events = fleet.events();
    for name in &join_moved {
        let (Some(old), Some(new)) = (epochs_before.get(name), epochs_after.get(name)) else {
            continue;
        };
        let drain = drain_writes(&events, name, *old);
        story.say(
            &from(name),
            format!(
                "drained {name} (epoch {old}) for {DRAIN:?}, writing every {WRITE_EVERY:?} past its {GRACE:?} \
                 grace: {} writes accepted before the release, then {} refused ({}) once r4 acquired epoch {new}",
                drain.accepted,
                drain.refused.values().sum::<u64>(),
                if drain.refused.is_empty() {
                    "none".to_owned()
                } else {
                    drain
                        .refused
                        .iter()
                        .map(|(reason, n)| format!("{n} {reason}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        );
    }
    checks.push(Check {
        invariant: "a joining replica takes its share with the minimum moves, all to it",
        held: converged && !join_moved.is_empty() && join_moved == r4 && join_moved.len() == share,
        detail: format!(
            "{} moved ({}), r4's share {share}, r4 leads {}",
            join_moved.len(),
            join_moved.join(", "),
            r4.join(", ")
        ),
    });
    steps.push(Step {
        step: "join",
        before: before.clone(),
        after: after.clone(),
        moved: join_moved.clone(),
        minimum_moves: Some(share),
        handovers: handovers(&events[mark..]),
        converged,
        took_ms: ms(took),
    });

    // 3. One replica is killed: its names wait for its ttl, then go to the survivors.
    let before = after;
    let victim = before
        .iter()
        .filter(|(m, _)| m.as_str() != "r4")
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
        .map(|(m, _)| m.clone())
        .unwrap_or_else(|| "r1".to_owned());
    let victim_names = before.get(&victim).cloned().unwrap_or_default();
    let epochs_before = epochs(&admin, &cluster).await?;
    story.say(
        "fleet",
        format!(
            "killing {victim} (SIGKILL), which leads {}: no release, no leave",
            victim_names.join(", ")
        ),
    );
    let started = Instant::now();
    let mark = fleet.mark();
    fleet.kill(&victim).await?;
    members.remove(&victim);
    let (view, converged) = converge(
        &admin,
        &qualified,
        &mut fleet,
        &members,
        3 * TTL + Duration::from_secs(3),
    )
    .await?;
    tell_crash(story, &mut fleet);
    let took = started.elapsed();
    let after = live_leads(view.as_ref());
    let epochs_after = epochs(&admin, &cluster).await?;
    let kill_moved = moved(&epochs_before, &epochs_after);
    story.say(
        "group",
        format!(
            "the survivors took {} after {:.1}s ({victim}'s membership and leases expired {TTL:?} after its \
             last heartbeat): now {}",
            if kill_moved.is_empty() {
                "nothing".to_owned()
            } else {
                kill_moved.join(", ")
            },
            took.as_secs_f64(),
            counts(&after)
        ),
    );
    checks.push(Check {
        invariant:
            "a killed replica's names go to the survivors after its ttl, and nothing else moves",
        held: converged && !kill_moved.is_empty() && kill_moved == victim_names,
        detail: format!(
            "{victim} led {}; moved: {}",
            victim_names.join(", "),
            kill_moved.join(", ")
        ),
    });
    steps.push(Step {
        step: "kill",
        before: before.clone(),
        after: after.clone(),
        moved: kill_moved.clone(),
        minimum_moves: Some(victim_names.len()),
        handovers: handovers(&fleet.events()[mark..]),
        converged,
        took_ms: ms(took),
    });

    // Each name led by exactly one replica, by the database and by the replicas' own accounts, balanced.
    let gone = BTreeSet::from([victim.clone()]);
    let by_database: BTreeMap<String, BTreeSet<String>> = after
        .iter()
        .filter(|(_, n)| !n.is_empty())
        .map(|(m, n)| (m.clone(), n.iter().cloned().collect()))
        .collect();
    // A replica prints `lead` once its callback starts, just after the acquisition the database already shows,
    // and its line takes a moment through the pipe: its account may lag the database's by that much.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut by_events = believed(&fleet.events(), &gone);
    while by_events != by_database && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(25)).await;
        by_events = believed(&fleet.events(), &gone);
    }
    let led: Vec<&String> = by_database.values().flatten().collect();
    let distinct: BTreeSet<&String> = led.iter().copied().collect();
    let sizes: Vec<usize> = members
        .iter()
        .map(|m| by_database.get(m).map_or(0, BTreeSet::len))
        .collect();
    let spread = sizes.iter().max().unwrap_or(&0) - sizes.iter().min().unwrap_or(&0);
    checks.push(Check {
        invariant: "each name led by exactly one replica at the end, balance within 1",
        held: led.len() == NAMES
            && distinct.len() == NAMES
            && spread <= 1
            && by_events == by_database,
        detail: format!(
            "{} names led, {} distinct; per replica {sizes:?}; the replicas' own accounts {}",
            led.len(),
            distinct.len(),
            if by_events == by_database {
                "agree"
            } else {
                "DISAGREE"
            }
        ),
    });

    // 4. The rest stop in order.
    story.say(
        "fleet",
        format!(
            "stopping {} (SIGTERM): each drains, releases and leaves",
            members.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
    );
    let (exits, tails) = fleet.stop_all().await;
    for (member, tail) in tails {
        story.say(
            &member,
            format!("did not exit 0; its last log lines: {}", tail.join(" | ")),
        );
    }
    let events = fleet.events();
    let exited: BTreeSet<&str> = events
        .iter()
        .filter(|e| e["event"] == "exit")
        .filter_map(|e| e["member"].as_str())
        .collect();
    let orderly = members
        .iter()
        .all(|m| exits.get(m) == Some(&Some(0)) && exited.contains(m.as_str()));
    story.say(
        "fleet",
        if orderly {
            "every replica exited 0".to_owned()
        } else {
            format!("not every replica exited in order: {exits:?}")
        },
    );
    checks.push(Check {
        invariant: "replicas stopped with SIGTERM exit 0 after an orderly stop",
        held: orderly,
        detail: format!(
            "{} of {} exited 0",
            exits.values().filter(|c| **c == Some(0)).count(),
            members.len()
        ),
    });

    // The database's account: the review of every name, the audit.
    let writes = reported_writes(&events);
    let mut filter = RejectionFilter::default();
    filter.limit = Some(100_000);
    let rejections = admin.rejections(&filter).await?;
    let prefix = format!("{cluster}/");
    let mut audited: BTreeMap<(String, i64), i64> = BTreeMap::new();
    let mut unattributed = 0;
    for r in rejections.iter().filter(|r| r.operation == "create_task") {
        match (r.scope.as_str(), r.lease.strip_prefix(&prefix)) {
            ("tenure", Some(name)) => {
                *audited
                    .entry((name.to_owned(), r.presented_epoch))
                    .or_default() += r.count
            }
            _ => unattributed += r.count,
        }
    }
    let holders: BTreeMap<(String, i64), String> = events
        .iter()
        .filter(|e| e["event"] == "lead")
        .filter_map(|e| {
            Some((
                (e["name"].as_str()?.to_owned(), e["epoch"].as_i64()?),
                e["member"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let mut totals = Writes::default();
    let mut audit_ok = unattributed == 0;
    let mut mismatches = Vec::new();
    for (key, (accepted, refused)) in &writes {
        totals.accepted += accepted;
        totals.refused += refused;
        let count = audited.get(key).copied().unwrap_or(0);
        // A killed replica may have been refused (and audited) without living to print it.
        let killed = holders.get(key) == Some(&victim);
        if count != *refused as i64 && !(killed && count > *refused as i64) {
            audit_ok = false;
            mismatches.push(format!(
                "{} epoch {}: {refused} refused, {count} audited",
                key.0, key.1
            ));
        }
    }
    totals.audited = audited.values().sum::<i64>() + unattributed;
    let moved_in = |name: &str| {
        let mut steps = Vec::new();
        if join_moved.iter().any(|n| n == name) {
            steps.push("join");
        }
        if kill_moved.iter().any(|n| n == name) {
            steps.push("kill");
        }
        steps
    };
    let mut reviews = Vec::new();
    let mut overrun_refused = Vec::new();
    for name in names() {
        let review = admin.review(&name).await?;
        totals.accepted_after_successor += review
            .iter()
            .filter(|r| r.accepted_after_successor.is_some())
            .count();
        // The tenure r4's first tenure of a join-moved name succeeded: its drain wrote past the release.
        if join_moved.contains(&name) {
            let handed = review.iter().find(|r| {
                r.tenure.holder != "r4" && r.successor.as_ref().is_some_and(|s| s.holder == "r4")
            });
            overrun_refused.push((
                name.clone(),
                handed.map_or(0, |r| {
                    r.refusals_after_successor
                        .iter()
                        .map(|x| x.count)
                        .sum::<i64>()
                }),
            ));
        }
        let steps = moved_in(&name);
        if steps.is_empty() {
            continue;
        }
        let tenures = review
            .into_iter()
            .map(|review| {
                let key = (name.clone(), review.tenure.epoch.get());
                let (accepted, refused) = writes.get(&key).copied().unwrap_or_default();
                TenureRow {
                    writes_accepted: accepted,
                    writes_refused: refused,
                    audited: audited.get(&key).copied().unwrap_or(0),
                    review,
                }
            })
            .collect();
        reviews.push(NameReview {
            name,
            moved_in: steps,
            tenures,
        });
    }
    let late = scalar(
        &admin,
        "SELECT count(*) AS n FROM pgfence.task_events e JOIN pgfence.tenures t \
           ON t.lease = e.lease AND t.epoch > e.epoch \
          WHERE split_part(e.lease, '/', 1) = $1 AND e.created_at >= t.acquired_at",
        &cluster,
    )
    .await?;
    checks.push(Check {
        invariant: "no write of an old epoch accepted after its successor's acquisition",
        held: totals.accepted_after_successor == 0 && late == 0,
        detail: format!(
            "{} accepted writes, {} tenures with one after their successor's acquisition (review), {late} old-epoch \
             task events after a newer acquisition",
            totals.accepted, totals.accepted_after_successor
        ),
    });
    checks.push(Check {
        invariant: "the overrunning drains were refused once r4 acquired",
        held: !overrun_refused.is_empty() && overrun_refused.iter().all(|(_, n)| *n > 0),
        detail: overrun_refused
            .iter()
            .map(|(name, n)| format!("{name}: {n} refused after r4's acquisition"))
            .collect::<Vec<_>>()
            .join(", "),
    });
    checks.push(Check {
        invariant: "every refused write is audited",
        held: audit_ok && totals.refused > 0,
        detail: if mismatches.is_empty() {
            format!(
                "{} refused (as the replicas reported), {} counted in pgfence.rejections",
                totals.refused, totals.audited
            )
        } else {
            mismatches.join("; ")
        },
    });

    let verdict = checks.iter().all(|c| c.held);
    let report = Report {
        scenario: "spread",
        cluster,
        group: qualified,
        names: NAMES,
        ttl_ms: ms(TTL),
        grace_ms: ms(GRACE),
        write_every_ms: ms(WRITE_EVERY),
        drain_ms: ms(DRAIN),
        steps,
        reviews,
        writes: totals,
        exits,
        checks,
        verdict,
    };
    if json {
        crate::output::print_json(&report)?;
    } else {
        crate::output::emit(&report_text(&report))?;
    }
    drop(fleet);
    drop(server);
    if verdict {
        Ok(())
    } else {
        Err(Failure::new(10, "verdict: an invariant was violated"))
    }
}

/// A time of day with milliseconds: every time of one run is within a minute of the others.
fn clock(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), |t| t.format("%H:%M:%S%.3f").to_string())
}

fn overlap(review: &TenureReview) -> &'static str {
    match review.overlap {
        Overlap::NoSuccessor => "- (no successor)",
        Overlap::None => "none",
        Overlap::Possible => "POSSIBLE",
        Overlap::Certain {
            refused_write_at: Some(_),
        } => "CERTAIN (refused write)",
        Overlap::Certain { .. } => "CERTAIN",
        Overlap::Unknown => "UNKNOWN (no end report)",
        _ => "see --json",
    }
}

fn report_text(report: &Report) -> String {
    let mut text = String::from("\nNames led per replica, by step (pgfence.group_members):\n");
    let rows: Vec<Vec<String>> = report
        .steps
        .iter()
        .map(|s| {
            vec![
                s.step.to_owned(),
                counts(&s.before),
                counts(&s.after),
                if s.moved.is_empty() {
                    "-".to_owned()
                } else {
                    s.moved.join(", ")
                },
                s.minimum_moves.map_or("-".to_owned(), |m| m.to_string()),
                s.handovers.to_string(),
                format!("{:.1}s", s.took_ms as f64 / 1000.0),
            ]
        })
        .collect();
    text.push_str(&table::render(
        &[
            "STEP",
            "BEFORE",
            "AFTER",
            "MOVED",
            "MINIMUM",
            "HANDOVERS",
            "TOOK",
        ],
        &rows,
    ));
    text.push_str(
        "\nOverlap review of the moved names (as `pgfence history --lease` shows it), UTC: the database's \
         record (database clock) beside what each holder reported believing (holder clock); writes of each \
         epoch as its holder reported them, refusals as the database audited them\n",
    );
    let mut rows = Vec::new();
    for name in &report.reviews {
        for t in &name.tenures {
            let r = &t.review;
            let b = &r.tenure.belief;
            rows.push(vec![
                format!("{} ({})", name.name, name.moved_in.join(", ")),
                r.tenure.epoch.to_string(),
                r.tenure.holder.clone(),
                clock(Some(r.tenure.acquired_at)),
                clock(r.tenure.ended_at),
                r.tenure
                    .end_reason
                    .clone()
                    .unwrap_or_else(|| "current".to_owned()),
                b.from
                    .map_or_else(|| "unknown".to_owned(), |t| clock(Some(t))),
                b.until
                    .map_or_else(|| "unknown".to_owned(), |t| clock(Some(t))),
                match (&b.end_cause, &b.end_detail) {
                    (Some(c), Some(d)) => format!("{c} ({d})"),
                    (Some(c), None) => c.clone(),
                    _ => "unknown".to_owned(),
                },
                overlap(r).to_owned(),
                t.writes_accepted.to_string(),
                t.writes_refused.to_string(),
                t.audited.to_string(),
                if r.accepted_after_successor.is_some() {
                    "FENCE BROKEN".to_owned()
                } else {
                    "0".to_owned()
                },
            ]);
        }
    }
    text.push_str(&table::render(
        &[
            "NAME",
            "EPOCH",
            "HOLDER",
            "DB FROM",
            "DB UNTIL",
            "DB END",
            "BELIEVED FROM",
            "BELIEVED UNTIL",
            "BELIEF END",
            "OVERLAP",
            "WRITES OK",
            "REFUSED",
            "AUDITED",
            "OK AFTER SUCCESSOR",
        ],
        &rows,
    ));
    let w = &report.writes;
    text.push_str(&format!(
        "\nWrites: {} accepted, {} refused as the replicas reported them, {} audited in pgfence.rejections; {} \
         of an old epoch accepted after its successor's acquisition\n\nVerdict:\n",
        w.accepted, w.refused, w.audited, w.accepted_after_successor
    ));
    text.push_str(&super::verdict(&report.checks, report.verdict));
    text
}
