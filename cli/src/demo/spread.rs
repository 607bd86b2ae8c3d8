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

mod account;
mod events;
mod fleet;
mod group;
mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use pgfence::embedded::EmbeddedServer;

use self::events::{believed, drain_writes, drained, handovers};
use self::fleet::{tell_crash, Fleet};
use self::group::{converge, epochs, live_leads, moved};
use self::report::{counts, listing, report_text, Report, Step};
use super::{Check, Narrator};
use crate::{CliResult, Failure, Global};

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

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn names() -> Vec<String> {
    (0..NAMES).map(|i| format!("controller-{i:02}")).collect()
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
            admin.admin().target()
        ),
    );
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            1,
            format!("cannot find this program to start replicas: {e}"),
        )
    })?;
    let flags = super::child_flags(global, &cluster);
    // Declared after `server`: dropped first, so the replicas are gone before the server is removed.
    let mut fleet = Fleet::new(exe, url.clone(), flags);
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
    let (reviews, totals) = account::check(
        &admin,
        &cluster,
        &events,
        &victim,
        &join_moved,
        &kill_moved,
        &mut checks,
    )
    .await?;

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
