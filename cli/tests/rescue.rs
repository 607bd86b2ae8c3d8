//! Work in flight when leadership moves, proven over real processes: `pgfence demo --scenario rescue` runs worker
//! processes (`pgfence rescue-worker`) that call a real workload engine — a second database the fence does not
//! cover, deduplicating by idempotency key — under the effect ledger, and judges the ledger against the engine.
//!
//! Invariant checked (numbers as in the README's invariant map): 9 — no external effect is repeated or lost by a
//! handover: an intent whose tenure ended without an outcome is in doubt until exactly one later tenure settles it
//! (confirmed, retried under the same key, or abandoned), and an ended tenure's late outcome is refused as a write
//! and kept as evidence; with 3 (no ledger write of an ended tenure commits) and 4 (each refusal is typed).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use serde_json::{json, Value};

/// Runs `pgfence demo --scenario rescue --json` with `extra` flags on a fresh test database (migrated from the
/// template: a weakened copy of the SQL that the mutation gate applies there is what the workers run on); answers
/// the exit code, the report and the story (stderr).
async fn rescue(extra: &[&str]) -> (i32, Value, String) {
    let db = common::TestDb::new().await;
    let started = Instant::now();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .args(["demo", "--scenario", "rescue", "--json"])
        .args(extra)
        .env("DATABASE_URL", &db.url)
        .env_remove("PGFENCE_CLUSTER")
        .output()
        .await
        .expect("run pgfence");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    eprintln!(
        "pgfence demo --scenario rescue {extra:?} took {:?}",
        started.elapsed()
    );
    let report =
        serde_json::from_str(&String::from_utf8_lossy(&output.stdout)).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), report, stderr)
}

fn assert_every_check_held(code: i32, report: &Value, stderr: &str) {
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["verdict"], json!(true), "{:#}", report["checks"]);
    let checks = report["checks"].as_array().unwrap();
    assert!(
        checks.len() >= 9 && checks.iter().all(|c| c["held"] == true),
        "{checks:#?}"
    );
}

/// The story, each fault placed exactly (a worker paused at a named point, then frozen): a successor confirms the
/// effect a frozen leader's call applied (no second launch); another retries, under the same key, the effect a
/// leader froze before calling; a stale successor's settle is refused; both late outcomes are refused and kept
/// as late reports; the engine applied every task's effect once. Deterministic: each weakened copy of the ledger
/// in the mutation gate (a settle without the fence, an in-doubt list that omits the last intent, a retry that
/// mints a new key) fails it every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rescue_story_confirms_retries_and_keeps_late_outcomes() {
    let (code, report, stderr) = rescue(&[]).await;
    assert_every_check_held(code, &report, &stderr);
    assert_eq!(report["scenario"], json!("rescue"));
    let story = &report["story"];
    assert_eq!(story["tasks"], json!(3));
    assert_eq!(story["succeeded"], json!(3));
    assert!(story["confirmed"].as_i64() >= Some(1), "{story:#}");
    assert!(story["retried"].as_i64() >= Some(1), "{story:#}");
    assert!(story["late_reports"].as_i64() >= Some(2), "{story:#}");
    assert_eq!(
        story["deduplicated"],
        json!(1),
        "the frozen leader's late call absorbed by its key: {story:#}"
    );
    for line in ["confirmed", "retried", "kept as a late report"] {
        assert!(
            stderr.contains(line),
            "{line:?} missing from the story:\n{stderr}"
        );
    }
}

/// The fault run: after the story, leaders of several leases killed (`kill -9`), frozen past their ttl and
/// thawed, their connections dropped, engine replies lost and requests delivered late, until the number of
/// handovers asked for (`PGFENCE_RESCUE_HANDOVERS`, 300 by default; the closing note quotes a run of 1,000) —
/// then every task finished by a last worker per lease. Judged from the database and the engine: no effect
/// applied under two keys, no work or intent lost, no attempt settled twice, no ledger write of an ended tenure
/// committed, every late outcome kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handovers_under_faults_apply_no_effect_twice_and_lose_none() {
    let handovers = std::env::var("PGFENCE_RESCUE_HANDOVERS").unwrap_or_else(|_| "300".to_owned());
    let (code, report, stderr) = rescue(&["--handovers", &handovers]).await;
    assert_every_check_held(code, &report, &stderr);
    let chaos = &report["chaos"];
    let wanted: i64 = handovers.parse().unwrap();
    assert!(chaos["handovers"].as_i64() >= Some(wanted), "{chaos:#}");
    for fault in ["kills", "freezes", "dropped_connections"] {
        assert!(chaos[fault].as_i64() > Some(0), "no {fault}: {chaos:#}");
    }
    let story = &report["story"];
    assert!(
        story["confirmed"].as_i64() > Some(1) && story["retried"].as_i64() > Some(1),
        "{story:#}"
    );
    assert!(story["late_reports"].as_i64() > Some(2), "{story:#}");
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&report["story"]).unwrap()
    );
}
