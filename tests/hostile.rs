//! Hostile input, by property tests and by hand, through the public API and straight into the SQL functions:
//! quotes, SQL, NUL, control characters, very long strings, invalid UTF-8 on the wire, JSON nested deep or
//! megabytes large. Every case is a clear typed error (or an SQLSTATE) or a success that stores the data as
//! given — never a panic, never a partial write. Secrets never reach logs, errors or the audit.

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::TestDb;
use pgfence::{Error, Store, StoreConfig};
use proptest::prelude::*;
use serde_json::{json, Value};

const TTL: Duration = Duration::from_secs(60);
const SENTINEL: &str = "Hostile-s3cret-Sentinel";

/// One database and store for all the cases of a property, on a runtime of its own (proptest runs the cases
/// synchronously).
struct Fixture {
    runtime: tokio::runtime::Runtime,
    db: TestDb,
    store: Store,
}

fn fixture() -> Fixture {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (db, store) = runtime.block_on(async {
        let db = TestDb::new().await;
        let store = db.store("hostile").await;
        (db, store)
    });
    Fixture { runtime, db, store }
}

/// Strings that are hostile in different ways: arbitrary Unicode (control characters and NUL included), SQL and
/// quoting, and lengths around the limits.
fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        Just(String::new()),
        Just("'; DROP TABLE pgfence.leases; --".to_owned()),
        Just("\"quoted\" 'single' `back` \\ slash".to_owned()),
        Just("nul\0inside".to_owned()),
        Just("line\nbreak".to_owned()),
        Just("🦀 ünïcødé ✓".to_owned()),
        (190usize..270).prop_map(|n| "x".repeat(n)),
        (1usize..5).prop_map(|n| "é".repeat(100 * n)),
    ]
}

fn counts(f: &Fixture) -> (i64, i64, i64, i64) {
    f.runtime.block_on(async {
        (
            f.db.scalar("SELECT count(*) FROM pgfence.leases").await,
            f.db.scalar("SELECT count(*) FROM pgfence.tasks").await,
            f.db.scalar("SELECT count(*) FROM pgfence.task_events")
                .await,
            f.db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        )
    })
}

fn is_clean_control_free(s: &str, max: usize) -> bool {
    !s.is_empty() && s.chars().count() <= max && !s.chars().any(char::is_control)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Names and holders: valid ones are stored exactly as given (quotes and SQL are data); invalid ones are
    /// `InvalidInput` and write nothing.
    #[test]
    fn lease_names_and_holders_are_data_or_typed_errors(name in hostile_string(), holder in hostile_string()) {
        static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
        let f = F.get_or_init(|| Mutex::new(fixture())).lock().unwrap_or_else(|p| p.into_inner());
        let before = counts(&f);
        let result = f.runtime.block_on(f.store.acquire(&name, &holder, TTL));
        let valid = is_clean_control_free(&name, pgfence::MAX_NAME_LEN)
            && is_clean_control_free(&holder, pgfence::MAX_HOLDER_LEN);
        match result {
            Ok(lease) => {
                prop_assert!(valid, "accepted {name:?}/{holder:?}");
                let status = f.runtime.block_on(f.store.lease_status(&name)).unwrap().unwrap();
                prop_assert_eq!(status.name, format!("hostile/{name}"));
                prop_assert_eq!(status.holder, Some(holder.clone()));
                f.runtime.block_on(f.store.release(&lease)).unwrap();
            }
            Err(Error::InvalidInput { .. }) => {
                prop_assert!(!valid, "refused a valid {name:?}/{holder:?}");
                prop_assert_eq!(counts(&f), before);
            }
            Err(Error::Held { .. }) => prop_assert!(valid),
            Err(other) => prop_assert!(false, "{name:?}/{holder:?}: {other}"),
        }
    }

    /// Task keys, assignees and event kinds through every write: success or `InvalidInput`, and a refusal writes
    /// nothing.
    #[test]
    fn task_keys_assignees_and_kinds_are_data_or_typed_errors(
        key in hostile_string(), assignee in hostile_string(), kind in hostile_string()
    ) {
        static F: OnceLock<Mutex<(Fixture, pgfence::Fence)>> = OnceLock::new();
        let guard = F.get_or_init(|| {
            let f = fixture();
            let fence = f.runtime.block_on(f.store.acquire("tasks", "pod", TTL)).unwrap().fence();
            Mutex::new((f, fence))
        }).lock().unwrap_or_else(|p| p.into_inner());
        let (f, fence) = &*guard;
        let before = counts(f);
        let key_ok = is_clean_control_free(&key, pgfence::MAX_HOLDER_LEN);
        match f.runtime.block_on(f.store.create_task(fence, &key, &json!({"k": key}))) {
            Ok(write) => {
                prop_assert!(key_ok);
                prop_assert_eq!(&write.task.key, &key);
                prop_assert_eq!(&write.task.payload, &json!({"k": key}));
            }
            Err(Error::InvalidInput { .. }) => {
                prop_assert!(!key_ok);
                prop_assert_eq!(counts(f), before);
                return Ok(());
            }
            Err(other) => prop_assert!(false, "{key:?}: {other}"),
        }
        let assignee_ok = is_clean_control_free(&assignee, pgfence::MAX_HOLDER_LEN);
        match f.runtime.block_on(f.store.claim_task(fence, &key, &assignee)) {
            Ok(write) => prop_assert_eq!(write.task.assignee, Some(assignee.clone())),
            Err(Error::InvalidInput { .. }) => prop_assert!(!assignee_ok),
            Err(Error::Conflict { .. }) => {} // claimed by an earlier case with the same key
            Err(other) => prop_assert!(false, "{assignee:?}: {other}"),
        }
        let kind_ok = is_clean_control_free(&kind, pgfence::MAX_KIND_LEN);
        let events_before = counts(f).2;
        match f.runtime.block_on(f.store.append_event(fence, &key, &kind, &json!({}))) {
            Ok(_) => prop_assert!(kind_ok),
            Err(Error::InvalidInput { .. }) => {
                prop_assert!(!kind_ok);
                prop_assert_eq!(counts(f).2, events_before);
            }
            Err(other) => prop_assert!(false, "{kind:?}: {other}"),
        }
    }

    /// Payloads: arbitrary JSON round-trips exactly, or is refused before sending (NUL in a string or key, too
    /// deep, too large) with nothing written.
    #[test]
    fn payloads_round_trip_or_are_refused(payload in arbitrary_json()) {
        static F: OnceLock<Mutex<(Fixture, pgfence::Fence)>> = OnceLock::new();
        let guard = F.get_or_init(|| {
            let f = fixture();
            let fence = f.runtime.block_on(f.store.acquire("payloads", "pod", TTL)).unwrap().fence();
            Mutex::new((f, fence))
        }).lock().unwrap_or_else(|p| p.into_inner());
        let (f, fence) = &*guard;
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let key = format!("p{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let before = counts(f);
        match f.runtime.block_on(f.store.create_task(fence, &key, &payload)) {
            Ok(write) => {
                prop_assert!(!contains_nul(&payload));
                prop_assert_eq!(write.task.payload, payload);
            }
            Err(Error::InvalidInput { .. }) => {
                prop_assert!(contains_nul(&payload));
                prop_assert_eq!(counts(f), before);
            }
            Err(other) => prop_assert!(false, "{other}"),
        }
    }
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e15f64..1e15).prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
        Just(Value::String("nul\0".into())),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// Raw bytes sent as a `text` parameter, bypassing Rust's UTF-8 guarantee: what a client in another language
/// could put on the wire.
#[derive(Debug)]
struct RawText(Vec<u8>);

impl tokio_postgres::types::ToSql for RawText {
    fn to_sql(
        &self,
        _: &tokio_postgres::types::Type,
        out: &mut bytes_buf::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(&self.0);
        Ok(tokio_postgres::types::IsNull::No)
    }
    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::TEXT
    }
    tokio_postgres::types::to_sql_checked!();
}

mod bytes_buf {
    pub(crate) use tokio_postgres::types::private::BytesMut;
}

/// The SQL functions themselves, called by a raw client with hostile arguments: each call succeeds, or fails with
/// a clear SQLSTATE (22023 bad argument, 22021 invalid encoding, 54001 nesting too deep) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_functions_refuse_hostile_arguments_cleanly() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let code = |e: tokio_postgres::Error| {
        e.code()
            .map(|c| c.code().to_owned())
            .unwrap_or_else(|| e.to_string())
    };
    client
        .query_one(
            "SELECT outcome FROM pgfence.acquire('c/l', 'pod', 60000)",
            &[],
        )
        .await
        .unwrap();
    let before = (
        db.scalar("SELECT count(*) FROM pgfence.tasks").await,
        db.scalar("SELECT count(*) FROM pgfence.task_events").await,
    );

    let bad_args: [(&str, &str); 9] = [
        ("SELECT * FROM pgfence.acquire('', 'pod', 1000)", "22023"),
        (
            "SELECT * FROM pgfence.acquire('no-cluster', 'pod', 1000)",
            "22023",
        ),
        (
            "SELECT * FROM pgfence.acquire('c/l2', repeat('h', 300), 1000)",
            "22023",
        ),
        ("SELECT * FROM pgfence.acquire('c/l2', 'pod', -5)", "22023"),
        (
            "SELECT * FROM pgfence.acquire('c/l2', 'pod', 999999999999)",
            "22023",
        ),
        (
            "SELECT * FROM pgfence.create_task('c/l', 0, 'k', '{}')",
            "22023",
        ),
        (
            "SELECT * FROM pgfence.create_task('c/l', 1, NULL, '{}')",
            "22023",
        ),
        (
            "SELECT * FROM pgfence.transition_task('c/l', 1, 'k', 'pending', 'bogus', '{}')",
            "22023",
        ),
        (
            "SELECT * FROM pgfence.renew_many(ARRAY['c/l'], ARRAY[1, 2]::bigint[], 'pod', 1000)",
            "22023",
        ),
    ];
    for (sql, expected) in bad_args {
        let err = client.query(sql, &[]).await.unwrap_err();
        assert_eq!(code(err), expected, "{sql}");
    }
    // NUL cannot be in a PostgreSQL text value; a driver that sends one gets 22021.
    let nul = client
        .query(
            "SELECT * FROM pgfence.create_task('c/l', 1, $1, '{}')",
            &[&"a\0b"],
        )
        .await
        .unwrap_err();
    assert_eq!(code(nul), "22021");
    let invalid_utf8 = client
        .query(
            "SELECT * FROM pgfence.create_task('c/l', 1, $1, '{}')",
            &[&RawText(vec![0x66, 0xff, 0xfe, 0x80])],
        )
        .await
        .unwrap_err();
    assert_eq!(code(invalid_utf8), "22021");
    // JSON nested far deeper than any real payload: the parser refuses it (stack depth).
    let deep = format!("{}1{}", "[".repeat(200_000), "]".repeat(200_000));
    let err = client
        .query(
            "SELECT * FROM pgfence.create_task('c/l', 1, 'deep', $1::text::jsonb)",
            &[&deep],
        )
        .await
        .unwrap_err();
    assert_eq!(code(err), "54001");
    // Megabytes: accepted up to the documented SQL backstop (16 MiB stored), refused beyond it.
    let big = json!({"blob": "x".repeat(2 * 1024 * 1024)}).to_string();
    let row = client
        .query_one(
            "SELECT outcome FROM pgfence.create_task('c/l', 1, 'big', $1::text::jsonb)",
            &[&big],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "ok");
    let huge = json!({"blob": "x".repeat(17 * 1024 * 1024)}).to_string();
    let err = client
        .query(
            "SELECT * FROM pgfence.create_task('c/l', 1, 'huge', $1::text::jsonb)",
            &[&huge],
        )
        .await
        .unwrap_err();
    assert_eq!(code(err), "22023");
    assert_eq!(
        (
            db.scalar("SELECT count(*) FROM pgfence.tasks").await,
            db.scalar("SELECT count(*) FROM pgfence.task_events").await
        ),
        (before.0 + 1, before.1 + 1),
        "only the one valid 2 MiB task was written"
    );
}

/// The library's own payload limits: a megabyte-plus payload and a 100-level nesting are `InvalidInput` before
/// anything is sent; 1 MiB minus a little is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_limits_are_enforced_before_sending() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let fence = store.acquire("l", "pod", TTL).await.unwrap().fence();
    let fits = json!({"blob": "x".repeat(pgfence::MAX_PAYLOAD_BYTES - 100)});
    store.create_task(&fence, "fits", &fits).await.unwrap();
    let too_big = json!({"blob": "x".repeat(pgfence::MAX_PAYLOAD_BYTES)});
    assert!(matches!(
        store.create_task(&fence, "big", &too_big).await,
        Err(Error::InvalidInput { .. })
    ));
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!({ "d": deep });
    }
    assert!(matches!(
        store.create_task(&fence, "deep", &deep).await,
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.tasks").await, 1);
}

/// A writer that collects everything tracing emits, at every level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Secrets: with a password in the connection string (the test server trusts loopback, so it is accepted and
/// ignored), nothing pgfence emits contains it — not the trace-level logs, not an error's Display or Debug, not
/// the configuration's Debug, not JSON output, not the audit rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_never_appears_in_logs_errors_json_or_the_audit() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let db = TestDb::new().await;
    let url = db
        .url
        .replacen("postgres@", &format!("postgres:{SENTINEL}@"), 1);
    let config = StoreConfig::new(url.clone(), "c");
    let mut texts = vec![format!("{config:?}")];
    let store = Store::connect(config).await.unwrap();
    texts.push(format!("{store:?}"));
    let old = store.acquire("l", "pod", TTL).await.unwrap();
    store
        .create_task(&old.fence(), "k", &json!({}))
        .await
        .unwrap();
    store.acquire("l", "pod", TTL).await.unwrap();
    let stale = store
        .create_task(&old.fence(), "k2", &json!({}))
        .await
        .unwrap_err();
    texts.push(format!("{stale} {stale:?}"));
    texts.push(serde_json::to_string(&store.identity().await.unwrap()).unwrap());
    texts.push(
        serde_json::to_string(&store.rejections(&Default::default()).await.unwrap()).unwrap(),
    );

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = Store::connect(StoreConfig::new(
        format!("postgres://app:{SENTINEL}@127.0.0.1:{closed}/db"),
        "c",
    ))
    .await
    .unwrap_err();
    texts.push(format!("{unreachable} {unreachable:?}"));
    let malformed = Store::connect(StoreConfig::new(
        format!("postgres://app:{SENTINEL}@h:x/db"),
        "c",
    ))
    .await
    .unwrap_err();
    texts.push(format!("{malformed} {malformed:?}"));
    let keyword = pgfence::redact(&format!("host=h user=u password={SENTINEL} dbname=d"));
    texts.push(keyword);

    let audit: Vec<String> = db
        .client()
        .await
        .query("SELECT row_to_json(r)::text FROM pgfence.rejections r", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    texts.extend(audit);
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(logs.contains("lease acquired"), "the capture works: {logs}");
    texts.push(logs);
    for text in texts {
        assert!(!text.contains(SENTINEL), "the password leaked: {text}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// TTLs: accepted exactly within [MIN_TTL, MAX_TTL]; anything else is `InvalidInput` with nothing written.
    #[test]
    fn ttls_are_accepted_exactly_within_the_limits(ms in prop_oneof![0u64..200, 86_399_000u64..86_401_000, any::<u64>()]) {
        static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
        let f = F.get_or_init(|| Mutex::new(fixture())).lock().unwrap_or_else(|p| p.into_inner());
        let ttl = Duration::from_millis(ms);
        let before = counts(&f);
        let valid = ttl >= pgfence::MIN_TTL && ttl <= pgfence::MAX_TTL;
        match f.runtime.block_on(f.store.acquire("ttl", "pod", ttl)) {
            Ok(lease) => {
                prop_assert!(valid, "{ttl:?} accepted");
                prop_assert_eq!(lease.ttl(), Duration::from_millis(ms));
                f.runtime.block_on(f.store.release(&lease)).unwrap();
            }
            Err(Error::InvalidInput { field, .. }) => {
                prop_assert!(!valid, "{ttl:?} refused");
                prop_assert_eq!(field, "ttl");
                prop_assert_eq!(counts(&f), before);
            }
            Err(other) => prop_assert!(false, "{ttl:?}: {other}"),
        }
    }

    /// Epochs: `Epoch::new` accepts exactly >= 1; a fence with any issued-or-not epoch is either the current one
    /// (accepted) or refused as stale — superseded below, future above — and audited.
    #[test]
    fn any_epoch_is_current_stale_or_refused_before_sending(value in prop_oneof![any::<i64>(), -3i64..8]) {
        static F: OnceLock<Mutex<(Fixture, i64)>> = OnceLock::new();
        let guard = F.get_or_init(|| {
            let f = fixture();
            let mut current = 0;
            for _ in 0..3 {
                current = f.runtime.block_on(f.store.acquire("epochs", "pod", TTL)).unwrap().epoch().get();
            }
            Mutex::new((f, current))
        }).lock().unwrap_or_else(|p| p.into_inner());
        let (f, current) = (&guard.0, guard.1);
        let epoch = match pgfence::Epoch::new(value) {
            Ok(epoch) => {
                prop_assert!(value >= 1);
                epoch
            }
            Err(Error::InvalidInput { .. }) => {
                prop_assert!(value < 1);
                return Ok(());
            }
            Err(other) => return Err(TestCaseError::fail(other.to_string())),
        };
        let fence = pgfence::Fence::new("hostile/epochs", epoch).unwrap();
        let rejections_before = counts(f).3;
        let key = format!("e{value}");
        match f.runtime.block_on(f.store.create_task(&fence, &key, &json!({}))) {
            Ok(_) => prop_assert_eq!(value, current),
            Err(Error::Stale { reason, .. }) => {
                prop_assert_ne!(value, current);
                let expected = if value < current { pgfence::LossReason::Superseded } else { pgfence::LossReason::FutureEpoch };
                prop_assert_eq!(reason, expected);
                prop_assert!(counts(f).3 >= rejections_before.max(1));
            }
            Err(other) => prop_assert!(false, "{value}: {other}"),
        }
    }

    /// CLI arguments: any combination of words and flags ends with a documented exit code and a message — never
    /// a panic (exit 101) and never a write to a database it was not asked to touch (no URL is given here, so
    /// only `demo` could start one; it is left out).
    #[test]
    fn cli_arguments_end_with_a_documented_exit_code(args in prop::collection::vec(cli_word(), 0..5)) {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_pgfence"))
            .args(&args)
            .env_remove("DATABASE_URL")
            .env("DATABASE_URL", format!("postgres://u:{SENTINEL}@127.0.0.1:1/db"))
            .output()
            .unwrap();
        let code = output.status.code().unwrap_or(-1);
        prop_assert!([0, 1, 2, 3, 4, 5, 6].contains(&code), "{args:?} exited {code}: {}", String::from_utf8_lossy(&output.stderr));
        let all = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        prop_assert!(!all.contains(SENTINEL), "{args:?} printed the password");
        prop_assert!(!all.contains("panicked"), "{args:?}: {all}");
    }
}

fn cli_word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("status".to_owned()),
        Just("audit".to_owned()),
        Just("history".to_owned()),
        Just("identity".to_owned()),
        Just("force-release".to_owned()),
        Just("prune".to_owned()),
        Just("grant".to_owned()),
        Just("--json".to_owned()),
        Just("--yes".to_owned()),
        Just("--lease".to_owned()),
        Just("--limit".to_owned()),
        Just("--since".to_owned()),
        Just("--older-than".to_owned()),
        Just("--connect-timeout".to_owned()),
        Just("--cluster".to_owned()),
        Just("-1".to_owned()),
        Just("0s".to_owned()),
        Just("a/b".to_owned()),
        "[a-z0-9/'\" -]{0,12}",
        any::<String>().prop_filter("no NUL in argv", |s| !s.contains('\0')),
    ]
}
