//! Hostile input, by property tests and by hand, through the public API and straight into the SQL functions:
//! quotes, SQL, NUL, control characters, very long strings, invalid UTF-8 on the wire, JSON nested deep or
//! megabytes large. Every case is a clear typed error (or an SQLSTATE) or a success that stores the data as
//! given — never a panic, never a partial write. Secrets never reach logs, errors or the audit.

use crate::common;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{fixture, TestDb};
use pgfence::{Error, Store, StoreConfig};
use proptest::prelude::*;
use serde_json::{json, Value};

const TTL: Duration = Duration::from_secs(60);
const SENTINEL: &str = "Hostile-s3cret-Sentinel";

/// One database and store for all the cases of a property, on a runtime of its own (proptest runs the cases
/// synchronously), and a raw client for counting rows.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    store: Store,
    client: tokio_postgres::Client,
}

fn fixture() -> Fixture {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (store, client) = runtime.block_on(async {
        let db = TestDb::new().await;
        let store = db.store("hostile").await;
        let client = db.client().await;
        (store, client)
    });
    Fixture {
        runtime,
        store,
        client,
    }
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

/// Rows in (leases, tasks, task_events, rejections).
fn counts(f: &Fixture) -> (i64, i64, i64, i64) {
    let row = f
        .runtime
        .block_on(f.client.query_one(
            "SELECT (SELECT count(*) FROM pgfence.leases), (SELECT count(*) FROM pgfence.tasks), \
                    (SELECT count(*) FROM pgfence.task_events), (SELECT count(*) FROM pgfence.rejections)",
            &[],
        ))
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

fn is_clean_control_free(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.chars().count() <= max
        && !s.chars().any(char::is_control)
        && unicode_normalization::is_nfc(s)
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
        let valid = is_clean_control_free(&name, pgfence::limits::MAX_NAME_LEN)
            && is_clean_control_free(&holder, pgfence::limits::MAX_HOLDER_LEN);
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
        let key_ok = is_clean_control_free(&key, pgfence::limits::MAX_HOLDER_LEN);
        match f.runtime.block_on(f.store.tasks().create(fence, &key, &json!({"k": key}))) {
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
        let assignee_ok = is_clean_control_free(&assignee, pgfence::limits::MAX_HOLDER_LEN);
        let before = counts(f);
        match f.runtime.block_on(f.store.tasks().claim(fence, &key, &assignee)) {
            Ok(write) => {
                prop_assert!(assignee_ok, "accepted the assignee {assignee:?}");
                prop_assert_eq!(write.task.assignee, Some(assignee.clone()));
                let stored = f.runtime.block_on(f.store.tasks().get("tasks", &key)).unwrap().unwrap();
                prop_assert_eq!(stored.assignee, Some(assignee.clone()));
            }
            Err(Error::InvalidInput { .. }) => {
                prop_assert!(!assignee_ok, "refused the assignee {assignee:?}");
                prop_assert_eq!(counts(f), before);
            }
            // Claimed by an earlier case with the same key; an invalid assignee never reaches the database.
            Err(Error::Conflict { .. }) => {
                prop_assert!(assignee_ok, "sent the assignee {assignee:?}");
                prop_assert_eq!(counts(f), before);
            }
            Err(other) => prop_assert!(false, "{assignee:?}: {other}"),
        }
        let kind_ok = is_clean_control_free(&kind, pgfence::limits::MAX_KIND_LEN);
        let before = counts(f);
        match f.runtime.block_on(f.store.tasks().append_event(fence, &key, &kind, &json!({}))) {
            Ok(_) => {
                prop_assert!(kind_ok, "accepted the kind {kind:?}");
                let events = f.runtime.block_on(f.store.tasks().events("tasks", &key)).unwrap();
                prop_assert_eq!(&events.last().unwrap().kind, &kind);
                prop_assert_eq!(counts(f), (before.0, before.1, before.2 + 1, before.3));
            }
            Err(Error::InvalidInput { .. }) => {
                prop_assert!(!kind_ok, "refused the kind {kind:?}");
                prop_assert_eq!(counts(f), before);
            }
            Err(other) => prop_assert!(false, "{kind:?}: {other}"),
        }
    }

    /// Payloads through every write that carries one (create_task, append_event, transition_task): arbitrary
    /// JSON, JSON nested around the depth limit and JSON sized around the size limit. Within the limits a payload
    /// is accepted and stored exactly (read back from the task row and its event); beyond them — NUL in a string
    /// or key, more than `MAX_PAYLOAD_DEPTH` levels, more than `MAX_PAYLOAD_BYTES` serialized — it is
    /// `InvalidInput` for "payload" before anything is sent, and nothing is written.
    #[test]
    fn payloads_round_trip_or_are_refused(payload in any_payload(), write in payload_write()) {
        static F: OnceLock<Mutex<(Fixture, pgfence::Fence)>> = OnceLock::new();
        let guard = F.get_or_init(|| {
            let f = fixture();
            let fence = f.runtime.block_on(f.store.acquire("payloads", "pod", TTL)).unwrap().fence();
            Mutex::new((f, fence))
        }).lock().unwrap_or_else(|p| p.into_inner());
        let (f, fence) = &*guard;
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let key = format!("p{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let within = within_limits(&payload);
        if write != PayloadWrite::Create {
            f.runtime.block_on(f.store.tasks().create(fence, &key, &json!({}))).unwrap();
        }
        let before = counts(f);
        let result = (f.runtime.block_on(write.run(&f.store, fence, &key, &payload)), before);
        match result {
            (Ok(written), before) => {
                prop_assert!(within, "accepted a payload beyond the limits ({} levels, {} bytes)",
                    levels(&payload), serialized_len(&payload));
                let (stored, event) = f.runtime.block_on(write.read_back(&f.store, "payloads", &key));
                if write == PayloadWrite::Create {
                    prop_assert_eq!(&written.task.payload, &payload);
                    prop_assert_eq!(&stored, &payload);
                }
                prop_assert_eq!(&event, &payload);
                let (tasks, events) = (u64::from(write == PayloadWrite::Create), 1);
                prop_assert_eq!(counts(f), (before.0, before.1 + tasks as i64, before.2 + events, before.3));
            }
            (Err(Error::InvalidInput { field: "payload", .. }), before) => {
                prop_assert!(!within, "refused a payload within the limits ({} levels, {} bytes)",
                    levels(&payload), serialized_len(&payload));
                prop_assert_eq!(counts(f), before);
            }
            (Err(other), _) => prop_assert!(false, "{write:?}: {other}"),
        }
    }
}

/// The writes that carry a payload. Append and transition write to a task created just before (with `{}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PayloadWrite {
    Create,
    Append,
    Transition,
}

fn payload_write() -> impl Strategy<Value = PayloadWrite> {
    prop_oneof![
        Just(PayloadWrite::Create),
        Just(PayloadWrite::Append),
        Just(PayloadWrite::Transition),
    ]
}

impl PayloadWrite {
    async fn run(
        self,
        store: &Store,
        fence: &pgfence::Fence,
        key: &str,
        payload: &Value,
    ) -> pgfence::Result<pgfence::tasks::TaskWrite> {
        match self {
            PayloadWrite::Create => store.tasks().create(fence, key, payload).await,
            PayloadWrite::Append => {
                store
                    .tasks()
                    .append_event(fence, key, "edge", payload)
                    .await
            }
            PayloadWrite::Transition => {
                let pending = pgfence::tasks::TaskState::Pending;
                store
                    .tasks()
                    .transition(fence, key, pending, pending, payload)
                    .await
            }
        }
    }

    /// What is stored, read back through the library: the task row's payload and the payload of the task's
    /// latest event (the `created` event for a create), which must be of this write's kind.
    async fn read_back(self, store: &Store, lease: &str, key: &str) -> (Value, Value) {
        let task = store
            .tasks()
            .get(lease, key)
            .await
            .unwrap()
            .expect("the task");
        let mut events = store.tasks().events(lease, key).await.unwrap();
        let event = events.pop().expect("an event");
        let kind = match self {
            PayloadWrite::Create => "created",
            PayloadWrite::Append => "edge",
            PayloadWrite::Transition => "pending",
        };
        assert_eq!(event.kind, kind);
        (task.payload, event.payload)
    }
}

/// Every kind of hostile payload: arbitrary JSON (shallow, any Unicode, NUL sometimes), JSON nested around the
/// depth limit, JSON sized around the size limit.
fn any_payload() -> impl Strategy<Value = Value> {
    // Megabyte cases are the slow ones: a fifth of the cases (the edges test covers every write at both edges).
    prop_oneof![
        2 => arbitrary_json(),
        2 => nested_around_the_depth_limit(),
        1 => sized_around_the_size_limit(),
    ]
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

/// JSON nested `MAX_PAYLOAD_DEPTH - 3` to `MAX_PAYLOAD_DEPTH + 2` wrappers deep — arrays and objects in any
/// order, keys of any Unicode but NUL, shallow siblings on the way — around a leaf that is a scalar, an empty
/// container or shallow JSON: the depth limit from both sides, 0 to 3 levels away.
fn nested_around_the_depth_limit() -> impl Strategy<Value = Value> {
    let max = pgfence::limits::MAX_PAYLOAD_DEPTH;
    let shallow = || {
        prop_oneof![
            Just(json!(1)),
            Just(json!("s")),
            Just(json!([])),
            Just(json!({})),
            Just(json!([[2]])),
            Just(json!({"a": {"b": null}})),
        ]
    };
    let wrapper = (
        any::<bool>(),
        "[^\\x00]{0,6}",
        prop::option::weighted(0.2, shallow()),
    );
    // Exactly at the limit and one over it most often.
    let count = prop_oneof![Just(max), Just(max + 1), max - 3..=max + 2];
    let wrappers = count.prop_flat_map(move |n| prop::collection::vec(wrapper.clone(), n));
    (wrappers, shallow()).prop_map(|(wrappers, leaf)| {
        wrappers
            .into_iter()
            .fold(leaf, |inner, (array, key, sibling)| {
                if array {
                    Value::Array(std::iter::once(inner).chain(sibling).collect())
                } else {
                    let mut map = serde_json::Map::new();
                    if let Some(sibling) = sibling {
                        map.insert(format!("{key}~"), sibling);
                    }
                    map.insert(key, inner);
                    Value::Object(map)
                }
            })
    })
}

/// JSON of `MAX_PAYLOAD_BYTES - 3` to `MAX_PAYLOAD_BYTES + 3` bytes serialized: a string of ASCII, multi-byte
/// UTF-8 or characters JSON escapes (a quote, a backslash, a control character written `\u0001`), or an array of
/// zeros (the payload that grows most when stored as jsonb, about 6×): the size limit from both sides.
fn sized_around_the_size_limit() -> impl Strategy<Value = Value> {
    let max = pgfence::limits::MAX_PAYLOAD_BYTES;
    let filler = prop_oneof![
        Just('x'),
        Just('é'),
        Just('🦀'),
        Just('"'),
        Just('\\'),
        Just('\u{1}'),
    ];
    // Exactly at the limit and one over it most often.
    let size = prop_oneof![Just(max), Just(max + 1), max - 3..=max + 3];
    (size, prop::option::weighted(0.8, filler)).prop_map(|(size, filler)| match filler {
        Some(filler) => blob_of(size, filler),
        None => zeros_of(size),
    })
}

/// `{"blob": "…"}` of exactly `size` bytes serialized, the string made of `filler` (padded with `x`).
fn blob_of(size: usize, filler: char) -> Value {
    let empty = serialized_len(&json!({"blob": ""}));
    let width = serialized_len(&json!(filler.to_string())) - 2;
    let n = (size - empty) / width;
    let blob: String = std::iter::repeat_n(filler, n)
        .chain(std::iter::repeat_n('x', size - empty - n * width))
        .collect();
    let value = json!({ "blob": blob });
    assert_eq!(serialized_len(&value), size);
    value
}

/// `[0,0,…,0]` (one `10` when needed) of exactly `size` bytes serialized.
fn zeros_of(size: usize) -> Value {
    let mut items = vec![json!(0); (size - 1) / 2];
    if size.is_multiple_of(2) {
        items[0] = json!(10);
    }
    let value = Value::Array(items);
    assert_eq!(serialized_len(&value), size);
    value
}

/// `width` containers nested, arrays or objects (key "d") as `arrays` says, around `leaf`.
fn nest(width: usize, arrays: bool, leaf: Value) -> Value {
    (0..width).fold(leaf, |inner, _| {
        if arrays {
            json!([inner])
        } else {
            json!({ "d": inner })
        }
    })
}

fn serialized_len(value: &Value) -> usize {
    serde_json::to_vec(value).unwrap().len()
}

/// How deep a payload is nested, as the limit counts it: the most containers around any one value. `[[1]]`
/// and `[[[]]]` are 2 levels (the innermost `[]` is a value, like `1`).
fn levels(value: &Value) -> usize {
    match value {
        Value::Array(items) => items.iter().map(|v| 1 + levels(v)).max().unwrap_or(0),
        Value::Object(map) => map.values().map(|v| 1 + levels(v)).max().unwrap_or(0),
        _ => 0,
    }
}

/// Within the library's limits: no NUL, at most `MAX_PAYLOAD_DEPTH` levels, at most `MAX_PAYLOAD_BYTES`.
fn within_limits(value: &Value) -> bool {
    !contains_nul(value)
        && levels(value) <= pgfence::limits::MAX_PAYLOAD_DEPTH
        && serialized_len(value) <= pgfence::limits::MAX_PAYLOAD_BYTES
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

/// A driver error's SQLSTATE, or its message when the server sent none.
fn code(e: tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_owned())
        .unwrap_or_else(|| e.to_string())
}

/// Arguments out of range or missing (an empty or cluster-less name, a huge holder, a ttl out of range, epoch 0,
/// a NULL key, an unknown state, arrays of different lengths, a repeated or NULL name of a group) are 22023
/// naming the argument in the error's COLUMN field, through `client` (holding `c/l`); the same refusal through
/// the library's pool becomes `Error::InvalidInput` for that argument.
async fn bad_arguments_are_22023(db: &TestDb, client: &tokio_postgres::Client) {
    let bad_args: [(&str, &str); 13] = [
        ("SELECT * FROM pgfence.acquire('', 'pod', 1000)", "lease"),
        (
            "SELECT * FROM pgfence.acquire('no-cluster', 'pod', 1000)",
            "lease",
        ),
        (
            "SELECT * FROM pgfence.acquire('c/l2', repeat('h', 300), 1000)",
            "holder",
        ),
        ("SELECT * FROM pgfence.acquire('c/l2', 'pod', -5)", "ttl"),
        (
            "SELECT * FROM pgfence.acquire('c/l2', 'pod', 999999999999)",
            "ttl",
        ),
        (
            "SELECT * FROM pgfence.create_task('c/l', 0, current_setting('test.secret'), 'k', '{}')",
            "epoch",
        ),
        (
            "SELECT * FROM pgfence.create_task('c/l', 1, current_setting('test.secret'), NULL, '{}')",
            "task key",
        ),
        (
            "SELECT * FROM pgfence.transition_task('c/l', 1, current_setting('test.secret'), 'k', 'pending', 'bogus', '{}')",
            "state",
        ),
        (
            "SELECT * FROM pgfence.renew_many(ARRAY['c/l'], ARRAY[1, 2]::bigint[], ARRAY['x'], 1000)",
            "leases",
        ),
        ("SELECT * FROM pgfence.renew('c/l', 1, NULL, 1000)", "secret"),
        (
            "SELECT * FROM pgfence.join_group('c/g', 'm', 1, ARRAY['a', 'a'], '{}', '{}', 1000)",
            "names",
        ),
        (
            "SELECT * FROM pgfence.join_group('c/g', 'm', 1, ARRAY['a', NULL], '{}', '{}', 1000)",
            "name",
        ),
        (
            "SELECT * FROM pgfence.fence('c/l', 1, current_setting('test.secret'), '', NULL, NULL)",
            "operation",
        ),
    ];
    let store = db.store("c").await;
    let mut conn = store.admin().conn().await.unwrap();
    for (sql, column) in bad_args {
        let err = client.query(sql, &[]).await.unwrap_err();
        let db_error = err.as_db_error().unwrap_or_else(|| panic!("{sql}: {err}"));
        assert_eq!(db_error.code().code(), "22023", "{sql}: {err}");
        assert_eq!(db_error.column(), Some(column), "{sql}: {err}");
        // The library reads the same field: InvalidInput for that argument, with the server's reason.
        let secret: String = client
            .query_one("SELECT current_setting('test.secret')", &[])
            .await
            .unwrap()
            .get(0);
        let through_pool = diesel_async::RunQueryDsl::execute(
            diesel::sql_query(
                sql.replace("current_setting('test.secret')", &format!("'{secret}'")),
            ),
            &mut conn,
        )
        .await
        .unwrap_err();
        match pgfence::Error::from(through_pool) {
            pgfence::Error::InvalidInput { field, .. } => assert_eq!(field, column, "{sql}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

/// Text that is no text (NUL, invalid UTF-8) is 22021; JSON nested far deeper than any real payload is 54001
/// from the server's parser, while `MAX_PAYLOAD_DEPTH` levels written through SQL are stored exactly and read
/// back through the library. Writes the task `deep-ok` of `c/l`.
async fn bad_text_and_deep_json_are_refused_and_the_depth_limit_is_stored(
    db: &TestDb,
    client: &tokio_postgres::Client,
) {
    // NUL cannot be in a PostgreSQL text value; a driver that sends one gets 22021.
    let nul = client
        .query(
            "SELECT * FROM pgfence.create_task('c/l', 1, current_setting('test.secret'), $1, '{}')",
            &[&"a\0b"],
        )
        .await
        .unwrap_err();
    assert_eq!(code(nul), "22021");
    let invalid_utf8 = client
        .query(
            "SELECT * FROM pgfence.create_task('c/l', 1, current_setting('test.secret'), $1, '{}')",
            &[&RawText(vec![0x66, 0xff, 0xfe, 0x80])],
        )
        .await
        .unwrap_err();
    assert_eq!(code(invalid_utf8), "22021");
    // JSON nested far deeper than any real payload: the server's parser refuses it (stack depth) before any
    // function runs. The SQL functions have no nesting limit of their own; `MAX_PAYLOAD_DEPTH` levels written
    // through SQL are stored exactly and read back through the library.
    let deep = format!("{}1{}", "[".repeat(200_000), "]".repeat(200_000));
    let err = client
        .query(
            "SELECT * FROM pgfence.create_task('c/l', 1, current_setting('test.secret'), 'deep', $1::text::jsonb)",
            &[&deep],
        )
        .await
        .unwrap_err();
    assert_eq!(code(err), "54001");
    let at_the_limit = nest(pgfence::limits::MAX_PAYLOAD_DEPTH, true, json!("deepest"));
    let row = client
        .query_one(
            "SELECT outcome FROM pgfence.create_task('c/l', 1, current_setting('test.secret'), 'deep-ok', $1::text::jsonb)",
            &[&at_the_limit.to_string()],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "ok");
    let read = db
        .store("c")
        .await
        .tasks()
        .get("l", "deep-ok")
        .await
        .unwrap();
    assert_eq!(read.unwrap().payload, at_the_limit);
}

/// The SQL backstop exactly at its edge: a payload of 16 MiB stored (`pg_column_size` of the jsonb) is accepted
/// and stored exactly; one byte more is 22023 from every function that takes a payload, with nothing written.
/// Writes the task `edge` of `c/l` (and its created event) only.
async fn the_sql_payload_backstop_holds_at_its_edge(client: &tokio_postgres::Client) {
    const BACKSTOP: i64 = 16 * 1024 * 1024;
    let stored_size = |n: i64| async move {
        client
                .query_one(
                    "SELECT pg_column_size(jsonb_build_object('blob', repeat('x', $1::bigint::int)))::bigint",
                    &[&n],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
    };
    let n = BACKSTOP - (stored_size(1000).await - 1000);
    assert_eq!(
        (stored_size(n).await, stored_size(n + 1).await),
        (BACKSTOP, BACKSTOP + 1)
    );
    let blob = |n: i64| json!({ "blob": "x".repeat(n as usize) }).to_string();
    let (fits, over) = (blob(n), blob(n + 1));
    let err = client
        .query(
            "SELECT * FROM pgfence.create_task('c/l', 1, current_setting('test.secret'), 'edge-over', $1::text::jsonb)",
            &[&over],
        )
        .await
        .unwrap_err();
    assert_eq!(code(err), "22023", "create_task one byte over the backstop");
    let row = client
        .query_one(
            "SELECT outcome FROM pgfence.create_task('c/l', 1, current_setting('test.secret'), 'edge', $1::text::jsonb)",
            &[&fits],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "ok");
    let stored = client
        .query_one(
            "SELECT t.payload->>'blob' = repeat('x', $1::bigint::int), \
                    (SELECT array_agg(k) FROM jsonb_object_keys(t.payload) k) = ARRAY['blob'], \
                    (SELECT e.payload = t.payload FROM pgfence.task_events e WHERE e.task_id = t.id) \
               FROM pgfence.tasks t WHERE t.lease = 'c/l' AND t.key = 'edge'",
            &[&n],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            stored.get::<_, bool>(0),
            stored.get::<_, bool>(1),
            stored.get::<_, bool>(2)
        ),
        (true, true, true),
        "the 16 MiB payload is stored exactly, in the task and its created event"
    );
    for call in [
        "append_event('c/l', 1, current_setting('test.secret'), 'edge', 'k', $1::text::jsonb)",
        "transition_task('c/l', 1, current_setting('test.secret'), 'edge', 'pending', 'pending', $1::text::jsonb)",
    ] {
        let err = client
            .query(&format!("SELECT * FROM pgfence.{call}"), &[&over])
            .await
            .unwrap_err();
        assert_eq!(code(err), "22023", "{call} one byte over the backstop");
    }
    let edge_task = client
        .query_one(
            "SELECT state, version, (SELECT count(*) FROM pgfence.task_events e WHERE e.task_id = t.id) \
               FROM pgfence.tasks t WHERE t.lease = 'c/l' AND t.key = 'edge'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            edge_task.get::<_, String>(0),
            edge_task.get::<_, i64>(1),
            edge_task.get::<_, i64>(2)
        ),
        ("pending".to_owned(), 1, 1),
        "the refused append and transition left the task as it was"
    );
}

/// The SQL functions themselves, called by a raw client with hostile arguments: each call succeeds, or fails with
/// a clear SQLSTATE (22023 bad argument, 22021 invalid encoding, 54001 nesting too deep) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_functions_refuse_hostile_arguments_cleanly() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // The tenure's secret, kept in a session setting so that the statements below can name it.
    client
        .query_one(
            "SELECT set_config('test.secret', secret, false) FROM pgfence.acquire('c/l', 'pod', 60000)",
            &[],
        )
        .await
        .unwrap();
    let before = (
        db.scalar("SELECT count(*) FROM pgfence.tasks").await,
        db.scalar("SELECT count(*) FROM pgfence.task_events").await,
    );

    bad_arguments_are_22023(&db, &client).await;
    bad_text_and_deep_json_are_refused_and_the_depth_limit_is_stored(&db, &client).await;
    the_sql_payload_backstop_holds_at_its_edge(&client).await;
    assert_eq!(
        (
            db.scalar("SELECT count(*) FROM pgfence.tasks").await,
            db.scalar("SELECT count(*) FROM pgfence.task_events").await
        ),
        (before.0 + 2, before.1 + 2),
        "only the two valid tasks (64 levels, 16 MiB) and their created events were written"
    );
}

/// The library's payload limits exactly at their edges, through every write that carries a payload: exactly
/// `MAX_PAYLOAD_DEPTH` levels (arrays, objects, a string leaf) and exactly `MAX_PAYLOAD_BYTES` serialized
/// (ASCII, multi-byte UTF-8, escaped characters, and `[0,0,…]`, which grows about 6× as jsonb and still stays
/// under the 16 MiB SQL backstop) are accepted and stored exactly; one more level or one more byte is
/// `InvalidInput` for "payload" before anything is sent, and nothing is written — no task, no event, the task
/// row unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_limits_hold_exactly_at_their_edges() {
    use pgfence::limits::{MAX_PAYLOAD_BYTES as BYTES, MAX_PAYLOAD_DEPTH as DEPTH};
    // The edges below are built from the constants; these are the limits docs/security.md promises.
    assert_eq!(
        (BYTES, DEPTH),
        (1 << 20, 64),
        "the documented payload limits"
    );
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let fence = store.acquire("l", "pod", TTL).await.unwrap().fence();
    let edges: [(&str, Value, Value); 7] = [
        (
            "nested arrays",
            nest(DEPTH, true, json!(1)),
            nest(DEPTH + 1, true, json!(1)),
        ),
        (
            "nested objects",
            nest(DEPTH, false, json!(null)),
            nest(DEPTH + 1, false, json!(null)),
        ),
        (
            "mixed nesting",
            nest(DEPTH / 2, true, nest(DEPTH / 2, false, json!("leaf"))),
            nest(DEPTH / 2 + 1, true, nest(DEPTH / 2, false, json!("leaf"))),
        ),
        (
            "an ASCII string",
            blob_of(BYTES, 'x'),
            blob_of(BYTES + 1, 'x'),
        ),
        (
            "a multi-byte string",
            blob_of(BYTES, '🦀'),
            blob_of(BYTES + 1, '🦀'),
        ),
        (
            "an escaped string",
            blob_of(BYTES, '\u{1}'),
            blob_of(BYTES + 1, '\u{1}'),
        ),
        ("an array of zeros", zeros_of(BYTES), zeros_of(BYTES + 1)),
    ];
    let client = db.client().await;
    let mut n = 0;
    for (what, fits, over) in &edges {
        // The fixtures themselves sit exactly at the edges.
        assert!(within_limits(fits) && !within_limits(over), "{what}");
        assert!(
            (levels(fits) == DEPTH && levels(over) == DEPTH + 1)
                || (serialized_len(fits) == BYTES && serialized_len(over) == BYTES + 1),
            "{what}"
        );
        for write in [
            PayloadWrite::Create,
            PayloadWrite::Append,
            PayloadWrite::Transition,
        ] {
            n += 1;
            let key = format!("k{n}");
            if write != PayloadWrite::Create {
                store
                    .tasks()
                    .create(&fence, &key, &json!({}))
                    .await
                    .unwrap();
            }
            let row = "SELECT fence, version, state::text, payload::text FROM pgfence.tasks WHERE key = $1";
            let task_row = |rows: Vec<tokio_postgres::Row>| -> Vec<(i64, i64, String, String)> {
                rows.iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                    .collect()
            };
            let before = (
                db.scalar("SELECT count(*) FROM pgfence.tasks").await,
                db.scalar("SELECT count(*) FROM pgfence.task_events").await,
                task_row(client.query(row, &[&key]).await.unwrap()),
            );
            let refused = write.run(&store, &fence, &key, over).await;
            assert!(
                matches!(
                    refused,
                    Err(Error::InvalidInput {
                        field: "payload",
                        ..
                    })
                ),
                "{what} one over the edge through {write:?}: {refused:?}"
            );
            let after = (
                db.scalar("SELECT count(*) FROM pgfence.tasks").await,
                db.scalar("SELECT count(*) FROM pgfence.task_events").await,
                task_row(client.query(row, &[&key]).await.unwrap()),
            );
            assert_eq!(after, before, "{what} through {write:?}: nothing written");

            let written = write.run(&store, &fence, &key, fits).await;
            let written =
                written.unwrap_or_else(|e| panic!("{what} at the edge through {write:?}: {e}"));
            let (stored, event) = write.read_back(&store, "l", &key).await;
            if write == PayloadWrite::Create {
                assert!(&written.task.payload == fits, "{what}: returned as given");
                assert!(&stored == fits, "{what}: stored as given");
            }
            assert!(
                &event == fits,
                "{what} through {write:?}: the event stored as given"
            );
        }
    }
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

/// Secrets: with a password in the connection string (the embedded server's own; on a server that asks for
/// none, a sentinel it ignores), nothing pgfence emits contains it — not the trace-level logs and the fields of
/// their spans (of every thread of the runtime, the workers included), not an error's Display or Debug, not the
/// configuration's Debug, not JSON output, not the audit rows. Nor does any of it contain a tenure secret,
/// though every operation's span names its lease and epoch.
#[test]
fn no_password_or_tenure_secret_appears_in_logs_spans_errors_json_or_the_audit() {
    let captured = Captured::default();
    let sink = captured.clone();
    let capture = tracing::Dispatch::new(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            // Every span once, when it closes, with every field it recorded.
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .with_writer(move || sink.clone())
            .finish(),
    );
    // With a single registered dispatcher, tracing caches a callsite's interest from the default of whichever
    // thread reaches it first: a log line first reached by another test's thread would be cached as never
    // enabled, and silently missing here. A second one makes it ask every registered dispatcher.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let _main = tracing::dispatcher::set_default(&capture);
    let worker = capture.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&worker)))
        .build()
        .unwrap();
    runtime.block_on(the_password_never_appears(captured));
}

async fn the_password_never_appears(captured: Captured) {
    let db = TestDb::new().await;
    let (url, password) = common::url_with_password(&db.url, SENTINEL);
    let config = StoreConfig::new(url.clone(), "c");
    let mut texts = vec![format!("{config:?}")];
    let store = Store::connect(config).await.unwrap();
    // Every callsite's interest recomputed now that both dispatchers exist (a registration racing with their
    // creation could have cached "never").
    tracing::callsite::rebuild_interest_cache();
    texts.push(format!("{store:?}"));
    let mut old = store.acquire("l", "pod", TTL).await.unwrap();
    let mut secrets = vec![old.fence().secret().expose_secret().to_owned()];
    store
        .tasks()
        .create(&old.fence(), "k", &json!({}))
        .await
        .unwrap();
    store.renew(&mut old).await.unwrap();
    store
        .fenced(&old.fence(), "noop", async |conn| {
            use diesel_async::RunQueryDsl;
            diesel::sql_query("SELECT 1").execute(conn).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    // On a worker thread: its logs are captured too.
    let on_a_worker = store.clone();
    let new = tokio::spawn(async move { on_a_worker.acquire("l", "pod", TTL).await.unwrap() })
        .await
        .unwrap();
    secrets.push(new.fence().secret().expose_secret().to_owned());
    let stale = store
        .tasks()
        .create(&old.fence(), "k2", &json!({}))
        .await
        .unwrap_err();
    texts.push(format!("{stale} {stale:?}"));
    texts.push(serde_json::to_string(&store.admin().identity().await.unwrap()).unwrap());
    texts.push(
        serde_json::to_string(&store.admin().rejections(&Default::default()).await.unwrap())
            .unwrap(),
    );

    let closed = common::unused_port();
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
    let keyword =
        pgfence::connection::redact(&format!("host=h user=u password={SENTINEL} dbname=d"));
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
    assert_eq!(
        audit.len(),
        1,
        "the stale write's audit row is among the texts checked"
    );
    texts.extend(audit);
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert_eq!(
        logs.matches("lease acquired").count(),
        2,
        "the capture works, on the test's thread and on a worker: {logs}"
    );
    for span in [
        "acquire{lease=c/l holder=\"pod\"}",
        "create_task{lease=\"c/l\" epoch=1 key=\"k\"}",
        "renew{lease=c/l epoch=1}",
        "fenced{lease=\"c/l\" epoch=1 operation=\"noop\"}",
        "create_task{lease=\"c/l\" epoch=1 key=\"k2\"}",
    ] {
        assert!(logs.contains(span), "no span {span} in {logs}");
    }
    texts.push(logs);
    for text in texts {
        assert!(
            !text.contains(SENTINEL) && !text.contains(&password),
            "the password leaked: {text}"
        );
        for secret in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "a tenure secret leaked: {text}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// TTLs: accepted exactly within [MIN_TTL, MAX_TTL]; anything else is `InvalidInput` with nothing written.
    /// Each edge and its neighbour outside is drawn in one case in seven (all four in practically every
    /// run of 64 cases): a range alone reaches an exact millisecond too rarely to pin an off-by-one.
    #[test]
    fn ttls_are_accepted_exactly_within_the_limits(ms in prop_oneof![
        Just(100u64), Just(99), Just(86_400_000), Just(86_400_001),
        0u64..200, 86_399_000u64..86_401_000, any::<u64>(),
    ]) {
        static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
        let f = F.get_or_init(|| Mutex::new(fixture())).lock().unwrap_or_else(|p| p.into_inner());
        let ttl = Duration::from_millis(ms);
        let before = counts(&f);
        let valid = ttl >= pgfence::limits::MIN_TTL && ttl <= pgfence::limits::MAX_TTL;
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
    /// (accepted, nothing audited) or refused as stale — superseded below, future above — and audited: after
    /// every case the audit holds exactly one tenure-scope row per refused issued epoch, with the count of its
    /// refusals so far, the first refusal's reason and the current epoch, and one role-scope row for every
    /// future epoch together (no tenure explains those: a flood of them costs one row).
    #[test]
    fn any_epoch_is_current_stale_or_refused_before_sending(value in prop_oneof![any::<i64>(), -3i64..8]) {
        static F: OnceLock<Mutex<(Fixture, pgfence::Fence, Refusals)>> = OnceLock::new();
        let mut guard = F.get_or_init(|| {
            let f = fixture();
            let lease = fixture::lease(&f.store, "epochs").holder("pod").ttl(TTL).epoch(3);
            let fence = f.runtime.block_on(lease.into_future()).fence();
            Mutex::new((f, fence, HashMap::new()))
        }).lock().unwrap_or_else(|p| p.into_inner());
        let (f, current_fence, refused) = &mut *guard;
        let current = current_fence.epoch().get();
        match pgfence::Epoch::new(value) {
            Ok(_) => {
                prop_assert!(value >= 1);
                let fence = if value == current {
                    current_fence.clone()
                } else {
                    common::forged_fence("hostile/epochs", value)
                };
                let key = format!("e{value}");
                match f.runtime.block_on(f.store.tasks().create(&fence, &key, &json!({}))) {
                    Ok(_) => prop_assert_eq!(value, current),
                    Err(Error::Stale { reason, presented, current: said_current, operation, .. }) => {
                        prop_assert_ne!(value, current);
                        let expected = if value < current {
                            pgfence::LossReason::Superseded
                        } else {
                            pgfence::LossReason::FutureEpoch
                        };
                        prop_assert_eq!(reason, expected);
                        prop_assert_eq!((presented.get(), said_current.map(|e| e.get())), (value, Some(current)));
                        prop_assert_eq!(operation, "create_task");
                        refused.entry(value).or_insert((0, expected.as_str())).0 += 1;
                    }
                    Err(other) => prop_assert!(false, "{value}: {other}"),
                }
            }
            Err(Error::InvalidInput { .. }) => prop_assert!(value < 1),
            Err(other) => return Err(TestCaseError::fail(other.to_string())),
        }
        let audit: HashMap<i64, (i64, String, Option<i64>, String)> = f
            .runtime
            .block_on(f.client.query(
                "SELECT presented_epoch, count, reason, current_epoch, operation FROM pgfence.rejections \
                  WHERE scope = 'tenure' AND lease = 'hostile/epochs'",
                &[],
            ))
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3), r.get(4))))
            .collect();
        let expected: HashMap<i64, (i64, String, Option<i64>, String)> = refused
            .iter()
            .filter(|(epoch, _)| **epoch < current)
            .map(|(epoch, (count, reason))| {
                (*epoch, (*count, (*reason).to_owned(), Some(current), "create_task".to_owned()))
            })
            .collect();
        prop_assert_eq!(audit, expected);
        let future: i64 = refused.iter().filter(|(epoch, _)| **epoch > current).map(|(_, (n, _))| *n).sum();
        let role_rows: Vec<(i64, String)> = f
            .runtime
            .block_on(f.client.query(
                "SELECT count, reason FROM pgfence.rejections WHERE scope = 'role' AND reason = 'future_epoch'",
                &[],
            ))
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let expected_role: Vec<(i64, String)> =
            if future > 0 { vec![(future, "future_epoch".to_owned())] } else { vec![] };
        prop_assert_eq!(role_rows, expected_role);
    }

    /// CLI arguments: any combination of words and flags ends with a documented exit code and a message — never
    /// a panic (exit 101) and never a write to a database it was not asked to touch (no URL is given here, so
    /// only `demo` could start one; it is left out).
    #[test]
    fn cli_arguments_end_with_a_documented_exit_code(args in prop::collection::vec(cli_word(), 0..5)) {
        let output = std::process::Command::new(common::pgfence_bin())
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

/// Refusals seen so far per presented epoch: (count, the first refusal's reason).
type Refusals = HashMap<i64, (i64, &'static str)>;

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
