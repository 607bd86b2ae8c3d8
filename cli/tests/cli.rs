//! The `pgfence` binary, run as a user would run it, against real PostgreSQL: every command, `--json` parsed
//! back, every documented error with its exit code, and no password in any output.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::TestDb;
use pgfence::{
    DatabaseIdentity, LeaseState, LeaseStatus, Overlap, Rejection, Tenure, TenureReview,
};
use serde_json::json;

const SENTINEL: &str = "Cli-s3cret-Sentinel";

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the built binary with `args`; `url` becomes DATABASE_URL (the caller's own DATABASE_URL never leaks in).
async fn pgfence(args: &[&str], url: Option<&str>) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"));
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("PGFENCE_CLUSTER");
    if let Some(url) = url {
        command.env("DATABASE_URL", url);
    }
    let output = command.output().await.expect("run pgfence");
    let run = Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    // SENTINEL, and the password of a URL that has one (the embedded server's).
    let mut secrets = vec![SENTINEL.to_owned()];
    secrets.extend(
        url.and_then(|url| url.parse::<tokio_postgres::Config>().ok())
            .and_then(|config| config.get_password().map(<[u8]>::to_vec))
            .map(|password| String::from_utf8_lossy(&password).into_owned()),
    );
    for secret in secrets {
        assert!(
            !run.stdout.contains(&secret) && !run.stderr.contains(&secret),
            "the password leaked: {}{}",
            run.stdout,
            run.stderr
        );
    }
    run
}

/// The test database's URL with a password in it (the embedded server's own; or one that a server asking for
/// none accepts and ignores) — which must never be printed.
fn with_password(db: &TestDb) -> String {
    common::url_with_password(&db.url, SENTINEL).0
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The main job: `pgfence demo` with no URL starts its own server, tells the story and exits 0 with every
/// invariant held; the JSON report parses back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_on_the_embedded_default_exits_zero_with_every_invariant_held() {
    let run = pgfence(&["demo", "--json"], None).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("FROZEN") && run.stderr.contains("REFUSED"),
        "{}",
        run.stderr
    );
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["verdict"], json!(true));
    assert_eq!(report["lease"], json!("demo/scheduler"));
    let tenures: Vec<Tenure> = serde_json::from_value(report["tenures"].clone()).unwrap();
    assert_eq!(tenures.len(), 2);
    assert_eq!(tenures[0].end_reason.as_deref(), Some("expired"));
    let rejections: Vec<Rejection> = serde_json::from_value(report["rejections"].clone()).unwrap();
    assert!(!rejections.is_empty());
    assert!(rejections
        .iter()
        .all(|r| r.presented_epoch == 1 && r.current_epoch == Some(2)));
    assert!(rejections
        .iter()
        .all(|r| r.application_name.as_deref() == Some("controller-a")));
}

/// `pgfence demo` against an existing database works in a cluster of its own and prints the human report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_against_a_given_database_prints_the_story_and_verdict() {
    let db = TestDb::new().await;
    let run = pgfence(&["demo"], Some(&with_password(&db))).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    for expected in [
        "took over",
        "REFUSED",
        "Tenure timeline",
        "pgfence.rejections",
        "every invariant held",
    ] {
        assert!(
            run.stdout.contains(expected),
            "missing {expected:?} in\n{}",
            run.stdout
        );
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.leases WHERE name LIKE 'demo-%/scheduler'")
            .await,
        1
    );
}

/// Sets up one lease with a takeover and one refused stale write.
async fn scenario(db: &TestDb) -> pgfence::Lease {
    let store = db.store("prod").await;
    let old = store
        .acquire("scheduler", "pod-a", Duration::from_secs(60))
        .await
        .unwrap();
    store
        .create_task(&old.fence(), "job-1", &json!({}))
        .await
        .unwrap();
    store.force_release("scheduler").await.unwrap();
    let current = store
        .acquire("scheduler", "pod-b", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(store.claim_task(&old.fence(), "job-1", "w").await.is_err());
    current
}

/// status, audit, history and identity print tables, and their `--json` output parses back into the library's
/// types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_commands_print_tables_and_json() {
    let db = TestDb::new().await;
    scenario(&db).await;
    let url = with_password(&db);

    let status = pgfence(&["status", "--json"], Some(&url)).await;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let leases: Vec<LeaseStatus> = serde_json::from_str(&status.stdout).unwrap();
    let lease = leases.iter().find(|l| l.name == "prod/scheduler").unwrap();
    assert_eq!(lease.state, LeaseState::Held);
    assert_eq!(lease.epoch.map(|e| e.get()), Some(2));
    assert_eq!(lease.holder.as_deref(), Some("pod-b"));
    assert!(lease.last_write_at.is_some());
    let table = pgfence(&["status"], Some(&url)).await;
    assert!(
        table.stdout.contains("prod/scheduler") && table.stdout.contains("EXPIRES IN"),
        "{}",
        table.stdout
    );

    let audit = pgfence(
        &["audit", "--lease", "prod/scheduler", "--json"],
        Some(&url),
    )
    .await;
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    let rows: Vec<Rejection> = serde_json::from_str(&audit.stdout).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].presented_epoch, rows[0].current_epoch),
        (1, Some(2))
    );
    assert_eq!(rows[0].operation, "claim_task");
    let all = pgfence(&["audit", "--json"], Some(&url)).await;
    assert_eq!(
        serde_json::from_str::<Vec<Rejection>>(&all.stdout)
            .unwrap()
            .len(),
        1
    );
    let future = pgfence(
        &["audit", "--json", "--since", "2999-01-01T00:00:00Z"],
        Some(&url),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Vec<Rejection>>(&future.stdout)
            .unwrap()
            .len(),
        0
    );
    let table = pgfence(
        &["audit", "--cluster", "prod", "--lease", "scheduler"],
        Some(&url),
    )
    .await;
    assert!(
        table.stdout.contains("superseded") && table.stdout.contains("claim_task"),
        "{}",
        table.stdout
    );

    let history = pgfence(
        &["history", "--lease", "prod/scheduler", "--json"],
        Some(&url),
    )
    .await;
    assert_eq!(history.code, 0, "{}", history.stderr);
    let reviews: Vec<TenureReview> = serde_json::from_str(&history.stdout).unwrap();
    assert_eq!(reviews.len(), 2);
    let first = &reviews[0];
    assert_eq!(first.tenure.end_reason.as_deref(), Some("forced"));
    assert!(first.tenure.last_write_at.is_some());
    // pod-a reported nothing, but its claim refused after pod-b's acquisition proves it still believed.
    assert!(
        matches!(
            first.overlap,
            Overlap::Certain {
                refused_write_at: Some(_)
            }
        ),
        "{:?}",
        first.overlap
    );
    assert_eq!(first.accepted_after_successor, None);
    assert_eq!(first.refusals_after_successor.len(), 1);
    assert_eq!(first.refusals_after_successor[0].operation, "claim_task");
    assert_eq!(reviews[1].overlap, Overlap::NoSuccessor);
    let text = pgfence(&["history", "--lease", "prod/scheduler"], Some(&url)).await;
    for expected in [
        "epoch 1  holder pod-a",
        "epoch 2  holder pod-b",
        "forced",
        "unknown start (no report)",
        "unknown end (no report)",
        "  overlap       CERTAIN: the database refused a write of epoch 1",
        "  !! the holder believed it led after epoch 2's acquisition committed at ",
        "  !! accepted writes in the window: 0",
        " claim_task",
        "prod/scheduler: 2 tenures; overlaps: 1 certain, 0 possible, 0 unknown; accepted writes after a \
         successor's acquisition: 0",
    ] {
        assert!(
            text.stdout.contains(expected),
            "missing {expected:?} in\n{}",
            text.stdout
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let picture = dir.path().join("history.svg");
    let svg = pgfence(
        &[
            "history",
            "--lease",
            "prod/scheduler",
            "--svg",
            picture.to_str().unwrap(),
        ],
        Some(&url),
    )
    .await;
    assert_eq!(svg.code, 0, "{}", svg.stderr);
    assert_eq!(svg.stdout, text.stdout);
    let picture = std::fs::read_to_string(&picture).unwrap();
    assert!(picture.starts_with("<?xml") && picture.ends_with("</svg>\n"));
    assert!(picture.contains("<title>pgfence history: prod/scheduler</title>"));
    assert_eq!(picture.matches(r#"<g class="tenure""#).count(), 2);
    let unwritable = pgfence(
        &[
            "history",
            "--lease",
            "prod/scheduler",
            "--svg",
            dir.path().join("missing/history.svg").to_str().unwrap(),
        ],
        Some(&url),
    )
    .await;
    assert_eq!(unwritable.code, 1, "{}", unwritable.stderr);
    assert!(
        unwritable.stderr.contains("cannot write"),
        "{}",
        unwritable.stderr
    );

    let identity = pgfence(&["identity", "--json"], Some(&url)).await;
    assert_eq!(identity.code, 0, "{}", identity.stderr);
    let parsed: DatabaseIdentity = serde_json::from_str(&identity.stdout).unwrap();
    assert_eq!(parsed.database, db.name);
    assert!(!parsed.in_recovery && parsed.instance_id.is_some());
    let text = pgfence(&["identity"], Some(&url)).await;
    assert!(text.stdout.contains("primary") && text.stdout.contains(&parsed.instance_id.unwrap()));
}

/// migrate installs the schema once and is a no-op afterwards; on a database whose advisory-lock functions PUBLIC
/// may still execute (the default layout) it warns on stderr of that residual risk and how to close it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_installs_the_schema_once() {
    let db = TestDb::empty().await;
    let url = with_password(&db);
    let first = pgfence(&["migrate"], Some(&url)).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(
        first.stdout.contains("applied migrations"),
        "{}",
        first.stdout
    );
    assert!(
        first
            .stderr
            .contains("pgfence: warning: PUBLIC may execute")
            && first.stderr.contains("REVOKE EXECUTE ON FUNCTION"),
        "{}",
        first.stderr
    );
    let second = pgfence(&["migrate"], Some(&url)).await;
    assert!(second.stdout.contains("up to date"), "{}", second.stdout);
}

/// Grants and revokes change only roles a grant bounds (invariant 8, and the owner's own rights): `grant` and
/// `revoke` of the owner, a member of the owner, a superuser, a BYPASSRLS role, PUBLIC, `current_user`,
/// `pg_monitor` and a role that does not exist each exit 2 (bad input, docs/cli.md) with a message naming the
/// problem, and change nothing: the grants, every privilege on pgfence's objects, and the owner's and the granted
/// role's acquisitions still work. The schema is owned by a role that is not a superuser, so a revoke of the
/// owner's privileges would bite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_and_revoke_refuse_every_role_a_grant_cannot_bound() {
    let db = TestDb::empty().await;
    let owner = format!("{}_owner", db.name);
    let (app, member, su, bypass) = (
        format!("{}_app", db.name),
        format!("{}_member", db.name),
        format!("{}_su", db.name),
        format!("{}_bypass", db.name),
    );
    let password = common::ROLE_PASSWORD;
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE ROLE {owner} LOGIN PASSWORD '{password}'; ALTER DATABASE {0} OWNER TO {owner}; \
             CREATE ROLE {app} LOGIN PASSWORD '{password}'; GRANT CONNECT ON DATABASE {0} TO {app}; \
             CREATE ROLE {member} IN ROLE {owner}; CREATE ROLE {su} SUPERUSER; CREATE ROLE {bypass} BYPASSRLS",
            db.name
        ))
        .await
        .unwrap();
    let as_owner = common::url_with_credentials(&db.url, &owner, password);
    let migrated = pgfence(&["migrate"], Some(&as_owner)).await;
    assert_eq!(migrated.code, 0, "{}", migrated.stderr);
    let granted = pgfence(
        &["grant", "--role", &app, "--on-cluster", "c"],
        Some(&as_owner),
    )
    .await;
    assert_eq!(granted.code, 0, "{}", granted.stderr);
    let snapshot = || async {
        let client = db.client().await;
        let rows = client
            .query(
                "SELECT format('%s %s %s', role, coalesce(cluster, '*'), operator) FROM pgfence.grants \
                 UNION ALL SELECT format('%s %s', c.relname, c.relacl) FROM pg_class c \
                   JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgfence' \
                 UNION ALL SELECT format('%s %s', p.oid::regprocedure, p.proacl) FROM pg_proc p \
                   JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgfence' \
                 UNION ALL SELECT format('schema %s', nspacl) FROM pg_namespace WHERE nspname = 'pgfence' \
                 ORDER BY 1",
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
    };
    let before = snapshot().await;
    let missing = format!("{}_nobody", db.name);
    for role in [
        owner.as_str(),
        member.as_str(),
        su.as_str(),
        bypass.as_str(),
        "PUBLIC",
        "current_user",
        "pg_monitor",
        missing.as_str(),
    ] {
        for (command, target) in [
            ("grant", ["--all-clusters", ""]),
            ("grant", ["--on-cluster", "c"]),
            ("revoke", ["--all-clusters", ""]),
            ("revoke", ["--on-cluster", "c"]),
        ] {
            let args: Vec<&str> = [command, "--role", role]
                .into_iter()
                .chain(target.into_iter().filter(|a| !a.is_empty()))
                .collect();
            let run = pgfence(&args, Some(&as_owner)).await;
            assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
            assert!(
                run.stderr.contains("invalid role") || run.stderr.contains("does not exist"),
                "{args:?}: {}",
                run.stderr
            );
            assert_eq!(
                snapshot().await,
                before,
                "{args:?} changed grants or privileges"
            );
        }
    }
    for role in [&owner, &app] {
        let store = pgfence::Store::connect(pgfence::StoreConfig::new(
            common::url_with_credentials(&db.url, role, password),
            "c",
        ))
        .await
        .unwrap();
        let lease = store
            .acquire("sched", role, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{role} acquires after the refusals: {e}"));
        store.release(&lease).await.unwrap();
    }
}

/// force-release needs --yes (exit 2), fences the holder, and an unknown lease is exit 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_needs_confirmation_and_fences_the_holder() {
    let db = TestDb::new().await;
    scenario(&db).await;
    let url = with_password(&db);
    let refused = pgfence(&["force-release", "prod/scheduler"], Some(&url)).await;
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("--yes"));
    let done = pgfence(
        &["force-release", "prod/scheduler", "--yes", "--json"],
        Some(&url),
    )
    .await;
    assert_eq!(done.code, 0, "{}", done.stderr);
    let outcome: pgfence::ForceReleased = serde_json::from_str(&done.stdout).unwrap();
    assert!(
        matches!(outcome, pgfence::ForceReleased::Ended { ref holder, .. } if holder == "pod-b")
    );
    let status: Vec<LeaseStatus> =
        serde_json::from_str(&pgfence(&["status", "--json"], Some(&url)).await.stdout).unwrap();
    assert_eq!(status[0].state, LeaseState::Released);
    let unknown = pgfence(&["force-release", "prod/nope", "--yes"], Some(&url)).await;
    assert_eq!(unknown.code, 6, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("unknown lease prod/nope"));
}

/// force-release never hangs: a fenced transaction left open by the holder is ended after the takeover grace
/// and the release succeeds; a transaction that keeps the lease row locked makes it fail with exit 7 after
/// grace + 5 s, naming the blocking backend (invariant 7: every wait is bounded and says who blocked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_is_bounded_and_names_who_blocks() {
    let db = TestDb::new().await;
    let current = scenario(&db).await;
    let url = with_password(&db);
    let epoch = current.epoch().get();
    let secret = current.fence().secret().expose_secret().to_owned();

    // An idle fenced transaction of the current tenure: ended after the 2 s default grace.
    let idle = db.client().await;
    idle.batch_execute("BEGIN").await.unwrap();
    let outcome: String = idle
        .query_one(
            "SELECT outcome FROM pgfence.fence('prod/scheduler', $1, $2, 'fenced_transaction', NULL, NULL)",
            &[&epoch, &secret],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(outcome, "ok");
    let started = Instant::now();
    let done = pgfence(&["force-release", "prod/scheduler", "--yes"], Some(&url)).await;
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        idle.batch_execute("COMMIT").await.is_err(),
        "the idle transaction was ended"
    );

    // A renewal left uncommitted keeps the row: exit 7 naming it, bounded by grace (0 here) + 5 s.
    let admin = db.client().await;
    admin
        .query_one("SELECT pgfence.set_takeover_grace('0')", &[])
        .await
        .unwrap();
    let acquired = admin
        .query_one(
            "SELECT epoch, secret FROM pgfence.acquire('prod/scheduler', 'pod-c', 60000)",
            &[],
        )
        .await
        .unwrap();
    let (epoch, secret): (i64, String) = (acquired.get(0), acquired.get(1));
    let open = db.client().await;
    open.batch_execute("BEGIN").await.unwrap();
    let pid: i32 = open
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    open.query_one(
        "SELECT pgfence.renew('prod/scheduler', $1, $2, 60000)",
        &[&epoch, &secret],
    )
    .await
    .unwrap();
    let started = Instant::now();
    let blocked = pgfence(&["force-release", "prod/scheduler", "--yes"], Some(&url)).await;
    assert_eq!(blocked.code, 7, "{}", blocked.stderr);
    assert!(
        blocked.stderr.contains(&format!("pid {pid}")),
        "{}",
        blocked.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(9));
    open.batch_execute("ROLLBACK").await.unwrap();
}

/// Every documented error: a one-line message and its exit code, quickly, with the password never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_clear_messages_and_documented_exit_codes() {
    let needs_url = pgfence(&["status"], None).await;
    assert_eq!(needs_url.code, 2);
    assert!(
        needs_url.stderr.contains("--database-url"),
        "{}",
        needs_url.stderr
    );

    let malformed = pgfence(
        &["status"],
        Some(&format!("postgres://u:{SENTINEL}@host:notaport/db")),
    )
    .await;
    assert_eq!(malformed.code, 2, "{}", malformed.stderr);
    assert!(malformed.stderr.contains("invalid database URL"));

    let started = Instant::now();
    let unreachable = pgfence(
        &["status"],
        Some(&format!(
            "postgres://app:{SENTINEL}@127.0.0.1:{}/control",
            closed_port()
        )),
    )
    .await;
    assert_eq!(unreachable.code, 3, "{}", unreachable.stderr);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        unreachable.stderr.to_lowercase().contains("refused"),
        "{}",
        unreachable.stderr
    );
    assert!(unreachable.stderr.contains("app@127.0.0.1"));
    assert_eq!(
        unreachable.stderr.trim().lines().count(),
        1,
        "{}",
        unreachable.stderr
    );

    let empty = TestDb::empty().await;
    let missing = pgfence(&["status"], Some(&with_password(&empty))).await;
    assert_eq!(missing.code, 5, "{}", missing.stderr);
    assert!(missing.stderr.contains("pgfence migrate"));

    let db = TestDb::new().await;
    let url = with_password(&db);
    let unknown = pgfence(&["history", "--lease", "prod/nope"], Some(&url)).await;
    assert_eq!(unknown.code, 6, "{}", unknown.stderr);
    let wrong = pgfence(
        &[
            "status",
            "--expect-instance-id",
            "00000000-0000-0000-0000-000000000000",
        ],
        Some(&url),
    )
    .await;
    assert_eq!(wrong.code, 4, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("wrong database"));
    let bad_limit = pgfence(&["audit", "--limit", "0"], Some(&url)).await;
    assert_eq!(bad_limit.code, 2);
    let bad_arg = pgfence(&["audit", "--since", "yesterday"], Some(&url)).await;
    assert_eq!(bad_arg.code, 2);
}

/// A standby is refused with exit code 4 before anything else happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_refused_with_exit_code_4() {
    let (primary, standby) = tokio::task::spawn_blocking(|| {
        let primary = pgfence::embedded::EmbeddedServer::start().unwrap();
        let standby = primary.start_standby().unwrap();
        (primary, standby)
    })
    .await
    .unwrap();
    // The URL carries the server's password, which `pgfence` checks never appears.
    let run = pgfence(&["status"], Some(&standby.url())).await;
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(run.stderr.contains("standby"), "{}", run.stderr);
    tokio::task::spawn_blocking(move || drop((standby, primary)))
        .await
        .unwrap();
}

/// Every command has its own --help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_has_help() {
    for command in [
        "demo",
        "status",
        "audit",
        "history",
        "identity",
        "migrate",
        "force-release",
    ] {
        let run = pgfence(&[command, "--help"], None).await;
        assert_eq!(run.code, 0, "{command}: {}", run.stderr);
        assert!(
            run.stdout.contains("Usage: pgfence"),
            "{command}: {}",
            run.stdout
        );
    }
    let top = pgfence(&["--help"], None).await;
    assert!(top.stdout.contains("Exit codes"), "{}", top.stdout);
}

/// Ctrl-C during the demo exits with 130 and removes the embedded server (its port stops answering).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_the_demo_removes_the_embedded_server() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .arg("demo")
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut port = None;
    while let Some(line) = lines.next_line().await.unwrap() {
        if let Some(rest) = line.split("PostgreSQL on 127.0.0.1:").nth(1) {
            port = rest
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok());
        }
        if line.contains("FROZEN") {
            break;
        }
    }
    let port = port.expect("the demo printed its server's port");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().await.unwrap();
    assert_eq!(exit.code(), Some(130));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the embedded server outlived the demo"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
