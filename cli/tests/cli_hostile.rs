//! The `pgfence` binary against hostile stored text: whatever a role with table privileges (or a bug) stored in
//! the pgfence tables, the CLI never writes a terminal control to the operator and never panics.
//!
//! Invariant, checked for every read command (`status`, `audit`, `history`, `identity`, each with and without
//! `--json`, also `audit`/`history` naming the hostile lease) and for `force-release`, whose confirmation and
//! refusal quote a holder and a lease name:
//! - the exit code is one of the documented ones (`pgfence --help`), never 101 (a panic);
//! - stdout and stderr are UTF-8 and contain no byte 0x00–0x08, 0x0B–0x1F or 0x7F, no C1 control
//!   (U+0080–U+009F) and no bidirectional control (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069);
//! - `--json` output parses, and gives back exactly the stored value where one was stored;
//! - the timeline picture of `history --svg` holds no control character and no markup but its own elements.
//!
//! The hostile value is written by the superuser straight into every text column of every pgfence table, one
//! statement per column. A constraint or trigger that refuses it (today: name and key length and shape, the end
//! reasons, the foreign keys; more as the schema is tightened) just leaves that column as it was; the test goes
//! on with the others. The run fails only if nothing hostile could be stored in any table that a read command
//! shows, since then it would no longer test the CLI.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::TestDb;
use pgfence::admin::Rejection;
use pgfence::history::TenureReview;
use pgfence::LeaseStatus;
use proptest::prelude::*;
use serde_json::json;

/// The exit codes `pgfence --help` documents.
const DOCUMENTED_EXIT_CODES: [i32; 10] = [0, 1, 2, 3, 4, 5, 6, 7, 10, 130];

/// The lease every fuzzed row hangs off (a name the CLI accepts as an argument).
const LEASE: &str = "fuzz/lease";

/// Tables whose text a read command shows: a hostile value stored in one of them exercises the CLI.
const SHOWN_TABLES: [&str; 3] = ["leases", "tenures", "rejections"];

/// How many hostile values (with a terminal control in them) were stored in a shown table, over the run.
static STORED_CONTROLS: AtomicUsize = AtomicUsize::new(0);

struct Run {
    args: Vec<String>,
    code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Run {
    fn stdout_text(&self) -> &str {
        std::str::from_utf8(&self.stdout).unwrap_or_default()
    }
}

/// Runs the built binary with `args` against `url` (the caller's own environment never leaks in).
async fn pgfence(args: &[&str], url: &str) -> Run {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .args(args)
        .env_remove("PGFENCE_CLUSTER")
        .env_remove("PGFENCE_LOG")
        .env("DATABASE_URL", url)
        .output()
        .await
        .expect("run pgfence");
    Run {
        args: args.iter().map(|a| a.to_string()).collect(),
        code: output.status.code().unwrap_or(-1),
        stdout: output.stdout,
        stderr: output.stderr,
    }
}

/// Whether `c` is a character the terminal would act on, as the invariant defines it (tab and newline are
/// the CLI's own layout).
fn forbidden(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}' | '\u{80}'..='\u{9f}')
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

fn has_terminal_control(text: &str) -> bool {
    text.chars().any(|c| c != '\t' && c != '\n' && forbidden(c))
}

/// Asserts the invariant on one run's exit code and output.
fn assert_safe(run: &Run, hostile: &str) {
    let context = || {
        format!(
            "pgfence {:?} with stored {:?} (first 200 chars)",
            run.args,
            hostile.chars().take(200).collect::<String>()
        )
    };
    assert_ne!(
        run.code,
        101,
        "panicked: {}\n{}",
        context(),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        DOCUMENTED_EXIT_CODES.contains(&run.code),
        "undocumented exit code {}: {}",
        run.code,
        context()
    );
    for (stream, bytes) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
        let text = std::str::from_utf8(bytes)
            .unwrap_or_else(|e| panic!("{stream} is not UTF-8 ({e}): {}", context()));
        if let Some((at, c)) = text
            .char_indices()
            .find(|(_, c)| *c != '\t' && *c != '\n' && forbidden(*c))
        {
            let from = text[..at]
                .char_indices()
                .rev()
                .nth(40)
                .map_or(0, |(i, _)| i);
            panic!(
                "{stream} holds the terminal control {c:?} at byte {at}: {}\naround it: {:?}",
                context(),
                text[from..].chars().take(80).collect::<String>()
            );
        }
    }
}

/// The elements `pgfence history --svg` writes: any other `<` in the file would be markup from the database.
const SVG_ELEMENTS: [&str; 10] = [
    "svg", "title", "style", "defs", "pattern", "rect", "line", "text", "g", "circle",
];

/// Asserts that a timeline picture holds no control character (XML 1.0 allows none but tab, newline and CR;
/// the picture uses newlines only), none of the other characters XML forbids, and no tag but its own.
fn assert_svg_safe(svg: &str, hostile: &str) {
    let context = || hostile.chars().take(200).collect::<String>();
    if let Some(c) = svg.chars().find(|c| {
        *c != '\n' && (forbidden(*c) || c.is_control() || matches!(c, '\u{fffe}' | '\u{ffff}'))
    }) {
        panic!("the SVG holds {c:?} with stored {:?}", context());
    }
    let body = svg
        .strip_prefix(r#"<?xml version="1.0" encoding="UTF-8"?>"#)
        .expect("the XML declaration first");
    for (at, _) in body.match_indices('<') {
        let tag = &body[at + 1..];
        let name = tag.strip_prefix('/').unwrap_or(tag);
        assert!(
            SVG_ELEMENTS.iter().any(|element| name
                .strip_prefix(element)
                .is_some_and(|after| after.starts_with([' ', '>', '/']))),
            "markup from the database in the SVG: {:?} (stored {:?})",
            tag.chars().take(60).collect::<String>(),
            context()
        );
    }
}

/// Parses `--json` output (it must parse, whatever was stored) into `T`.
fn parse<T: serde::de::DeserializeOwned>(run: &Run, hostile: &str) -> T {
    assert_eq!(
        run.code,
        0,
        "pgfence {:?}: {}",
        run.args,
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_str(run.stdout_text()).unwrap_or_else(|e| {
        panic!(
            "pgfence {:?} printed no JSON ({e}) with stored {:?}",
            run.args,
            hostile.chars().take(200).collect::<String>()
        )
    })
}

/// One lease with a takeover, a task and a refused stale write: a row in every table, written by pgfence.
async fn scenario(db: &TestDb) {
    let store = db.store("fuzz").await;
    let old = store
        .acquire("lease", "pod-a", Duration::from_secs(60))
        .await
        .unwrap();
    store
        .tasks()
        .create(&old.fence(), "job-1", &json!({}))
        .await
        .unwrap();
    store.admin().force_release("lease").await.unwrap();
    store
        .acquire("lease", "pod-b", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(store
        .tasks()
        .claim(&old.fence(), "job-1", "w")
        .await
        .is_err());
}

/// Writes `hostile` into every text column of every pgfence table (all rows; not the migration bookkeeping,
/// which the CLI does not show), one statement each, and adds a held lease named after it; returns the `(table, column)`s that took it and the hostile lease name when it
/// was stored.
async fn store_hostile(
    client: &tokio_postgres::Client,
    hostile: &str,
) -> (HashSet<(String, String)>, Option<String>) {
    let columns = client
        .query(
            "SELECT c.table_name::text, c.column_name::text \
               FROM information_schema.columns c \
               JOIN information_schema.tables t USING (table_schema, table_name) \
              WHERE c.table_schema = 'pgfence' AND t.table_type = 'BASE TABLE' \
                AND c.table_name <> '__diesel_schema_migrations' \
                AND c.data_type IN ('text', 'character varying') AND c.is_generated = 'NEVER' \
              ORDER BY 1, 2",
            &[],
        )
        .await
        .expect("list the text columns");
    let mut stored = HashSet::new();
    for row in columns {
        let (table, column): (String, String) = (row.get(0), row.get(1));
        let sql = format!(
            "UPDATE pgfence.\"{}\" SET \"{}\" = $1",
            table.replace('"', "\"\""),
            column.replace('"', "\"\"")
        );
        // Refused (a constraint, a trigger, an index row too large): that column keeps what it had.
        if let Ok(rows) = client.execute(&sql, &[&hostile]).await {
            if rows > 0 {
                stored.insert((table, column));
            }
        }
    }
    // Lease names are never updated (a trigger refuses it): a new held lease carries the hostile name.
    let name = format!("fuzz/{}", hostile.chars().take(395).collect::<String>());
    let inserted = client
        .execute(
            "INSERT INTO pgfence.leases (name, holder, epoch, state, ttl_ms, expires_at, acquired_at) \
             VALUES ($1, $2, 1, 'held', 60000, clock_timestamp() + interval '1 hour', clock_timestamp())",
            &[&name, &hostile],
        )
        .await
        .is_ok();
    if inserted {
        // Its tenure, so that `history` has a row to show (also refused gracefully).
        let _ = client
            .execute(
                "INSERT INTO pgfence.tenures (lease, epoch, holder, acquired_at) \
                 VALUES ($1, 1, $2, clock_timestamp())",
                &[&name, &hostile],
            )
            .await;
    }
    if has_terminal_control(hostile) || hostile.contains(['\t', '\n']) {
        let shown = stored
            .iter()
            .filter(|(t, _)| SHOWN_TABLES.contains(&t.as_str()))
            .count()
            + usize::from(inserted);
        STORED_CONTROLS.fetch_add(shown, Ordering::Relaxed);
    }
    (stored, inserted.then_some(name))
}

/// Stores `hostile` in a fresh database, runs every read command and force-release, and checks the invariant.
async fn check(hostile: String) {
    let db = TestDb::new().await;
    scenario(&db).await;
    let client = db.client().await;
    let (stored, hostile_lease) = store_hostile(&client, &hostile).await;
    let took = |table: &str, column: &str| stored.contains(&(table.to_owned(), column.to_owned()));
    let url = db.url.as_str();

    let mut reads: Vec<Vec<&str>> = vec![
        vec!["status"],
        vec!["status", "--json"],
        vec!["audit"],
        vec!["audit", "--json"],
        vec!["audit", "--lease", LEASE],
        vec!["history", "--lease", LEASE],
        vec!["history", "--lease", LEASE, "--json"],
        vec!["identity"],
        vec!["identity", "--json"],
    ];
    if let Some(name) = &hostile_lease {
        reads.push(vec!["history", "--lease", name]);
        reads.push(vec!["history", "--lease", name, "--json"]);
        reads.push(vec!["audit", "--lease", name, "--json"]);
        // Refused without --yes: the message quotes the name.
        reads.push(vec!["force-release", name]);
    }
    let runs = futures_util::future::join_all(reads.iter().map(|args| pgfence(args, url))).await;
    for run in &runs {
        assert_safe(run, &hostile);
    }

    // The JSON gives back exactly what was stored.
    let json = |args: &[&str]| runs.iter().find(|r| r.args == args).unwrap();
    let status: serde_json::Value = parse(json(&["status", "--json"]), &hostile);
    let leases: Vec<LeaseStatus> = serde_json::from_value(status["leases"].clone()).unwrap();
    if took("leases", "holder") {
        let lease = leases.iter().find(|l| l.name == LEASE).unwrap();
        assert_eq!(lease.holder.as_deref(), Some(hostile.as_str()));
    }
    if let Some(name) = &hostile_lease {
        assert!(leases.iter().any(|l| &l.name == name), "{name:?} missing");
    }
    let rejections: Vec<Rejection> = parse(json(&["audit", "--json"]), &hostile);
    if took("rejections", "reason") {
        assert!(rejections.iter().all(|r| r.reason == hostile));
    }
    if took("rejections", "target_key") {
        assert!(rejections
            .iter()
            .all(|r| r.target_key.as_deref() == Some(&*hostile)));
    }
    let reviews: Vec<TenureReview> =
        parse(json(&["history", "--lease", LEASE, "--json"]), &hostile);
    assert_eq!(reviews.len(), 2);
    if took("tenures", "holder") {
        assert!(reviews.iter().all(|r| r.tenure.holder == hostile));
    }

    // The timeline picture holds no control and no markup from the database.
    let dir = tempfile::tempdir().unwrap();
    let mut leases = vec![LEASE];
    leases.extend(hostile_lease.as_deref());
    for (i, lease) in leases.into_iter().enumerate() {
        let path = dir.path().join(format!("history-{i}.svg"));
        let run = pgfence(
            &["history", "--lease", lease, "--svg", path.to_str().unwrap()],
            url,
        )
        .await;
        assert_safe(&run, &hostile);
        if run.code == 0 {
            assert_svg_safe(&std::fs::read_to_string(&path).unwrap(), &hostile);
        }
    }
    let _: serde_json::Value = parse(json(&["identity", "--json"]), &hostile);

    // force-release prints the holder it cut off (a write, so after the reads).
    let released = pgfence(&["force-release", LEASE, "--yes"], url).await;
    assert_safe(&released, &hostile);
    if let Some(name) = &hostile_lease {
        let released = pgfence(&["force-release", name, "--yes", "--json"], url).await;
        assert_safe(&released, &hostile);
        if released.code == 0 {
            let _: serde_json::Value = parse(&released, &hostile);
        }
    }
}

/// Runs `check` on a runtime of its own (proptest runs cases synchronously).
fn check_blocking(runtime: &tokio::runtime::Runtime, hostile: String) {
    runtime.block_on(check(hostile));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Pieces that attack a terminal, for the generator to mix with arbitrary text.
const ATTACKS: &[&str] = &[
    "\u{1b}[2J\u{1b}[H",                // clear the screen, cursor home
    "\u{1b}]52;c;cHduZWQ=\u{7}",        // OSC 52: write the clipboard
    "\u{1b}]0;owned\u{1b}\\",           // OSC 0: retitle the window, ST-terminated
    "\r",                               // overwrite the line from its start
    "\u{7}",                            // BEL
    "\u{8}\u{8}\u{8}",                  // backspaces
    "\u{9b}31m",                        // C1 CSI
    "\u{7f}",                           // DEL
    "\u{202e}",                         // right-to-left override
    "\u{2066}\u{2069}\u{200f}\u{061c}", // isolates, RLM, ALM
    "e\u{301}\u{302}\u{303}",           // combining marks
    "\\u{1b}",                          // an escape's look-alike
    "\n",
    "\t",
];

/// Characters repeated into values longer than a format width's u16.
const LONG: &[char] = &['x', '\u{1b}', 'é', '\u{202e}'];

/// Hostile text: arbitrary printable strings, arbitrary characters (any control but NUL, which PostgreSQL
/// text refuses) and the attacks above, mixed; now and then one character repeated past 65,535.
fn hostile_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => any::<String>(),
        3 => any::<char>().prop_map(|c| if c == '\0' { '\u{1b}' } else { c }.to_string()),
        3 => prop::sample::select(ATTACKS).prop_map(str::to_owned),
        1 => (prop::sample::select(LONG), 60_000usize..70_000)
            .prop_map(|(c, n)| c.to_string().repeat(n)),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

/// The reported attacks, by hand, each stored on its own.
#[test]
fn hand_picked_hostile_values_never_reach_the_terminal_nor_panic() {
    let runtime = runtime();
    let values = [
        "\u{1b}[2J\u{1b}[H".to_owned(),
        "\u{1b}]52;c;cHduZWQ=\u{7}".to_owned(),
        "pod-a\r\u{1b}[Kpod-b".to_owned(),
        "\u{7}".to_owned(),
        "\u{9b}2J\u{7f}".to_owned(),
        "\u{202e}txt.exe".to_owned(),
        "e\u{301}\u{302} ¥ Ѩ".to_owned(),
        "\\u{1b}[2J".to_owned(),
        // Markup, for the timeline picture (`history --svg`).
        "</text><script>alert(1)</script>&amp;".to_owned(),
        String::new(),
        // Past a format width's u16: the table used to panic on these.
        "x".repeat(70_000),
        "\u{1b}".repeat(70_000),
        "é".repeat(70_000),
    ];
    for value in values {
        check_blocking(&runtime, value);
    }
    assert!(
        STORED_CONTROLS.load(Ordering::Relaxed) > 0,
        "no hostile value could be stored in a table a read command shows: this test no longer exercises the \
         CLI's escaping; store through a column that still takes them"
    );
}

/// A reader that goes away before pgfence writes (`pgfence status | head -0`) ends it without a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_goes_away_ends_the_output_without_a_panic() {
    let db = TestDb::new().await;
    scenario(&db).await;
    for args in [&["status"][..], &["status", "--json"], &["audit"]] {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
            .args(args)
            .env_remove("PGFENCE_CLUSTER")
            .env_remove("PGFENCE_LOG")
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Close the only read end of stdout: the binary's first write gets EPIPE.
        drop(child.stdout.take());
        let output = child.wait_with_output().await.unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary stored text never reaches the terminal as a control, never panics the CLI, and comes back
    /// exactly from `--json`.
    #[test]
    fn arbitrary_stored_text_never_reaches_the_terminal_nor_panics(hostile in hostile_text()) {
        static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
        check_blocking(RUNTIME.get_or_init(runtime), hostile);
    }
}

/// Hostile member and group names, and hostile names in a member's declaration, reach the terminal escaped in
/// `status`'s group section and come back exact from `--json`. The schema refuses control characters in member
/// and group names, so one row goes in through its rules (a bidirectional override passes them) and one as a bug
/// would put it, with those checks dropped (this database is thrown away); the name arrays are unchecked by the
/// table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_member_names_reach_the_terminal_escaped_in_status() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let bidi = "pod\u{202e}txt.exe";
    let ansi = "pod-a\r\u{1b}[2J\u{1b}]0;owned\u{7}\u{9b}31m";
    let group = "fuzz/g\u{1b}[8m";
    client
        .batch_execute(
            "ALTER TABLE pgfence.members DROP CONSTRAINT IF EXISTS members_member_check; \
             ALTER TABLE pgfence.groups DROP CONSTRAINT IF EXISTS groups_grp_check",
        )
        .await
        .unwrap();
    // Stored as the owner could: a group, its name set, a live member counted by an assignment that gives it
    // the hostile names.
    for (grp, member) in [("fuzz/g", bidi), (group, ansi)] {
        client
            .execute(
                "WITH g AS (INSERT INTO pgfence.groups (grp, channel, ttl_ms) VALUES ($1, 'c', 60000) \
                            ON CONFLICT DO NOTHING RETURNING grp), \
                      s AS (INSERT INTO pgfence.name_sets (digest, names) \
                            VALUES (sha256(convert_to($1 || $2, 'UTF8')), ARRAY[$2, 'job\u{1b}[31m', 'plain']) \
                            RETURNING set_id) \
                 INSERT INTO pgfence.members (grp, member, weight, set_id, pinned, excluded, secret_hash, ttl_ms, \
                   joined_at, renewed_at, expires_at, settle_at, settled_at, counted) \
                 SELECT $1, $2, 1, s.set_id, '{}', '{}', sha256('x'), 60000, now(), now(), \
                        now() + interval '1 hour', now(), now(), true FROM s LEFT JOIN g ON true",
                &[&grp, &member],
            )
            .await
            .unwrap_or_else(|e| panic!("store {member:?}: {e}"));
        client
            .execute(
                "INSERT INTO pgfence.assignments (grp, name, member) \
                 VALUES ($1, 'job\u{1b}[31m', $2), ($1, $2, $2), ($1, 'plain', $2)",
                &[&grp, &member],
            )
            .await
            .unwrap_or_else(|e| panic!("assign {member:?}: {e}"));
    }
    let url = db.url.as_str();
    let runs = futures_util::future::join_all(
        [&["status"][..], &["status", "--json"]]
            .iter()
            .map(|args| pgfence(args, url)),
    )
    .await;
    for run in &runs {
        assert_safe(run, ansi);
    }
    let text = runs[0].stdout_text();
    assert!(
        text.contains("Group fuzz/g\\u{1b}[8m: 1 live member"),
        "{text}"
    );
    assert!(
        text.contains("pod-a\\u{d}\\u{1b}[2J\\u{1b}]0;owned\\u{7}\\u{9b}31m"),
        "{text}"
    );
    assert!(text.contains("pod\\u{202e}txt.exe"), "{text}");
    assert!(text.contains("job\\u{1b}[31m"), "{text}");
    let status: serde_json::Value = parse(&runs[1], ansi);
    let groups = status["groups"].as_array().unwrap();
    let members: Vec<&str> = groups
        .iter()
        .flat_map(|g| g["members"].as_array().unwrap())
        .map(|m| m["member"].as_str().unwrap())
        .collect();
    assert!(
        members.contains(&bidi) && members.contains(&ansi),
        "{members:?}"
    );
    assert!(groups.iter().any(|g| g["group"] == group));
    assert!(groups.iter().all(|g| g["assignment"]
        .as_object()
        .unwrap()
        .contains_key("job\u{1b}[31m")));
}
