//! The fault run of the rescue story (`--handovers N`): several leases at once, two workers each, and faults
//! thrown at whichever worker leads until N handovers happened — `kill -9` (a replacement starts), a freeze
//! (SIGSTOP) past the ttl and a thaw once the successor took over (the frozen leader's late outcome, intent or
//! settle is refused), its connections dropped (`pg_terminate_backend`); inside the workers, engine replies lost
//! after the engine applied, and requests delivered late. Then every lease gets a last worker that settles what is
//! in doubt and finishes every task; the verdict judges all of it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::workers::{Spec, Workers};
use super::{Narrator, STEP};
use crate::rescue::engine;
use crate::Failure;

/// How many leases take faults at once.
const LEASES: usize = 4;
/// Their ttl: short, so that a killed or frozen leader is replaced quickly.
const TTL: Duration = Duration::from_millis(400);
/// The longest a fault waits for the lease to change hands before it counts as one that caused no handover.
const HANDOVER_WAIT: Duration = Duration::from_secs(5);

/// What the fault run did.
#[derive(Debug, Default, Serialize)]
pub(in crate::demo) struct Summary {
    /// The leases it ran on (cluster-qualified).
    pub(in crate::demo) leases: Vec<String>,
    pub(in crate::demo) handovers: i64,
    pub(in crate::demo) kills: u32,
    pub(in crate::demo) freezes: u32,
    pub(in crate::demo) dropped_connections: u32,
    /// Faults after which the lease stayed with its leader (a dropped connection it survived).
    pub(in crate::demo) without_handover: u32,
    pub(in crate::demo) seconds: f64,
}

#[derive(Clone, Copy)]
enum Fault {
    Kill,
    Freeze,
    Drop,
}

/// A lease's state in the run.
struct Lease {
    name: String,
    /// Its workers that run (members).
    members: Vec<String>,
    next: u32,
    /// Waiting for a handover after a fault: the epoch before it, since when, and the member frozen by it.
    waiting: Option<(i64, Instant, Option<String>)>,
    /// No fault before this instant (work happens between faults).
    quiet_until: Instant,
}

fn spec() -> Spec {
    Spec {
        tasks: 100_000,
        ttl: TTL,
        lose_reply: 10,
        late: 10,
        ..Spec::default()
    }
}

impl Lease {
    fn spawn(&mut self, w: &mut Workers) -> Result<(), Failure> {
        let member = format!("{}-w{}", self.name, self.next);
        self.next += 1;
        w.spawn(&self.name, &member, &spec())?;
        self.members.push(member);
        Ok(())
    }
}

pub(super) async fn run(
    story: &Narrator,
    w: &mut Workers,
    url: &str,
    cluster: &str,
    target: u32,
) -> Result<Summary, Failure> {
    let started = Instant::now();
    let db = engine::client(url).await.map_err(|e| Failure::new(1, e))?;
    let mut leases: Vec<Lease> = (0..LEASES)
        .map(|i| Lease {
            name: format!("chaos-{i}"),
            members: Vec::new(),
            next: 0,
            waiting: None,
            quiet_until: Instant::now(),
        })
        .collect();
    for lease in &mut leases {
        lease.spawn(w)?;
        lease.spawn(w)?;
    }
    let qualified: Vec<String> = leases
        .iter()
        .map(|l| format!("{cluster}/{}", l.name))
        .collect();
    story.say(
        "chaos",
        format!(
            "{LEASES} leases, two workers each, ttl {TTL:?}; faults until {target} handovers: kill -9, a freeze past \
             the ttl, connections dropped; engine replies lost and requests delivered late"
        ),
    );
    let mut summary = Summary {
        leases: qualified.clone(),
        ..Summary::default()
    };
    let mut reported = 0;
    loop {
        w.drain();
        let rows = db
            .query(
                "SELECT split_part(name, '/', 2), holder, epoch, \
                        state = 'held' AND expires_at > clock_timestamp() \
                   FROM pgfence.leases WHERE name = ANY($1)",
                &[&qualified],
            )
            .await
            .map_err(|e| Failure::new(1, format!("cannot read the leases: {e}")))?;
        let state: BTreeMap<String, (Option<String>, i64, bool)> = rows
            .into_iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
            .collect();
        summary.handovers = state.values().map(|(_, epoch, _)| (epoch - 1).max(0)).sum();
        if summary.handovers >= i64::from(target) {
            break;
        }
        if summary.handovers / 100 > reported {
            reported = summary.handovers / 100;
            story.say("chaos", format!("{} handovers", summary.handovers));
        }
        if started.elapsed() > STEP * 20 {
            return Err(Failure::new(
                1,
                format!(
                    "rescue: the fault run made {} of {target} handovers in {:?}",
                    summary.handovers,
                    STEP * 20
                ),
            ));
        }
        for lease in &mut leases {
            let (holder, epoch, live) = state.get(&lease.name).cloned().unwrap_or((None, 0, false));
            if let Some((before, since, frozen)) = lease.waiting.clone() {
                let moved = epoch > before && live;
                if moved || since.elapsed() > HANDOVER_WAIT {
                    if let Some(member) = frozen {
                        w.signal(&member, "CONT").await?;
                    }
                    if !moved {
                        summary.without_handover += 1;
                    }
                    lease.waiting = None;
                    lease.quiet_until =
                        Instant::now() + Duration::from_millis(fastrand::u64(0..300));
                }
                continue;
            }
            let running = w.running();
            lease.members.retain(|m| running.contains(m));
            while lease.members.len() < 2 {
                lease.spawn(w)?;
            }
            let Some(leader) = holder.filter(|h| live && lease.members.contains(h)) else {
                continue;
            };
            if Instant::now() < lease.quiet_until {
                continue;
            }
            let fault = match fastrand::u8(0..10) {
                0..=3 => Fault::Kill,
                4..=7 => Fault::Freeze,
                _ => Fault::Drop,
            };
            let frozen = match fault {
                Fault::Kill => {
                    summary.kills += 1;
                    w.kill(&leader).await;
                    lease.members.retain(|m| *m != leader);
                    lease.spawn(w)?;
                    None
                }
                Fault::Freeze => {
                    summary.freezes += 1;
                    w.signal(&leader, "STOP").await?;
                    Some(leader)
                }
                Fault::Drop => {
                    summary.dropped_connections += 1;
                    db.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                        &[&leader],
                    )
                    .await
                    .map_err(|e| Failure::new(1, format!("cannot drop connections: {e}")))?;
                    None
                }
            };
            lease.waiting = Some((epoch, Instant::now(), frozen));
        }
        // The faults' clock: a tick between looks at the leases (nothing waits on it for correctness).
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Thaw whoever is frozen, stop every worker the hard way, and let a last worker per lease finish the work.
    for lease in &leases {
        if let Some((_, _, Some(member))) = &lease.waiting {
            w.signal(member, "CONT").await?;
        }
        for member in &lease.members {
            w.kill(member).await;
        }
    }
    story.say(
        "chaos",
        format!(
            "{} handovers ({} kills, {} freezes, {} dropped connections); a last worker per lease settles what is in \
             doubt and finishes every task",
            summary.handovers, summary.kills, summary.freezes, summary.dropped_connections
        ),
    );
    for lease in &leases {
        let spec = Spec {
            until_done: true,
            tasks: 100_000,
            ttl: TTL,
            ..Spec::default()
        };
        w.spawn(&lease.name, &format!("{}-last", lease.name), &spec)?;
    }
    for lease in &leases {
        let member = format!("{}-last", lease.name);
        w.seen_or_wait(&format!("{member} finishes"), STEP, |e| {
            e["event"] == "exit" && e["member"] == member.as_str()
        })
        .await?;
    }
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}
