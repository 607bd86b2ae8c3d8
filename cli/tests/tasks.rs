//! `pgfence tasks` and the effect lines of `pgfence history`, run as a user would run them against real
//! PostgreSQL: the effects in doubt that an ended tenure left (text and `--json`), one task's ledger, the
//! effects beside the tenures, hostile stored values escaped, and bad input refused with the documented exit
//! codes.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::TestDb;
use pgfence::effects::{Attempt, EffectState, InDoubt, Outcome, Settlement};
use serde_json::json;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the built binary with `args` on `url` (the caller's own DATABASE_URL and PGFENCE_CLUSTER never leak in).
async fn pgfence(args: &[&str], url: &str) -> Run {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .args(args)
        .env_remove("PGFENCE_CLUSTER")
        .env("DATABASE_URL", url)
        .output()
        .await
        .expect("run pgfence");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A hostile effect key: a bidirectional override and a backslash (the API refuses control characters in keys,
/// not these).
const HOSTILE_KEY: &str = "deploy\u{202e}kcah\\u{1b}";
/// A hostile intent: a terminal title sequence, a CSI in C1 form and a line separator, inside JSON strings.
fn hostile_intent() -> serde_json::Value {
    json!({"launch": "\u{1b}]0;pwned\u{7}", "args": "\u{9b}2J\u{2028}x"})
}

/// On `prod/scheduler`, epoch 1 (pod-a) intends `launch` (done) and `notify` (no outcome) for job-1 and the
/// hostile key for job-2 (outcome `unknown`), and is cut off; its late `done` for the hostile key is refused and
/// kept as a late report. Epoch 2 (pod-b) retries `notify` (attempt 2, done) and leaves the hostile key in
/// doubt. `prod/other` has one effect in doubt (`page`), its lease released and not taken again.
async fn ledger_scenario(db: &TestDb) {
    let store = db.store("prod").await;
    let ttl = Duration::from_secs(60);
    let effects = store.effects();
    let old = store.acquire("scheduler", "pod-a", ttl).await.unwrap();
    for task in ["job-1", "job-2"] {
        store
            .tasks()
            .create(&old.fence(), task, &json!({}))
            .await
            .unwrap();
    }
    let intent = json!({"launch": "api:1.7"});
    effects
        .intend(&old.fence(), "job-1", "launch", &intent)
        .await
        .unwrap();
    let done = Outcome::Done(json!({"workload": "w-1"}));
    effects
        .record_outcome(&old.fence(), "launch", &done)
        .await
        .unwrap();
    let notify = json!({"notify": "ops"});
    effects
        .intend(&old.fence(), "job-1", "notify", &notify)
        .await
        .unwrap();
    effects
        .intend(&old.fence(), "job-2", HOSTILE_KEY, &hostile_intent())
        .await
        .unwrap();
    let unknown = Outcome::Unknown(json!({"timeout": "5s"}));
    effects
        .record_outcome(&old.fence(), HOSTILE_KEY, &unknown)
        .await
        .unwrap();
    store.admin().force_release("scheduler").await.unwrap();
    let late = effects
        .record_outcome(&old.fence(), HOSTILE_KEY, &done)
        .await;
    assert!(
        matches!(late, Err(pgfence::Error::Stale { .. })),
        "{late:?}"
    );

    let new = store.acquire("scheduler", "pod-b", ttl).await.unwrap();
    let retry = Settlement::Retry {
        observed: json!({"engine": "no record of notify"}),
    };
    effects
        .settle(&new.fence(), "notify", &retry)
        .await
        .unwrap();
    effects
        .record_outcome(&new.fence(), "notify", &done)
        .await
        .unwrap();

    let other = store.acquire("other", "pod-c", ttl).await.unwrap();
    store
        .tasks()
        .create(&other.fence(), "job-9", &json!({}))
        .await
        .unwrap();
    let page = json!({"page": "on-call"});
    effects
        .intend(&other.fence(), "job-9", "page", &page)
        .await
        .unwrap();
    store.admin().force_release("other").await.unwrap();
}

/// `tasks --in-doubt --json` lists exactly the effects in doubt — an ended tenure's intent without an outcome
/// and an `unknown` outcome, never a done, settled or in-flight attempt — with the ended tenure (holder, how it
/// ended) and the late report its old leader sent; without --lease, every lease of every cluster the role reads,
/// by lease; with --lease (qualified, or bare in --cluster) only that lease's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_in_doubt_lists_what_ended_tenures_left_with_their_late_reports() {
    let db = TestDb::new().await;
    ledger_scenario(&db).await;

    let all = pgfence(&["tasks", "--in-doubt", "--json"], &db.url).await;
    assert_eq!(all.code, 0, "{}", all.stderr);
    let rows: Vec<InDoubt> = serde_json::from_str(&all.stdout).unwrap();
    let listed: Vec<(&str, &str, u32, EffectState)> = rows
        .iter()
        .map(|d| {
            (
                d.effect.lease.as_str(),
                d.effect.key.as_str(),
                d.effect.attempt,
                d.effect.state,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("prod/other", "page", 1, EffectState::Open),
            ("prod/scheduler", HOSTILE_KEY, 1, EffectState::Unknown),
        ]
    );
    let hostile = &rows[1];
    assert_eq!(hostile.effect.intent, hostile_intent());
    assert_eq!(hostile.effect.task_key, "job-2");
    assert_eq!(hostile.tenure.holder.as_deref(), Some("pod-a"));
    assert_eq!(hostile.tenure.end_reason.as_deref(), Some("forced"));
    let late = hostile
        .late_report
        .as_ref()
        .expect("the late outcome is kept");
    assert_eq!((late.state, late.count), (EffectState::Done, 1));
    assert_eq!(late.detail, json!({"workload": "w-1"}));
    assert!(rows[0].late_report.is_none());

    let one = pgfence(
        &["tasks", "--in-doubt", "--lease", "prod/other", "--json"],
        &db.url,
    )
    .await;
    assert_eq!(one.code, 0, "{}", one.stderr);
    let rows: Vec<InDoubt> = serde_json::from_str(&one.stdout).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].effect.key, "page");
    let bare = pgfence(
        &[
            "tasks",
            "--in-doubt",
            "--cluster",
            "prod",
            "--lease",
            "other",
            "--json",
        ],
        &db.url,
    )
    .await;
    assert_eq!(bare.stdout, one.stdout);

    let text = pgfence(&["tasks", "--in-doubt", "--lease", "prod/other"], &db.url).await;
    assert_eq!(text.code, 0, "{}", text.stderr);
    for expected in [
        "LEASE",
        "EFFECT KEY",
        "HOLDER",
        "ENDED (UTC)",
        "LAST WRITE (UTC)",
        "LATE REPORT",
        "INTENT",
        "prod/other",
        "job-9",
        "page",
        "pod-c",
        "forced 20",
        r#"{"page":"on-call"}"#,
    ] {
        assert!(
            text.stdout.contains(expected),
            "missing {expected:?} in\n{}",
            text.stdout
        );
    }
    // Nothing in doubt: the table says so.
    let store = db.store("prod").await;
    store
        .acquire("idle", "pod-d", Duration::from_secs(60))
        .await
        .unwrap();
    let none = pgfence(&["tasks", "--in-doubt", "--lease", "prod/idle"], &db.url).await;
    assert_eq!(none.code, 0, "{}", none.stderr);
    assert!(none.stdout.ends_with("(none)\n"), "{}", none.stdout);
}

/// Hostile stored values (a bidirectional override and a backslash in an effect key, ESC, BEL, a C1 CSI and a
/// line separator in an intent) never reach the terminal raw: the table shows them escaped, the intent cut at
/// its bound and marked; `--json` escapes them as `\uXXXX`, which parse back to the exact stored values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_escapes_hostile_keys_and_intents() {
    let db = TestDb::new().await;
    ledger_scenario(&db).await;
    let is_control = |c: char| {
        c != '\n'
            && (c.is_control()
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}'))
    };
    let text = pgfence(
        &["tasks", "--in-doubt", "--lease", "prod/scheduler"],
        &db.url,
    )
    .await;
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert!(!text.stdout.chars().any(is_control), "{}", text.stdout);
    assert!(
        text.stdout.contains("deploy\\u{202e}kcah\\\\u{1b}"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("\\u{9b}2J\\u{2028}x"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("done ×1"), "{}", text.stdout);
    let json = pgfence(&["tasks", "--in-doubt", "--json"], &db.url).await;
    assert!(!json.stdout.chars().any(is_control), "{}", json.stdout);
    let rows: Vec<InDoubt> = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(rows[1].effect.key, HOSTILE_KEY);

    let ledger = pgfence(
        &["tasks", "--lease", "prod/scheduler", "--task", "job-2"],
        &db.url,
    )
    .await;
    assert_eq!(ledger.code, 0, "{}", ledger.stderr);
    assert!(!ledger.stdout.chars().any(is_control), "{}", ledger.stdout);
    assert!(ledger.stdout.contains("IN DOUBT"), "{}", ledger.stdout);
}

/// `tasks --lease L --task K` lists every attempt of the task's effects, settled or not (`--json`: the
/// attempts, each with its outcome, settlement and settling epoch); an unknown task lists none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_task_lists_every_attempt_of_a_tasks_effects() {
    let db = TestDb::new().await;
    ledger_scenario(&db).await;
    let run = pgfence(
        &[
            "tasks",
            "--lease",
            "prod/scheduler",
            "--task",
            "job-1",
            "--json",
        ],
        &db.url,
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let attempts: Vec<Attempt> = serde_json::from_str(&run.stdout).unwrap();
    type Seen<'a> = (&'a str, u32, i64, EffectState, Option<i64>, bool);
    let seen: Vec<Seen> = attempts
        .iter()
        .map(|a| {
            let e = &a.effect;
            (
                e.key.as_str(),
                e.attempt,
                e.epoch.get(),
                e.state,
                e.settled_by.map(|b| b.get()),
                a.in_doubt,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("launch", 1, 1, EffectState::Done, None, false),
            ("notify", 1, 1, EffectState::Retried, Some(2), false),
            ("notify", 2, 2, EffectState::Done, None, false),
        ]
    );
    assert_eq!(attempts[1].outcome, None);
    assert_eq!(attempts[1].settlement, Some(EffectState::Retried));
    let text = pgfence(
        &["tasks", "--lease", "prod/scheduler", "--task", "job-1"],
        &db.url,
    )
    .await;
    assert!(
        text.stdout.contains("retried by epoch 2"),
        "{}",
        text.stdout
    );
    let unknown = pgfence(
        &[
            "tasks",
            "--lease",
            "prod/scheduler",
            "--task",
            "nope",
            "--json",
        ],
        &db.url,
    )
    .await;
    assert_eq!(unknown.code, 0, "{}", unknown.stderr);
    assert_eq!(
        serde_json::from_str::<Vec<Attempt>>(&unknown.stdout).unwrap(),
        []
    );
}

/// Bad input gets the CLI's documented exit codes and a one-line message, and nothing is read: neither
/// --in-doubt nor --task, or --task without --lease (usage, 2); a malformed lease name or task key (bad
/// input, 2); an unknown lease (6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_bad_input_exits_with_the_documented_codes() {
    let db = TestDb::new().await;
    ledger_scenario(&db).await;
    for args in [
        &["tasks"][..],
        &["tasks", "--lease", "prod/scheduler"],
        &["tasks", "--task", "job-1"],
        &[
            "tasks",
            "--in-doubt",
            "--task",
            "job-1",
            "--lease",
            "prod/scheduler",
        ],
    ] {
        let run = pgfence(args, &db.url).await;
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
    }
    let long = format!("prod/{}", "n".repeat(1000));
    for args in [
        vec!["tasks", "--in-doubt", "--lease", "prod/bad\u{7}name"],
        vec!["tasks", "--in-doubt", "--lease", long.as_str()],
        vec![
            "tasks",
            "--lease",
            "prod/scheduler",
            "--task",
            "job\u{1b}[2J",
        ],
        vec!["tasks", "--in-doubt", "--lease", "bad cluster\u{7}/x"],
    ] {
        let run = pgfence(&args, &db.url).await;
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.starts_with("pgfence: "), "{}", run.stderr);
        assert_eq!(run.stderr.trim_end().lines().count(), 1, "{}", run.stderr);
        assert!(
            !run.stderr.contains('\u{1b}') && !run.stderr.contains('\u{7}'),
            "{}",
            run.stderr
        );
    }
    let unknown = pgfence(&["tasks", "--in-doubt", "--lease", "prod/nope"], &db.url).await;
    assert_eq!(unknown.code, 6, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("unknown lease prod/nope"),
        "{}",
        unknown.stderr
    );
}

/// `history` shows the ledger beside the tenures: under epoch 1 the effects it intended (done, retried by
/// epoch 2, in doubt with its late report), under epoch 2 its own attempt and what it settled, and a second
/// summary line; the tenure lines and the first summary line are unchanged. `--json` keeps every field of the
/// review at the same level and adds each tenure's `effects` and `settled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_shows_the_effects_of_each_tenure() {
    let db = TestDb::new().await;
    ledger_scenario(&db).await;
    let text = pgfence(&["history", "--lease", "prod/scheduler"], &db.url).await;
    assert_eq!(text.code, 0, "{}", text.stderr);
    let out = &text.stdout;
    let first = &out
        [out.find("epoch 1  holder pod-a").unwrap()..out.find("epoch 2  holder pod-b").unwrap()];
    for expected in [
        "\n  effects       3 attempts intended, 1 in doubt, 1 late report\n",
        "\n    launch #1 (task job-1): done\n",
        "\n    notify #1 (task job-1): no outcome; retried by epoch 2 at ",
        "\n    deploy\\u{202e}kcah\\\\u{1b} #1 (task job-2): unknown; IN DOUBT (outcome unknown, not settled)\n",
        "\n      late report: done ×1, last ",
    ] {
        assert!(first.contains(expected), "missing {expected:?} in\n{first}");
    }
    let second = &out[out.find("epoch 2  holder pod-b").unwrap()..];
    assert!(second.contains("\n  effects       1 attempt intended, 0 in doubt, 0 late reports\n    notify #2 (task job-1): done\n"), "{second}");
    assert!(
        second.contains("\n  settled       notify #1 of epoch 1: retried at "),
        "{second}"
    );
    assert!(out.contains(
        "prod/scheduler: 2 tenures; overlaps: 0 certain, 0 possible, 1 unknown; accepted writes after a successor's \
         acquisition: 0\nprod/scheduler: effects: 4 attempts; 1 in doubt; settled: 0 confirmed, 1 retried, 0 \
         abandoned; 1 late report\n"
    ), "{out}");

    let json = pgfence(&["history", "--lease", "prod/scheduler", "--json"], &db.url).await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let reviews: Vec<pgfence::history::TenureReview> = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(reviews.len(), 2);
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let effects: Vec<Attempt> = serde_json::from_value(doc[0]["effects"].clone()).unwrap();
    assert_eq!(effects.len(), 3);
    assert_eq!(
        doc[1]["settled"],
        json!([{"key": "notify", "attempt": 1, "epoch": 1, "settlement": "retried",
        "settled_at": doc[1]["settled"][0]["settled_at"]}])
    );
    assert_eq!(doc[0]["settled"], json!([]));
}
