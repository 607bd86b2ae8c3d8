//! One tenure racing itself, through SQL: a repeat of a ledger or task write sent on a second connection while
//! the first call is still in its open transaction (a controller retrying on a timeout), or two calls of the
//! same tenure on one attempt (two tasks of one leader settling and reporting at once). Each case is run twice
//! on leases of its own: once in sequence (the first call committed, then the second), once with the first
//! call's transaction held open until the second is seen waiting for it in the lock manager (`pg_locks`,
//! `pg_blocking_pids`), then committed. Both runs must give the second call the same answer — the one pinned
//! here — and leave the same history (the task row, every attempt, every event).
//!
//! Invariants checked (numbers as in the README's invariant map): 9 (the effect ledger: an attempt is settled at
//! most once and only while in doubt; a final outcome stands; a write decides on the attempt as the calls of its
//! tenure before it left it) and 5 (a task write's repeat answers from the task as the first call left it).

use crate::common;

use std::time::{Duration, Instant};

use common::TestDb;
use tokio::task::JoinHandle;

/// A ledger call through SQL ($1 lease, $2 epoch, $3 secret), answered as `(outcome,reason,attempt,state,created)`.
macro_rules! ledger {
    ($call:literal) => {
        concat!(
            "SELECT row(outcome, reason, attempt, state, created)::text FROM pgfence.",
            $call
        )
    };
}

/// A task write through SQL, answered as `(outcome,reason,task_state,version,created)`.
macro_rules! task_write {
    ($call:literal) => {
        concat!(
            "SELECT row(outcome, reason, task_state, version, created)::text FROM pgfence.",
            $call
        )
    };
}

const INTEND: &str = ledger!("record_intent($1, $2, $3, 'job', 'job/x', '{\"launch\": 1}')");
const DONE: &str = ledger!("record_outcome($1, $2, $3, 'job/x', 'done', '{\"w\": 1}')");
const FAILED: &str = ledger!("record_outcome($1, $2, $3, 'job/x', 'failed', '{\"status\": 500}')");
const UNKNOWN: &str = ledger!("record_outcome($1, $2, $3, 'job/x', 'unknown', '{}')");
const CONFIRM: &str =
    ledger!("settle_effect($1, $2, $3, 'job/x', 'confirmed', '{\"seen\": true}')");
const RETRY: &str = ledger!("settle_effect($1, $2, $3, 'job/x', 'retried', '{\"seen\": false}')");
const ABANDON: &str =
    ledger!("settle_effect($1, $2, $3, 'job/x', 'abandoned', '{\"reason\": \"key cancelled\"}')");
const CREATE: &str = task_write!("create_task($1, $2, $3, 'job', '{}')");
const CLAIM: &str = task_write!("claim_task($1, $2, $3, 'job', 'w-1')");
const RUN: &str = task_write!("transition_task($1, $2, $3, 'job', 'claimed', 'running', '{}')");
const APPEND: &str = task_write!("append_event($1, $2, $3, 'job', 'note', '{}')");

/// Two calls of one tenure: `setup` committed first, then `first`, then `second`, whose answer in sequence is
/// `answer`.
struct Case {
    name: &'static str,
    setup: &'static [&'static str],
    first: &'static str,
    second: &'static str,
    answer: &'static str,
}

/// The tenure's calls: (lease, epoch, secret).
#[derive(Clone)]
struct Tenure(String, i64, String);

async fn call(c: &tokio_postgres::Client, sql: &str, t: &Tenure) -> String {
    c.query_one(sql, &[&t.0, &t.1, &t.2])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .get(0)
}

/// The lease's history: its task rows, every attempt and every event (ids, times and `waited_ms` left out).
async fn history(c: &tokio_postgres::Client, lease: &str) -> String {
    c.query_one(
        "SELECT concat_ws(' | ',
           (SELECT string_agg(format('%s %s v%s', state, assignee, version), '; ' ORDER BY key)
              FROM pgfence.tasks WHERE lease = $1),
           (SELECT string_agg(format('#%s e%s %s %s %s %s %s', attempt, epoch, intent, outcome, outcome_detail,
                                     settlement, settle_detail), '; ' ORDER BY attempt)
              FROM pgfence.effects WHERE lease = $1),
           (SELECT string_agg(format('%s %s', kind, payload - 'waited_ms'), '; ' ORDER BY id)
              FROM pgfence.task_events WHERE lease = $1))",
        &[&lease],
    )
    .await
    .unwrap()
    .get(0)
}

/// Waits until backend `waiter` waits in the lock manager (an ungranted row of `pg_locks`) for backend `holder`
/// (`pg_blocking_pids`), polling for at most 20 s. Err when the second call answered without waiting, or
/// never waited for the first.
async fn blocked_by(
    watch: &tokio_postgres::Client,
    waiter: i32,
    holder: i32,
    second: &JoinHandle<String>,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let row = watch
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted), pg_blocking_pids($1)",
                &[&waiter],
            )
            .await
            .unwrap();
        let (waiting, blockers): (bool, Vec<i32>) = (row.get(0), row.get(1));
        if waiting && blockers.contains(&holder) {
            return Ok(());
        }
        if second.is_finished() {
            return Err(format!(
                "the second call (backend {waiter}) answered without waiting for the first (backend {holder}, \
                 its transaction open)"
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the second call (backend {waiter}) did not wait for the first (backend {holder}) within 20 s; \
                 waiting: {waiting}, blocked by {blockers:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Runs `case` on lease `lease` (a new one): in sequence, or with the first call held open until the second
/// waits for it. The second call's answer and the history; Err: the second call did not wait.
async fn run(
    db: &TestDb,
    lease: &str,
    case: &Case,
    held: bool,
) -> Result<(String, String), String> {
    let c = db.client().await;
    let (epoch, secret) = common::sql_acquire(&c, lease, "h", 600_000).await;
    let t = Tenure(lease.to_owned(), epoch, secret);
    for sql in case.setup {
        let answer = call(&c, sql, &t).await;
        assert!(
            answer.starts_with("(ok,"),
            "{}: setup {sql}: {answer}",
            case.name
        );
    }
    let first = db.client().await;
    let holder: i32 = first
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    first.batch_execute("BEGIN").await.unwrap();
    call(&first, case.first, &t).await;
    let answer = if held {
        let second = db.client().await;
        let waiter: i32 = second
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let (sql, t) = (case.second, t.clone());
        let racer = tokio::spawn(async move { call(&second, sql, &t).await });
        let waited = blocked_by(&c, waiter, holder, &racer).await;
        first.batch_execute("COMMIT").await.unwrap();
        let answer = racer.await.unwrap();
        waited.map_err(|e| format!("{e}; it answered {answer}"))?;
        answer
    } else {
        first.batch_execute("COMMIT").await.unwrap();
        call(&c, case.second, &t).await
    };
    Ok((answer, history(&c, lease).await))
}

/// Runs every case in sequence and raced; the cases whose second call answered otherwise than `answer`, or whose
/// raced run answered or wrote otherwise than the sequence (all of them, so one run shows every difference).
async fn differences(prefix: &str, cases: &[Case]) -> Vec<String> {
    let db = TestDb::new().await;
    let mut out = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (answer, seq) = run(&db, &format!("c/{prefix}{i}-seq"), case, false)
            .await
            .unwrap();
        if answer != case.answer {
            out.push(format!(
                "{}: in sequence the second call answered {answer}, not {}",
                case.name, case.answer
            ));
        }
        match run(&db, &format!("c/{prefix}{i}-held"), case, true).await {
            Err(e) => out.push(format!("{}: {e}", case.name)),
            Ok((raced, history)) if (raced.as_str(), &history) != (answer.as_str(), &seq) => out.push(format!(
                "{}: raced, the second call answered {raced} and left\n    {history}\n  in sequence {answer} and\n    {seq}",
                case.name
            )),
            Ok(_) => {}
        }
    }
    out
}

/// Invariant 9, the three races of issue #43 reproduced, each with the first call held open: a 'done' repeated
/// answers `ok, created = false` (not `conflict/outcome_recorded`); an 'unknown' repeated is written once (one
/// `effect_unknown` event); a settle racing its own tenure's final outcome answers `conflict/not_in_doubt` and
/// neither settles a done attempt nor opens a retry of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_self_races_of_the_ledger_answer_as_in_sequence() {
    let cases = [
        Case {
            name: "'done' repeated",
            setup: &[CREATE, INTEND],
            first: DONE,
            second: DONE,
            answer: "(ok,,1,done,f)",
        },
        Case {
            name: "'unknown' repeated",
            setup: &[CREATE, INTEND],
            first: UNKNOWN,
            second: UNKNOWN,
            answer: "(ok,,1,unknown,f)",
        },
        Case {
            name: "a settle racing its tenure's final outcome",
            setup: &[CREATE, INTEND, UNKNOWN],
            first: DONE,
            second: RETRY,
            answer: "(conflict,not_in_doubt,1,done,f)",
        },
    ];
    let found = differences("three", &cases).await;
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Invariant 9, every other pair of (intent, outcome, settle) of one tenure on one attempt: the second call,
/// waiting for the first's transaction, answers and writes what it would after it — a second settle after a
/// 'retried' finds the retry in flight; an outcome after a 'retried' is the retry's; an intent after 'failed'
/// or 'abandoned' is the next attempt; a settle of the 'unknown' just reported settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pair_of_ledger_writes_on_one_attempt_answers_as_in_sequence() {
    let unknown: &[&str] = &[CREATE, INTEND, UNKNOWN];
    let cases = [
        Case {
            name: "'done' after 'unknown', repeated",
            setup: unknown,
            first: DONE,
            second: DONE,
            answer: "(ok,,1,done,f)",
        },
        Case {
            name: "'retried' repeated",
            setup: unknown,
            first: RETRY,
            second: RETRY,
            answer: "(conflict,in_flight,2,open,f)",
        },
        Case {
            name: "'confirmed' repeated",
            setup: unknown,
            first: CONFIRM,
            second: CONFIRM,
            answer: "(conflict,settled,1,confirmed,f)",
        },
        Case {
            name: "'done' after 'retried'",
            setup: unknown,
            first: RETRY,
            second: DONE,
            answer: "(ok,,2,done,t)",
        },
        Case {
            name: "'done' after 'confirmed'",
            setup: unknown,
            first: CONFIRM,
            second: DONE,
            answer: "(conflict,settled,1,confirmed,f)",
        },
        Case {
            name: "'confirmed' after 'unknown'",
            setup: &[CREATE, INTEND],
            first: UNKNOWN,
            second: CONFIRM,
            answer: "(ok,,1,confirmed,t)",
        },
        Case {
            name: "'confirmed' after 'failed'",
            setup: &[CREATE, INTEND],
            first: FAILED,
            second: CONFIRM,
            answer: "(conflict,not_in_doubt,1,failed,f)",
        },
        Case {
            name: "intent repeated",
            setup: &[CREATE],
            first: INTEND,
            second: INTEND,
            answer: "(ok,,1,open,f)",
        },
        Case {
            name: "intent after 'failed'",
            setup: &[CREATE, INTEND],
            first: FAILED,
            second: INTEND,
            answer: "(ok,,2,open,t)",
        },
        Case {
            name: "intent after 'abandoned'",
            setup: unknown,
            first: ABANDON,
            second: INTEND,
            answer: "(ok,,2,open,t)",
        },
        Case {
            name: "intent after 'unknown'",
            setup: &[CREATE, INTEND],
            first: UNKNOWN,
            second: INTEND,
            answer: "(in_doubt,job/x,1,unknown,f)",
        },
        Case {
            name: "intent after 'done'",
            setup: &[CREATE, INTEND],
            first: DONE,
            second: INTEND,
            answer: "(conflict,done,1,done,f)",
        },
    ];
    let found = differences("pair", &cases).await;
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Invariant 5 (and 9 for the task that follows its effects): a task write of one tenure racing itself answers
/// as in sequence — create repeated: the task, `created = false`; claim or transition repeated: `conflict`
/// naming the state the first left; an event appended twice: two events; a claim racing the tenure's 'unknown'
/// outcome: `in_doubt`, the task not moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_write_racing_itself_answers_as_in_sequence() {
    let cases = [
        Case {
            name: "create repeated",
            setup: &[],
            first: CREATE,
            second: CREATE,
            answer: "(ok,,pending,1,f)",
        },
        Case {
            name: "claim repeated",
            setup: &[CREATE],
            first: CLAIM,
            second: CLAIM,
            answer: "(conflict,claimed,claimed,2,f)",
        },
        Case {
            name: "transition repeated",
            setup: &[CREATE, CLAIM],
            first: RUN,
            second: RUN,
            answer: "(conflict,running,running,3,f)",
        },
        Case {
            name: "event appended twice",
            setup: &[CREATE],
            first: APPEND,
            second: APPEND,
            answer: "(ok,,pending,1,f)",
        },
        Case {
            name: "claim after 'unknown'",
            setup: &[CREATE, INTEND],
            first: UNKNOWN,
            second: CLAIM,
            answer: "(in_doubt,job/x,,,)",
        },
        Case {
            name: "transition after 'unknown'",
            setup: &[CREATE, CLAIM, INTEND],
            first: UNKNOWN,
            second: RUN,
            answer: "(in_doubt,job/x,,,)",
        },
    ];
    let found = differences("task", &cases).await;
    assert!(found.is_empty(), "{}", found.join("\n"));
}
