//! A hand-built overlap review for the rendering tests of `pgfence history` (text and SVG).
//!
//! The library's types are `#[non_exhaustive]`, so outside the library they are built the way the CLI meets
//! them in `--json`: from JSON.

use pgfence::history::TenureReview;
use serde_json::json;

/// A holder name a hostile role could store: a terminal title sequence, a bell, markup, a bidirectional
/// override and a character XML forbids.
pub(crate) const HOSTILE_HOLDER: &str =
    "evil\u{1b}]0;pwned\u{7}<script>alert(1)</script>\u{202e}&\u{ffff}";

/// A hostile `application_name`: clears the screen, closes the SVG text element it is printed in.
pub(crate) const HOSTILE_APPLICATION: &str = "\u{1b}[2J\u{1b}[31m</text><script>x()</script>\r";

/// Four tenures of `demo/scheduler`, with the review's numbers as `History::review` computes them:
/// - epoch 1 (controller-a) believed it led after epoch 2's acquisition: CERTAIN, proved by a refused write;
/// - epoch 2 (the hostile holder) never reported its end: UNKNOWN, its last write known from a write mark only;
/// - epoch 3 (controller-c) may have believed it led after epoch 4's acquisition: POSSIBLE, and a write of it
///   was accepted after that (a broken fence);
/// - epoch 4 (controller-a) is current.
pub(crate) fn review() -> Vec<TenureReview> {
    let tenure =
        |epoch: i64, holder: &str, acquired: &str, ended: Option<&str>, reason: Option<&str>| {
            json!({
                "lease": "demo/scheduler",
                "epoch": epoch,
                "holder": holder,
                "acquired_at": acquired,
                "ended_at": ended,
                "end_reason": reason,
                "server": {
                    "system_identifier": "7713809712815880156",
                    "instance_id": "11c6e3dd-f5dc-4059-b6d7-72d8167ce9c6",
                    "timeline": 1,
                    "server_addr": "10.0.0.5:5432",
                    "client_addr": "10.0.0.7:51234",
                    "application_name": holder,
                },
                "belief": {},
            })
        };

    let mut first = tenure(
        1,
        "controller-a",
        "2026-11-30T04:41:48.795Z",
        Some("2026-11-30T04:41:51.224Z"),
        Some("expired"),
    );
    first["last_write_at"] = json!("2026-11-30T04:41:48.813Z");
    first["last_event_at"] = json!("2026-11-30T04:41:48.813Z");
    first["last_mark_at"] = json!("2026-11-30T04:41:48.811Z");
    first["belief"] = json!({
        "endpoint": "db1:5432,db2:5432/control",
        "from": "2026-11-30T04:41:48.790Z",
        "start_sent_at": "2026-11-30T04:41:48.800Z",
        "start_received_at": "2026-11-30T04:41:48.810Z",
        "until": "2026-11-30T04:41:52.100Z",
        "end_cause": "lost",
        "end_detail": "superseded",
        "end_sent_at": "2026-11-30T04:41:52.101Z",
        "end_received_at": "2026-11-30T04:41:52.120Z",
    });

    let mut second = tenure(
        2,
        HOSTILE_HOLDER,
        "2026-11-30T04:41:51.249Z",
        Some("2026-11-30T04:41:55.000Z"),
        Some("expired"),
    );
    second["server"]["application_name"] = json!(HOSTILE_APPLICATION);
    second["last_write_at"] = json!("2026-11-30T04:41:54.000Z");
    second["last_mark_at"] = json!("2026-11-30T04:41:54.000Z");
    second["belief"] = json!({
        "endpoint": "db1:5432/control\u{1b}[8m",
        "from": "2026-11-30T04:41:51.250Z",
        "start_sent_at": "2026-11-30T04:41:51.251Z",
        "start_received_at": "2026-11-30T04:41:51.253Z",
    });

    let mut third = tenure(
        3,
        "controller-c",
        "2026-11-30T04:41:55.100Z",
        Some("2026-11-30T04:41:58.000Z"),
        Some("forced"),
    );
    third["last_write_at"] = json!("2026-11-30T04:41:58.100Z");
    third["last_event_at"] = json!("2026-11-30T04:41:57.000Z");
    third["last_mark_at"] = json!("2026-11-30T04:41:58.100Z");
    // Read by a schema owner that may not read the system identifier.
    third["server"]["system_identifier"] = json!(null);
    // Its clock runs about 0.3 s ahead of the database's, and its start report took 0.2 s to arrive.
    third["belief"] = json!({
        "from": "2026-11-30T04:41:55.401Z",
        "start_sent_at": "2026-11-30T04:41:55.402Z",
        "start_received_at": "2026-11-30T04:41:55.302Z",
        "until": "2026-11-30T04:41:58.300Z",
        "end_cause": "deadline",
        "end_sent_at": "2026-11-30T04:41:58.301Z",
        "end_received_at": "2026-11-30T04:41:58.500Z",
    });

    let mut fourth = tenure(4, "controller-a", "2026-11-30T04:41:58.050Z", None, None);
    fourth["belief"] = json!({
        "from": "2026-11-30T04:41:58.060Z",
        "start_sent_at": "2026-11-30T04:41:58.061Z",
        "start_received_at": "2026-11-30T04:41:58.062Z",
    });

    let reviews = json!([
        {
            "tenure": first,
            "successor": {"epoch": 2, "holder": HOSTILE_HOLDER, "acquired_at": "2026-11-30T04:41:51.249Z"},
            "clock_offset": {"min_us": 5000, "max_us": 10000},
            "believed_until_db": {"earliest": "2026-11-30T04:41:52.104338Z", "latest": "2026-11-30T04:41:52.110Z"},
            "overlap": {"overlap": "certain", "refused_write_at": "2026-11-30T04:41:52.490Z"},
            "accepted_after_successor": null,
            "refusals_after_successor": [{
                "id": 7,
                "role": "app",
                "scope": "tenure",
                "lease": "demo/scheduler",
                "presented_epoch": 1,
                "current_epoch": 2,
                "current_holder": HOSTILE_HOLDER,
                "reason": "superseded",
                "operation": "transition_task",
                "target_table": "tasks",
                "target_key": "job-2",
                "rejected_at": "2026-11-30T04:41:52.480Z",
                "last_rejected_at": "2026-11-30T04:41:52.490Z",
                "count": 2,
                "application_name": "controller-a",
                "backend_pid": 17662,
            }],
        },
        {
            "tenure": second,
            "successor": {"epoch": 3, "holder": "controller-c", "acquired_at": "2026-11-30T04:41:55.100Z"},
            "clock_offset": {"min_us": -1000, "max_us": 2000},
            "believed_until_db": null,
            "overlap": {"overlap": "unknown"},
            "accepted_after_successor": null,
            "refusals_after_successor": [],
        },
        {
            "tenure": third,
            "successor": {"epoch": 4, "holder": "controller-a", "acquired_at": "2026-11-30T04:41:58.050Z"},
            "clock_offset": {"min_us": -301000, "max_us": -100000},
            "believed_until_db": {"earliest": "2026-11-30T04:41:57.998420Z", "latest": "2026-11-30T04:41:58.200Z"},
            "overlap": {"overlap": "possible"},
            "accepted_after_successor": "2026-11-30T04:41:58.100Z",
            "refusals_after_successor": [],
        },
        {
            "tenure": fourth,
            "successor": null,
            "clock_offset": {"min_us": -10000, "max_us": 1000},
            "believed_until_db": null,
            "overlap": {"overlap": "no_successor"},
            "accepted_after_successor": null,
            "refusals_after_successor": [],
        },
    ]);
    serde_json::from_value(reviews).expect("the fixture matches the library's JSON")
}

/// Two attempts of one effect of `demo/scheduler` with a hostile key, task and intent: attempt 1, recorded by
/// epoch 1, reported `unknown`, was retried by epoch 2 and has a late report; attempt 2, epoch 2's, is done.
pub(crate) fn attempts() -> Vec<pgfence::effects::Attempt> {
    let attempt = |n: u32, epoch: i64, state: &str| {
        json!({
            "effect": {
                "id": n, "task_id": 7, "task_key": "job\u{7}", "lease": "demo/scheduler",
                "key": "key\u{1b}[2J", "attempt": n, "epoch": epoch,
                "intent": {"launch": "\u{1b}]0;pwned\u{7}", "replicas": 3},
                "state": state, "detail": null, "settled_by": null,
            },
            "intended_at": "2026-11-30T04:41:49.000Z",
            "outcome": null, "outcome_detail": null, "outcome_at": null,
            "settlement": null, "settled_at": null, "in_doubt": false, "late_report": null,
        })
    };
    let mut first = attempt(1, 1, "retried");
    first["effect"]["settled_by"] = json!(2);
    first["outcome"] = json!("unknown");
    first["outcome_at"] = json!("2026-11-30T04:41:50.000Z");
    first["settlement"] = json!("retried");
    first["settled_at"] = json!("2026-11-30T04:41:53.000Z");
    first["late_report"] = json!({
        "state": "done", "detail": {"workload": "w-1\u{9b}"},
        "reported_at": "2026-11-30T04:41:54.000Z", "count": 2,
    });
    let mut second = attempt(2, 2, "done");
    second["outcome"] = json!("done");
    second["outcome_at"] = json!("2026-11-30T04:41:55.000Z");
    serde_json::from_value(json!([first, second])).expect("attempts from JSON")
}
