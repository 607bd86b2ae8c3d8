//! The closing account of a rescue run, read back from the database and the engine (never from what the workers
//! believed): no effect applied twice beyond what its key dedupes, no intent lost, no attempt settled twice, no
//! ledger write of a tenure committed after its successor's acquisition, every late outcome kept — and how long
//! each effect was in doubt.

use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Client;

use crate::rescue::engine::Applied;

/// One invariant and whether it held.
#[derive(Debug, Serialize)]
pub(super) struct Check {
    pub(super) invariant: &'static str,
    pub(super) held: bool,
    pub(super) detail: String,
}

/// What the ledger and the engine say at the end.
#[derive(Debug, Default, Serialize)]
pub(super) struct Account {
    pub(super) tasks: i64,
    pub(super) succeeded: i64,
    pub(super) handovers: i64,
    pub(super) intents: i64,
    pub(super) confirmed: i64,
    pub(super) retried: i64,
    pub(super) late_reports: i64,
    /// Deliveries the engine absorbed by key (a second request of a key already applied).
    pub(super) deduplicated: i64,
    /// How long each settled effect had been in doubt (ms, database clock): median, p99, max.
    pub(super) in_doubt_ms: Option<[i64; 3]>,
}

async fn count(db: &Client, sql: &str, leases: &[String]) -> Result<i64, String> {
    db.query_one(sql, &[&leases])
        .await
        .map(|row| row.get::<_, i64>(0))
        .map_err(|e| format!("cannot read the ledger: {e}"))
}

/// The account of the leases `leases` (cluster-qualified), and the checks.
pub(super) async fn judge(
    db: &Client,
    leases: &[String],
    applied: &[Applied],
    refused_outcomes: &[(String, String, i64)],
) -> Result<(Account, Vec<Check>), String> {
    let mut account = Account {
        tasks: count(db, "SELECT count(*) FROM pgfence.tasks WHERE lease = ANY($1)", leases).await?,
        succeeded: count(
            db,
            "SELECT count(*) FROM pgfence.tasks WHERE lease = ANY($1) AND state = 'succeeded'",
            leases,
        )
        .await?,
        handovers: count(
            db,
            "SELECT coalesce(sum(greatest(epoch - 1, 0)), 0)::bigint FROM pgfence.leases WHERE name = ANY($1)",
            leases,
        )
        .await?,
        intents: count(db, "SELECT count(*) FROM pgfence.effects WHERE lease = ANY($1)", leases).await?,
        confirmed: count(
            db,
            "SELECT count(*) FROM pgfence.effects WHERE lease = ANY($1) AND settlement = 'confirmed'",
            leases,
        )
        .await?,
        retried: count(
            db,
            "SELECT count(*) FROM pgfence.effects WHERE lease = ANY($1) AND settlement = 'retried'",
            leases,
        )
        .await?,
        late_reports: count(
            db,
            "SELECT count(*) FROM pgfence.effect_reports WHERE lease = ANY($1)",
            leases,
        )
        .await?,
        deduplicated: applied.iter().map(|a| i64::from(a.deliveries - 1)).sum(),
        in_doubt_ms: None,
    };
    let waits: Vec<i64> = db
        .query(
            "SELECT (e.payload ->> 'waited_ms')::bigint FROM pgfence.task_events e \
              WHERE e.lease = ANY($1) AND e.kind IN ('effect_confirmed', 'effect_retried', 'effect_abandoned') \
                AND e.payload ->> 'waited_ms' IS NOT NULL ORDER BY 1",
            &[&leases],
        )
        .await
        .map_err(|e| format!("cannot read the ledger: {e}"))?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    if !waits.is_empty() {
        let at = |q: f64| waits[((waits.len() - 1) as f64 * q).round() as usize];
        account.in_doubt_ms = Some([at(0.5), at(0.99), waits[waits.len() - 1]]);
    }
    let mut checks = Vec::new();

    // The engine's ground truth: one key per task, for every task whose work is done.
    let mut keys_per_task: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for a in applied {
        keys_per_task.entry(&a.task).or_default().push(&a.key);
    }
    let twice: Vec<String> = keys_per_task
        .iter()
        .filter(|(_, keys)| keys.len() > 1)
        .map(|(task, keys)| format!("{task}: {}", keys.join(", ")))
        .collect();
    checks.push(Check {
        invariant: "no effect ran twice: the engine applied each task's effect under one key (repeats of a key \
                    deduplicated)",
        held: twice.is_empty(),
        detail: if twice.is_empty() {
            format!(
                "{} tasks applied, {} repeated deliveries absorbed by their key",
                keys_per_task.len(),
                account.deduplicated
            )
        } else {
            format!("applied under several keys: {}", twice.join("; "))
        },
    });

    let unfinished: Vec<String> = db
        .query(
            "SELECT t.key FROM pgfence.tasks t WHERE t.lease = ANY($1) AND t.state <> 'succeeded' ORDER BY 1",
            &[&leases],
        )
        .await
        .map_err(|e| format!("cannot read the tasks: {e}"))?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    let succeeded_tasks: Vec<String> = db
        .query(
            "SELECT split_part(t.lease, '/', 2) || ':' || t.key FROM pgfence.tasks t \
              WHERE t.lease = ANY($1) AND t.state = 'succeeded'",
            &[&leases],
        )
        .await
        .map_err(|e| format!("cannot read the tasks: {e}"))?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    let not_applied: Vec<&String> = succeeded_tasks
        .iter()
        .filter(|t| !keys_per_task.contains_key(t.as_str()))
        .collect();
    checks.push(Check {
        invariant: "no work lost: every task is done, and the engine applied the effect of every done task",
        held: unfinished.is_empty() && not_applied.is_empty(),
        detail: format!(
            "{} of {} tasks done; unfinished: {:?}; done without the engine's effect: {:?}",
            account.succeeded, account.tasks, unfinished, not_applied
        ),
    });

    let lost: Vec<String> = db
        .query(
            "SELECT e.effect_key || ' attempt ' || e.attempt FROM pgfence.effects e \
              WHERE e.lease = ANY($1) AND e.settlement IS NULL AND e.outcome IS DISTINCT FROM 'done' \
              ORDER BY 1",
            &[&leases],
        )
        .await
        .map_err(|e| format!("cannot read the ledger: {e}"))?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    checks.push(Check {
        invariant: "no intent lost: every attempt ended done, or was settled by a later tenure",
        held: lost.is_empty(),
        detail: if lost.is_empty() {
            format!(
                "{} intents: {} confirmed, {} retried under their key, the rest done",
                account.intents, account.confirmed, account.retried
            )
        } else {
            format!("left open: {lost:?}")
        },
    });

    let settled_twice = count(
        db,
        "SELECT count(*) FROM (SELECT e.lease, e.payload ->> 'effect_key', e.payload ->> 'attempt' \
                                 FROM pgfence.task_events e \
                                WHERE e.lease = ANY($1) \
                                  AND e.kind IN ('effect_confirmed', 'effect_retried', 'effect_abandoned') \
                                GROUP BY 1, 2, 3 HAVING count(*) > 1) twice",
        leases,
    )
    .await?;
    checks.push(Check {
        invariant: "no attempt settled twice",
        held: settled_twice == 0,
        detail: format!(
            "{settled_twice} attempts with more than one settle in their task's history"
        ),
    });

    // A ledger write of tenure e holds the guard lock until it commits, and the next acquisition takes the
    // guard lock exclusively before it reads the clock for acquired_at: so every accepted write of e was made
    // before any later tenure's acquired_at (one server's clock).
    let stale: Vec<String> = db
        .query(
            "SELECT ev.kind || ' of ' || (ev.payload ->> 'effect_key') || ' by epoch ' || ev.epoch \
                    || ' after epoch ' || t.epoch || ' began' \
               FROM pgfence.task_events ev \
               JOIN pgfence.tenures t ON t.lease = ev.lease AND t.epoch > ev.epoch \
              WHERE ev.lease = ANY($1) AND ev.kind LIKE 'effect\\_%' AND ev.created_at >= t.acquired_at \
              ORDER BY ev.id LIMIT 10",
            &[&leases],
        )
        .await
        .map_err(|e| format!("cannot read the ledger: {e}"))?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    checks.push(Check {
        invariant: "no ledger write of an ended tenure committed (intent, outcome or settle after a successor's \
                    acquisition)",
        held: stale.is_empty(),
        detail: if stale.is_empty() {
            "every intent, outcome and settle was written before the next tenure began".to_owned()
        } else {
            format!("stale writes committed: {stale:?}")
        },
    });

    let mut missing = Vec::new();
    for (lease, key, epoch) in refused_outcomes {
        let kept = db
            .query_one(
                "SELECT count(*) FROM pgfence.effect_reports r JOIN pgfence.effects e ON e.id = r.effect_id \
                  WHERE e.lease = $1 AND e.effect_key = $2 AND r.epoch = $3",
                &[lease, key, epoch],
            )
            .await
            .map_err(|e| format!("cannot read the late reports: {e}"))?
            .get::<_, i64>(0);
        if kept == 0 {
            missing.push(format!("{key} by epoch {epoch}"));
        }
    }
    checks.push(Check {
        invariant: "every late outcome of an ended tenure was refused and kept as a late report",
        held: missing.is_empty(),
        detail: format!(
            "{} refused outcomes, {} late reports kept{}",
            refused_outcomes.len(),
            account.late_reports,
            if missing.is_empty() {
                String::new()
            } else {
                format!("; not kept: {missing:?}")
            }
        ),
    });
    Ok((account, checks))
}

/// The refused `record_outcome`s the workers reported (lease, effect key, epoch), from their event lines.
pub(super) fn refused_outcomes(
    log: &[Value],
    lease_of: impl Fn(&str) -> Option<String>,
) -> Vec<(String, String, i64)> {
    log.iter()
        .filter(|e| e["event"] == "refused" && e["op"] == "record_outcome")
        .filter(|e| e["reason"] != "no_grant" && e["reason"] != "bad_secret")
        .filter_map(|e| {
            Some((
                lease_of(e["member"].as_str()?)?,
                e["key"].as_str()?.to_owned(),
                e["epoch"].as_i64()?,
            ))
        })
        .collect()
}
