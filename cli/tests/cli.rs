//! The `pgfence` binary, run as a user would run it, against real PostgreSQL: every command, `--json` parsed
//! back, every documented error with its exit code, and no password in any output.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::TestDb;
use pgfence::admin::Rejection;
use pgfence::groups::{GroupMember, MemberSpec, Rebalance};
use pgfence::history::{Overlap, Tenure, TenureReview};
use pgfence::leader::{Elector, LeaseOptions, PgElector};
use pgfence::{DatabaseIdentity, LeaseState, LeaseStatus};
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

/// The leases of `pgfence status --json` (`{"leases": [...], "groups": [...]}`).
fn status_leases(stdout: &str) -> Vec<LeaseStatus> {
    let status: serde_json::Value = serde_json::from_str(stdout).unwrap();
    serde_json::from_value(status["leases"].clone()).unwrap()
}

/// Sets up one lease with a takeover and one refused stale write.
async fn scenario(db: &TestDb) -> pgfence::Lease {
    let store = db.store("prod").await;
    let old = store
        .acquire("scheduler", "pod-a", Duration::from_secs(60))
        .await
        .unwrap();
    store
        .tasks()
        .create(&old.fence(), "job-1", &json!({}))
        .await
        .unwrap();
    store.admin().force_release("scheduler").await.unwrap();
    let current = store
        .acquire("scheduler", "pod-b", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(store
        .tasks()
        .claim(&old.fence(), "job-1", "w")
        .await
        .is_err());
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
    let leases = status_leases(&status.stdout);
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

/// Invariant 8's repair is shown to the operator who runs it: after a careless `GRANT ALL` on the schema and its
/// tables, in which another role planted a trigger on a pgfence table and a function in the schema (its name
/// carrying a terminal escape), `pgfence grant` prints on stderr, escaped, what the repair did — the dropped trigger
/// with the advice to acquire again, the dropped function and its owner, the revoked privileges — and the objects
/// are gone; `revoke` and `migrate` print theirs the same way. Before, these went to the server's log only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_revoke_and_migrate_print_what_the_repair_did() {
    let db = TestDb::empty().await;
    let owner = format!("{}_owner", db.name);
    let (app, planter) = (format!("{}_app", db.name), format!("{}_planter", db.name));
    let password = common::ROLE_PASSWORD;
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {owner} LOGIN PASSWORD '{password}'; ALTER DATABASE {0} OWNER TO {owner}; \
             CREATE ROLE {app} LOGIN PASSWORD '{password}'; GRANT CONNECT ON DATABASE {0} TO {app}; \
             CREATE ROLE {planter} LOGIN PASSWORD '{password}'; GRANT CONNECT ON DATABASE {0} TO {planter}",
            db.name
        ))
        .await
        .unwrap();
    let as_owner = common::url_with_credentials(&db.url, &owner, password);
    let migrated = pgfence(&["migrate"], Some(&as_owner)).await;
    assert_eq!(migrated.code, 0, "{}", migrated.stderr);
    assert!(!migrated.stderr.contains("repair"), "{}", migrated.stderr);

    // The careless grant, and what the planter makes of it.
    admin
        .batch_execute(&format!(
            "GRANT ALL ON SCHEMA pgfence TO {planter}; GRANT ALL ON ALL TABLES IN SCHEMA pgfence TO {planter}"
        ))
        .await
        .unwrap();
    let (client, connection) = tokio_postgres::connect(
        &common::url_with_credentials(&db.url, &planter, password),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE FUNCTION pgfence.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'; \
             CREATE TRIGGER zz_listen AFTER INSERT ON pgfence.tasks FOR EACH ROW EXECUTE FUNCTION pgfence.noop(); \
             CREATE FUNCTION pgfence.U&\"evil\\001B[2J\"(bigint) RETURNS int LANGUAGE sql AS 'SELECT 1';",
        )
        .await
        .unwrap();

    let granted = pgfence(
        &["grant", "--role", &app, "--on-cluster", "c"],
        Some(&as_owner),
    )
    .await;
    assert_eq!(granted.code, 0, "{}", granted.stderr);
    let said = &granted.stderr;
    for expected in [
        "pgfence: warning: dropped trigger 'zz_listen' on pgfence.tasks".to_owned(),
        "(acquire again)".to_owned(),
        format!("pgfence: warning: dropped function 'pgfence.noop()', owned by '{planter}'"),
        "pgfence: warning: dropped function 'pgfence.\"evil?[2J\"(bigint)'".to_owned(),
        format!("pgfence: warning: revoked CREATE on SCHEMA pgfence from '{planter}'"),
        format!("pgfence: warning: revoked INSERT on TABLE pgfence.tasks from '{planter}'"),
    ] {
        assert!(said.contains(&expected), "{expected} not in {said}");
    }
    assert!(
        !said.contains('\u{1b}'),
        "a raw escape reached the terminal: {said:?}"
    );
    let foreign: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgfence'::regnamespace \
              AND proowner <> (SELECT nspowner FROM pg_namespace WHERE nspname = 'pgfence')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(foreign, 0, "a foreign function is left");

    // Another careless grant: revoke repairs it and says so; then migrate.
    for (command, grant) in [("revoke", "SELECT"), ("migrate", "UPDATE")] {
        admin
            .batch_execute(&format!(
                "GRANT {grant} ON pgfence.tenure_secrets TO {planter}"
            ))
            .await
            .unwrap();
        let args: &[&str] = if command == "revoke" {
            &["revoke", "--role", &app, "--on-cluster", "c"]
        } else {
            &["migrate"]
        };
        let run = pgfence(args, Some(&as_owner)).await;
        assert_eq!(run.code, 0, "{command}: {}", run.stderr);
        let expected = format!(
            "pgfence: warning: revoked {grant} on TABLE pgfence.tenure_secrets from '{planter}'"
        );
        assert!(
            run.stderr.contains(&expected),
            "{command}: {expected} not in {}",
            run.stderr
        );
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
    let status = status_leases(&pgfence(&["status", "--json"], Some(&url)).await.stdout);
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
        "replica",
        "status",
        "audit",
        "history",
        "tasks",
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
    let port = demo_server_port(&mut lines, "FROZEN").await;
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

/// `status` shows every group after the leases: each member's state (live, left), the names it leads and the names
/// the group's assignment gives it — computed by `pgfence::leader::assign` from the live rows, as the members
/// compute it — and whether they agree, in the table and in `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_each_group_with_its_members_and_assignment() {
    let db = TestDb::new().await;
    let url = with_password(&db);
    let store = db.store("prod").await;
    let names = ["billing", "reports", "rollout", "scheduler"];
    let spec = MemberSpec::new(names);
    let ttl = Duration::from_secs(60);
    // Two replicas' memberships, heartbeated by an elector; a third joins and leaves before it ever counted.
    let elector = PgElector::new(store.clone());
    let options = LeaseOptions::new(ttl);
    let a = elector.join("g", "pod-a", &spec, &options).await.unwrap();
    let _b = elector.join("g", "pod-b", &spec, &options).await.unwrap();
    let gone = store.groups().join("g", "pod-c", &spec, ttl).await.unwrap();
    assert!(store.groups().leave(&gone).await.unwrap());
    // The group is assigned once both settled (their first heartbeats) and the quiet time passed.
    let until = Instant::now() + Duration::from_secs(30);
    let desired: BTreeMap<String, String> = loop {
        assert!(Instant::now() < until, "the group was never assigned");
        let assignment = store.groups().assignment("g").await.unwrap();
        if assignment.owners.len() == 4
            && assignment.owners.values().collect::<BTreeSet<_>>().len() == 2
        {
            break assignment.owners;
        }
        match elector.rebalance(&a).await.unwrap() {
            Rebalance::NotDue { wait: Some(wait) } | Rebalance::Claimed { wait } => {
                tokio::time::sleep(wait.min(Duration::from_millis(200))).await
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let names_of = |member: &str| -> Vec<&str> {
        desired
            .iter()
            .filter(|(_, m)| *m == member)
            .map(|(n, _)| n.as_str())
            .collect()
    };
    assert_eq!((names_of("pod-a").len(), names_of("pod-b").len()), (2, 2));

    // Nobody leads anything yet: every name differs.
    let table = pgfence(&["status"], Some(&url)).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.stdout.contains(
            "Group prod/g: 2 live members, 4 names assigned; balanced: no (desired vs actual differ on 4 names)"
        ),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("billing (assigned to pod-"),
        "{}",
        table.stdout
    );

    // Each member leads what the assignment gives it: balanced.
    for (name, member) in &desired {
        store.acquire(name, member, ttl).await.unwrap();
    }
    let table = pgfence(&["status"], Some(&url)).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.stdout.contains(
            "Group prod/g: 2 live members, 4 names assigned; balanced: yes (desired vs actual differ on 0 names)"
        ),
        "{}",
        table.stdout
    );
    for header in [
        "MEMBER",
        "STATE",
        "SETTLED",
        "WEIGHT",
        "EXPIRES IN",
        "FLAPS",
        "LEADS",
        "ASSIGNED",
    ] {
        assert!(table.stdout.contains(header), "{header}: {}", table.stdout);
    }
    let a_names = names_of("pod-a").join(", ");
    let a_row = table
        .stdout
        .lines()
        .find(|l| l.starts_with("pod-a "))
        .unwrap_or_else(|| panic!("{}", table.stdout));
    assert!(
        a_row.contains(" live ") && a_row.matches(&a_names).count() == 2,
        "{a_row}"
    );
    let c_row = table
        .stdout
        .lines()
        .find(|l| l.starts_with("pod-c "))
        .unwrap();
    // Left: nothing led, nothing assigned.
    let cells: Vec<&str> = c_row.split_whitespace().collect();
    assert!(
        c_row.contains(" left ") && cells.ends_with(&["-", "-"]),
        "{c_row}"
    );

    let json = pgfence(&["status", "--json"], Some(&url)).await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let status: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(status["leases"].as_array().unwrap().len(), 4);
    let groups = status["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1);
    let group = &groups[0];
    assert_eq!(group["group"], json!("prod/g"));
    assert_eq!(group["assignment"], serde_json::to_value(&desired).unwrap());
    assert_eq!(group["mismatched"], json!([]));
    assert_eq!(group["balanced"], json!(true));
    let members = group["members"].as_array().unwrap();
    let states: Vec<(&str, &str)> = members
        .iter()
        .map(|m| (m["member"].as_str().unwrap(), m["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [("pod-a", "live"), ("pod-b", "live"), ("pod-c", "left")]
    );
    for m in members {
        // The row is `pgfence::groups::GroupMember`, with the state and the assigned names beside it.
        let row: GroupMember = serde_json::from_value(m.clone()).unwrap();
        assert_eq!(row.group, "prod/g");
        assert_eq!(m["assigned"], json!(row.leads), "{m}");
        assert_eq!(row.name_count, names.len());
    }
}

/// The command line of a replica against `url`, with its stdout piped (stderr too, checked for the password).
fn replica(args: &[&str], url: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .arg("replica")
        .args(args)
        .env_remove("PGFENCE_CLUSTER")
        .env("DATABASE_URL", url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start pgfence replica")
}

/// Bad input ends a replica with exit 2 and a message before it writes anything: no member row, no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_bad_input_exits_2_and_writes_nothing() {
    let db = TestDb::new().await;
    let url = with_password(&db);
    let cases: &[(&[&str], &str)] = &[
        (&["--member", "m"], "nothing to lead"),
        (
            &["--member", "m", "--controllers", "2", "--weight", "0"],
            "weight",
        ),
        (
            &["--member", "m", "--controllers", "2", "--weight", "1001"],
            "weight",
        ),
        (
            &["--member", "m", "--sharded", "rec", "--shards", "0"],
            "--shards",
        ),
        (
            &["--member", "m", "--sharded", "rec", "--shards", "131073"],
            "--shards",
        ),
        (&["--member", "m", "--sharded", "rec"], "--shards"),
        (
            &["--member", "m", "--controllers", "2", "--pin", "nope"],
            "pin",
        ),
        (&["--member", "m", "--names", "a,a"], "named twice"),
        (&["--member", "m", "--names", "a\u{1b}[2Jb"], "lease name"),
        (&["--member", "pod\u{7}", "--controllers", "1"], "member"),
        (&["--member", "", "--controllers", "1"], "member"),
        (
            &["--member", "m", "--controllers", "1", "--ttl", "50ms"],
            "ttl",
        ),
        (
            &["--member", "m", "--controllers", "131073"],
            "at most 131072",
        ),
        (
            &["--member", "m", "--controllers", "1", "--group", "a\nb"],
            "group",
        ),
        (
            &[
                "--member",
                "m",
                "--controllers",
                "1",
                "--no-spread",
                "--pin",
                "controller-00",
            ],
            "cannot be used",
        ),
        (&["--controllers", "1"], "--member"),
    ];
    for (args, expected) in cases {
        let run = replica(args, &url).wait_with_output().await.unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
        );
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stdout}{stderr}");
        assert!(stdout.is_empty(), "{args:?} printed events: {stdout}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        // A message quoting the input is escaped like every other.
        assert!(
            !stderr.contains('\u{1b}') && !stderr.contains('\u{7}'),
            "{args:?}: {stderr:?}"
        );
        assert!(!stderr.contains(SENTINEL), "{args:?} printed the password");
    }
    for table in ["members", "leases", "tenures"] {
        assert_eq!(
            db.scalar(&format!("SELECT count(*) FROM pgfence.{table}"))
                .await,
            0,
            "pgfence.{table}"
        );
    }
}

/// Reads event lines of a replica until `done` says so (bounded).
async fn events_until(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    events: &mut Vec<serde_json::Value>,
    within: Duration,
    done: impl Fn(&[serde_json::Value]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !done(events) {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(line))) => events.push(
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not an event line ({e}): {line:?}")),
            ),
            Ok(Ok(None)) => break,
            other => panic!("no more events after {within:?} ({other:?}); so far: {events:#?}"),
        }
    }
}

/// A replica joins its group, leads its two controllers (printing `joined`, then `lead` twice), and on SIGTERM
/// stops in order: each callback sees `shutdown`, returns, the leases are released, the group left (the member
/// row stays, not live), and `exit` is the last line of an exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_leads_its_controllers_and_leaves_in_order_on_sigterm() {
    use tokio::io::AsyncBufReadExt;
    let db = TestDb::new().await;
    let url = with_password(&db);
    let started = Instant::now();
    let mut child = replica(
        &[
            "--cluster",
            "c",
            "--group",
            "g",
            "--member",
            "m1",
            "--controllers",
            "2",
            "--ttl",
            "2s",
        ],
        &url,
    );
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut events = Vec::new();
    events_until(&mut lines, &mut events, Duration::from_secs(15), |e| {
        e.iter().filter(|e| e["event"] == "lead").count() == 2
    })
    .await;
    eprintln!(
        "joined and leading 2 names {:?} after the start",
        started.elapsed()
    );
    assert_eq!(events[0]["event"], json!("joined"), "{events:#?}");
    let mut led: Vec<&str> = events[1..]
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    led.sort();
    assert_eq!(led, ["controller-00", "controller-01"]);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.leases WHERE state = 'held' AND holder = 'm1'")
            .await,
        2
    );

    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    events_until(&mut lines, &mut events, Duration::from_secs(15), |_| false).await;
    let exit = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("the replica exits after SIGTERM")
        .unwrap();
    let stderr = {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .await
            .unwrap();
        text
    };
    assert_eq!(exit.code(), Some(0), "{stderr}");
    assert!(!stderr.contains(SENTINEL));

    let of = |kind: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["event"] == kind).collect()
    };
    let stops = of("stop");
    assert_eq!(stops.len(), 2, "{events:#?}");
    assert!(stops.iter().all(|e| e["cause"] == "shutdown"), "{stops:#?}");
    assert_eq!(of("returned").len(), 2, "{events:#?}");
    assert_eq!(
        events.last().unwrap()["event"],
        json!("exit"),
        "{events:#?}"
    );
    for e in &events {
        assert_eq!(e["member"], json!("m1"), "{e}");
        assert!(e["at_us"].as_i64().unwrap() > 1_700_000_000_000_000, "{e}");
    }
    for lead in of("lead") {
        assert!(lead["epoch"].as_i64().unwrap() >= 1, "{lead}");
    }
    assert!(events
        .windows(2)
        .all(|w| w[0]["at_us"].as_i64() <= w[1]["at_us"].as_i64()));
    // Left in order: the row stays, not live, with its leave recorded; nothing is held.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pgfence.group_members \
              WHERE \"group\" = 'c/g' AND member = 'm1' AND NOT live AND left_at IS NOT NULL"
        )
        .await,
        1
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.leases WHERE state = 'held'")
            .await,
        0
    );
}

/// `pgfence demo --scenario spread`: replica processes split six controllers 2/2/2, a fourth takes its share with
/// the minimum moves, a killed one's names go to the survivors after its ttl, overrunning drains are refused once
/// the successor acquired and every refusal is audited; exit 0 with every check held, in well under 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_spread_exits_zero_with_every_check_held() {
    let started = Instant::now();
    let run = pgfence(&["demo", "--scenario", "spread", "--json"], None).await;
    let took = started.elapsed();
    eprintln!("pgfence demo --scenario spread took {took:?}");
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("starting r4") && run.stderr.contains("SIGKILL"),
        "{}",
        run.stderr
    );
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["verdict"], json!(true), "{:#}", report["checks"]);
    assert_eq!(report["scenario"], json!("spread"));
    assert_eq!(report["group"], json!("demo/demo"));
    assert_eq!(report["names"], json!(6));
    let checks = report["checks"].as_array().unwrap();
    assert!(
        checks.len() >= 8 && checks.iter().all(|c| c["held"] == true),
        "{checks:#?}"
    );

    let steps = report["steps"].as_array().unwrap();
    let step: Vec<&str> = steps.iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(step, ["start", "join", "kill"]);
    let counts = |s: &serde_json::Value, at: &str| -> Vec<usize> {
        s[at]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_array().unwrap().len())
            .collect()
    };
    assert_eq!(counts(&steps[0], "after"), [2, 2, 2]);
    // The join: the fewest moves, all to the newcomer, and the group balanced within 1.
    let join = &steps[1];
    assert_eq!(join["moved"], join["after"]["r4"], "{join:#}");
    assert_eq!(
        join["moved"].as_array().unwrap().len() as u64,
        join["minimum_moves"].as_u64().unwrap()
    );
    let after = counts(join, "after");
    assert_eq!(after.iter().sum::<usize>(), 6);
    assert!(
        after.iter().max().unwrap() - after.iter().min().unwrap() <= 1,
        "{after:?}"
    );
    // The kill: exactly the killed replica's names moved; 2/2/2 again.
    let kill = &steps[2];
    let victim = kill["before"]
        .as_object()
        .unwrap()
        .keys()
        .find(|m| !kill["after"].as_object().unwrap().contains_key(*m))
        .unwrap();
    assert_eq!(kill["moved"], kill["before"][victim], "{kill:#}");
    assert_eq!(counts(kill, "after"), [2, 2, 2]);
    assert!(kill["took_ms"].as_u64().unwrap() >= 1000, "{kill:#}");

    // The writes: some refused (the overrunning drains), every one audited, none accepted late.
    let writes = &report["writes"];
    assert!(writes["refused"].as_u64().unwrap() > 0, "{writes}");
    assert_eq!(
        writes["audited"].as_i64(),
        writes["refused"].as_i64(),
        "{writes}"
    );
    assert_eq!(writes["accepted_after_successor"], json!(0));
    // The review of the moved names: the library's own, with a certain overlap proved by a refused write for
    // each name the join moved.
    let reviews = report["reviews"].as_array().unwrap();
    assert!(!reviews.is_empty());
    for name in join["moved"].as_array().unwrap() {
        let review = reviews.iter().find(|r| r["name"] == *name).unwrap();
        let tenures: Vec<TenureReview> = serde_json::from_value(review["tenures"].clone()).unwrap();
        let handed = tenures
            .iter()
            .find(|t| {
                t.tenure.holder != "r4" && t.successor.as_ref().is_some_and(|s| s.holder == "r4")
            })
            .unwrap_or_else(|| panic!("{review:#}"));
        assert!(
            matches!(
                handed.overlap,
                Overlap::Certain {
                    refused_write_at: Some(_)
                }
            ),
            "{:?}",
            handed.overlap
        );
        assert!(!handed.refusals_after_successor.is_empty());
        assert!(tenures.iter().all(|t| t.accepted_after_successor.is_none()));
    }
    assert!(
        report["exits"]
            .as_object()
            .unwrap()
            .values()
            .all(|c| c == 0),
        "{}",
        report["exits"]
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// `pgfence demo --scenario spread` against a given database: its replicas get the URL (with its password) in
/// their environment, work in a fresh cluster, and the human report prints without the password anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_spread_against_a_given_database_prints_the_story_and_verdict() {
    let db = TestDb::new().await;
    let run = pgfence(&["demo", "--scenario", "spread"], Some(&with_password(&db))).await;
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    for expected in [
        "starting r1, r2, r3",
        "r4 took",
        "SIGKILL",
        "Names led per replica, by step",
        "Overlap review of the moved names",
        "CERTAIN (refused write)",
        "every invariant held",
    ] {
        assert!(
            run.stdout.contains(expected),
            "missing {expected:?} in\n{}",
            run.stdout
        );
    }
    assert_eq!(
        db.scalar("SELECT count(DISTINCT \"group\") FROM pgfence.group_members WHERE \"group\" LIKE 'demo-%/demo'")
            .await,
        1
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.group_members WHERE live")
            .await,
        0,
        "every replica left or expired"
    );
}

/// The processes whose environment points them at the server on `port` (the spread demo's replicas get its URL
/// in DATABASE_URL), by /proc.
#[cfg(target_os = "linux")]
fn processes_using_port(port: u16) -> Vec<u32> {
    let needle = format!("@127.0.0.1:{port}/");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&needle))
        })
        .collect()
}

/// Whether `pid` still runs (a zombie, killed and waiting to be reaped, does not).
#[cfg(target_os = "linux")]
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

/// Ctrl-C during the spread demo exits with 130, kills its replica processes and removes the embedded server.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_the_spread_demo_kills_the_replicas_and_removes_the_server() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
        .args(["demo", "--scenario", "spread"])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port = demo_server_port(&mut lines, "starting r4").await;
    let replicas = processes_using_port(port);
    assert!(replicas.len() >= 3, "the replicas run: {replicas:?}");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().await.unwrap();
    assert_eq!(exit.code(), Some(130));
    let deadline = Instant::now() + Duration::from_secs(10);
    while replicas.iter().any(|pid| running(*pid))
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    {
        assert!(
            Instant::now() < deadline,
            "a replica or the embedded server outlived the demo"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads a demo's output up to the line containing `until`, and returns the port of the throwaway server it
/// said it started.
async fn demo_server_port(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    until: &str,
) -> u16 {
    let mut port = None;
    while let Some(line) = lines.next_line().await.unwrap() {
        if let Some(rest) = line.split("PostgreSQL on 127.0.0.1:").nth(1) {
            port = rest
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok());
        }
        if line.contains(until) {
            break;
        }
    }
    port.expect("the demo printed its server's port")
}
