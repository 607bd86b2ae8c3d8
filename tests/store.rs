//! Connecting, identity checks, migrations and error reporting against real PostgreSQL.
//!
//! Invariants checked: nothing is written to a database that is not the expected primary; errors name the real
//! cause quickly and never contain credentials.

use crate::common;

use std::time::{Duration, Instant};

use common::TestDb;
use pgfence::{Error, ExpectedIdentity, Store, StoreConfig};

const SENTINEL: &str = "s3cret-Sentinel-pw";

/// An unreachable database fails within the connect timeout with the driver's cause, and neither the error nor
/// the configuration's Debug output contains the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_database_reports_the_real_cause_quickly_without_credentials() {
    let url = format!(
        "postgres://app:{SENTINEL}@127.0.0.1:{}/control",
        common::unused_port()
    );
    let config = StoreConfig::new(url, "c");
    assert!(!format!("{config:?}").contains(SENTINEL));
    let started = Instant::now();
    let err = Store::connect(config).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(text.contains("app@127.0.0.1"), "{text}");
    assert!(
        !text.contains(SENTINEL) && !format!("{err:?}").contains(SENTINEL),
        "{text}"
    );
}

/// Connection strings are shown as `user@host:port/database`, never with the password, however it is given.
#[test]
fn redaction_keeps_host_port_database_and_user_only() {
    assert_eq!(
        pgfence::connection::redact(&format!(
            "postgres://app:{SENTINEL}@db.internal:6432/control?sslmode=disable"
        )),
        "app@db.internal:6432/control"
    );
    assert_eq!(
        pgfence::connection::redact(&format!(
            "host=db port=5433 user=ops password={SENTINEL} dbname=ctl"
        )),
        "ops@db:5433/ctl"
    );
    // Exact results, the password given in every way a connection string can carry one: no host at all, a
    // query parameter, percent-encoded, several hosts, a quoted keyword value, an unparsable string.
    let encoded = SENTINEL.replace('-', "%2D");
    for (url, shown) in [
        (
            format!("postgres://app:{SENTINEL}@"),
            "app@localhost:5432/app",
        ),
        (
            format!("postgres://app@db/ctl?password={SENTINEL}"),
            "app@db:5432/ctl",
        ),
        (
            format!("postgres://app:{encoded}@db/ctl"),
            "app@db:5432/ctl",
        ),
        (
            format!("postgres://app:{SENTINEL}@h1:1,h2:2/db"),
            "app@h1:1/db",
        ),
        (
            format!("host=/run/postgresql user=u password='{SENTINEL}'"),
            "u@/run/postgresql:5432/u",
        ),
        (
            format!("postgres://app:{SENTINEL}@db:notaport/ctl"),
            "<unparsable connection string>",
        ),
    ] {
        assert_eq!(pgfence::connection::redact(&url), shown, "{url}");
    }
}

/// A malformed URL is a clear error that does not echo the string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_url_is_a_clear_error() {
    let err = Store::connect(StoreConfig::new(
        format!("postgres://u:{SENTINEL}@host:notaport/db"),
        "c",
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(!err.to_string().contains(SENTINEL));
}

/// A wrong password is reported as an authentication failure, without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_login_is_reported_without_the_password() {
    let db = TestDb::new().await;
    // A missing role: refused whether the server asks for a password or not.
    let url = common::url_with_credentials(&db.url, "nobody_here", SENTINEL);
    let err = Store::connect(StoreConfig::new(url, "c"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(text.contains("nobody_here"), "{text}");
    assert!(!text.contains(SENTINEL), "{text}");
}

/// Migrating twice is a no-op, and several processes migrating a fresh database at once all succeed with the
/// migrations applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_and_repeated_migrations_apply_once() {
    let db = TestDb::empty().await;
    let mut handles = Vec::new();
    for _ in 0..4 {
        let config = db.config("c");
        handles.push(tokio::spawn(async move {
            let store = Store::connect(config).await.unwrap();
            store.migrate().await.unwrap()
        }));
    }
    let mut applied = 0;
    for h in handles {
        applied += h.await.unwrap().len();
    }
    assert_eq!(applied, pgfence_migration_count());
    let store = db.store("c").await;
    assert!(store.migrate().await.unwrap().is_empty());
    assert_eq!(db.scalar("SELECT count(*) FROM pgfence.instance").await, 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.\"__diesel_schema_migrations\"")
            .await as usize,
        pgfence_migration_count()
    );
    store
        .acquire("x", "pod", Duration::from_secs(5))
        .await
        .unwrap();
}

fn pgfence_migration_count() -> usize {
    std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count()
}

/// A database without the schema is accepted at connect (so migrate can run), and lease operations on it say
/// to run the migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_schema_says_to_migrate() {
    let db = TestDb::empty().await;
    let store = db.store("c").await;
    let identity = store.admin().identity().await.unwrap();
    assert_eq!(identity.instance_id, None);
    let err = store
        .acquire("x", "pod", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::SchemaMissing), "{err:?}");
    assert!(err.to_string().contains("migrate"));
}

/// The identity names the server (system identifier), the database and the pgfence instance; a store that
/// expects another identity refuses to connect, and leaves no session behind through which anything could be
/// written (the connection that read the identity is closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_is_verified_before_any_write() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let identity = store.admin().verify_identity().await.unwrap();
    assert!(!identity.in_recovery);
    assert_eq!(identity.database, db.name);
    let system_identifier = identity
        .system_identifier
        .clone()
        .expect("superuser can read it");
    let instance_id = identity.instance_id.clone().expect("migrated");

    let matching = ExpectedIdentity {
        system_identifier: Some(system_identifier.clone()),
        instance_id: Some(instance_id.clone()),
        database: Some(db.name.clone()),
    };
    Store::connect(db.config("c").expect(matching))
        .await
        .unwrap();

    // Another database of the same server, migrated on its own, has its own pgfence instance id. (A database
    // cloned from a template or restored from a dump keeps the id of its origin: expect the database name too.)
    let other = TestDb::empty().await;
    other.store("c").await.migrate().await.unwrap();
    let refused_name = format!("{}-refused", db.name);
    let err = Store::connect(other.config("c").application_name(&refused_name).expect(
        ExpectedIdentity {
            instance_id: Some(instance_id.clone()),
            ..Default::default()
        },
    ))
    .await
    .unwrap_err();
    match err {
        Error::WrongDatabase {
            what,
            expected,
            actual,
        } => {
            assert_eq!(what, "instance id");
            assert_eq!(expected, instance_id);
            assert_ne!(actual, instance_id);
        }
        other => panic!("expected WrongDatabase, got {other:?}"),
    }
    let err = Store::connect(db.config("c").application_name(&refused_name).expect(
        ExpectedIdentity {
            system_identifier: Some("42".into()),
            ..Default::default()
        },
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongDatabase {
                what: "system identifier",
                ..
            }
        ),
        "{err:?}"
    );
    // The sessions of a store, by application name. Positive control: an accepted store's session shows.
    let sessions = |name: String| {
        let db = db.clone();
        async move {
            db.scalar(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'"
            ))
            .await
        }
    };
    let accepted_name = format!("{}-accepted", db.name);
    let accepted = Store::connect(db.config("c").application_name(&accepted_name))
        .await
        .unwrap();
    assert_eq!(
        sessions(accepted_name).await,
        1,
        "the probe sees a store's session"
    );
    drop(accepted);
    // A backend exits once its client closed the socket: give it a moment, then none may remain.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = sessions(refused_name.clone()).await;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} sessions of the refused stores remain"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// When the database goes away after connecting, a checkout fails within the checkout timeout and reports the
/// pool's last connection error, not only "timed out". Uses a server of its own, since it stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_timeout_reports_the_last_connection_error() {
    let server = pgfence::embedded::EmbeddedServer::start().unwrap();
    let store = Store::connect(
        StoreConfig::new(server.url(), "c")
            .checkout_timeout(Duration::from_secs(1))
            .connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    store
        .acquire("x", "pod", Duration::from_secs(5))
        .await
        .unwrap();
    server.stop().unwrap();
    // The pooled connection is dead now; the first statement on it fails and it is discarded.
    let first = store
        .acquire("y", "pod", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(first.is_transient(), "{first:?}");
    let started = Instant::now();
    let err = store
        .acquire("y", "pod", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    match &err {
        Error::PoolTimeout { cause, .. } => {
            let cause = cause.as_deref().unwrap_or_default().to_lowercase();
            assert!(cause.contains("refused"), "{err}");
        }
        other => panic!("expected PoolTimeout, got {other:?}"),
    }
    assert!(err.is_transient());
}

/// Invariant: a checkout waits its turn, first come, first served — a task that gives its connection back and
/// asks again at once cannot keep a waiting task out. On one thread with one connection, a hog loops: a
/// statement, the connection given back, checked out again before it yields. Handed out by bb8 alone, the
/// returned connection goes to the hog's next request before the woken waiter runs, every round, until the
/// waiter's checkout times out.
#[tokio::test(flavor = "current_thread")]
async fn checkouts_are_served_in_the_order_they_were_asked_for() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let db = TestDb::new().await;
    let config = db
        .config("c")
        .pool_size(1)
        .checkout_timeout(Duration::from_secs(3));
    let store = Store::connect(config).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let (held, first_held) = tokio::sync::oneshot::channel();
    let hog = tokio::spawn({
        let (store, stop, rounds) = (store.clone(), stop.clone(), rounds.clone());
        async move {
            let mut conn = store.admin().conn().await.unwrap();
            held.send(()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                diesel_async::RunQueryDsl::execute(diesel::sql_query("SELECT 1"), &mut *conn)
                    .await
                    .unwrap();
                rounds.fetch_add(1, Ordering::Relaxed);
                drop(conn);
                conn = store.admin().conn().await.unwrap();
            }
        }
    });
    first_held.await.unwrap();
    let started = Instant::now();
    let waiter = store.lease_status("x").await;
    let waited = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    hog.await.unwrap();
    let rounds = rounds.load(Ordering::Relaxed);
    assert!(
        waiter.is_ok(),
        "the waiting checkout was kept out for {waited:?} while the hog ran {rounds} rounds: {waiter:?}"
    );
    assert!(
        waited < Duration::from_secs(2),
        "the waiting checkout took {waited:?} ({rounds} rounds of the hog)"
    );
}

/// Invariant: a checkout that waits out its timeout behind other tasks says so: the error names the pool's
/// connections as all checked out for the whole wait, not a connection error it did not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_timed_out_behind_other_tasks_says_so() {
    let db = TestDb::new().await;
    let config = db
        .config("c")
        .pool_size(2)
        .checkout_timeout(Duration::from_millis(300));
    let store = Store::connect(config).await.unwrap();
    let held = (
        store.admin().conn().await.unwrap(),
        store.admin().conn().await.unwrap(),
    );
    let err = store.lease_status("x").await.unwrap_err();
    drop(held);
    match &err {
        Error::PoolTimeout { cause, .. } => assert_eq!(
            cause.as_deref(),
            Some("all 2 of the pool's connections stayed checked out by other tasks"),
            "{err}"
        ),
        other => panic!("expected PoolTimeout, got {other:?}"),
    }
    assert!(err.is_transient());
    store.lease_status("x").await.unwrap();
}

/// An application's own bb8 pool can be wrapped: identity is verified once, and leases and migrations work
/// through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_can_wrap_the_applications_own_pool() {
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::AsyncPgConnection;
    let db = TestDb::new().await;
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(db.url.clone());
    let pool = bb8::Pool::builder()
        .max_size(2)
        .build(manager)
        .await
        .unwrap();
    let store = Store::from_pool(pool.clone(), "app", ExpectedIdentity::default())
        .await
        .unwrap();
    let lease = store
        .acquire("x", "pod", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(lease.qualified_name(), "app/x");
    // Migrating uses a connection the application's manager opens outside the pool (already migrated here).
    assert_eq!(store.migrate().await.unwrap(), Vec::<String>::new());
    let wrong = Store::from_pool(
        pool,
        "app",
        ExpectedIdentity {
            database: Some("elsewhere".into()),
            ..Default::default()
        },
    )
    .await;
    assert!(
        matches!(
            wrong,
            Err(Error::WrongDatabase {
                what: "database",
                ..
            })
        ),
        "{wrong:?}"
    );
}

/// A peer that accepts the TCP connection but never answers the startup exchange (a hung proxy, a wrong port)
/// fails within the connect timeout instead of hanging: the timeout bounds the whole startup, not only the
/// socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_fails_within_the_connect_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            held.push(socket); // never read, never answered
        }
    });
    let started = Instant::now();
    let err = Store::connect(
        StoreConfig::new(
            format!("postgres://app:{SENTINEL}@127.0.0.1:{port}/db"),
            "c",
        )
        .connect_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(!err.to_string().contains(SENTINEL));
    silent.abort();
}

/// Ends the server sessions of the store's pooled connections (application_name `app`) from outside, as a
/// restart of a pooler or a firewall timeout would while they sit idle in the pool.
async fn end_idle_sessions(db: &TestDb, app: &str) {
    let ended = db
        .scalar(&format!(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
              WHERE application_name = '{app}' AND datname = current_database()) t"
        ))
        .await;
    assert!(ended >= 1, "no idle session of {app} to end");
    // Wait until the server has let them go.
    let deadline = Instant::now() + Duration::from_secs(10);
    while db
        .scalar(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' \
               AND datname = current_database()"
        ))
        .await
        > 0
    {
        assert!(
            Instant::now() < deadline,
            "the ended sessions never went away"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The pool does not ping a connection at check-out (a round trip per operation, measured by `pgfence bench` as
/// `update-ping`): a connection that broke while idle is found out by the statement that uses it, which fails
/// with a transient error and never reports success; the pool then discards the connection and the next
/// operation runs on a new one. With `ping_on_checkout(true)` the broken connection is replaced before use.
#[tokio::test]
async fn a_connection_broken_while_idle_fails_its_next_statement_transiently_and_is_replaced() {
    let db = TestDb::new().await;
    let store = Store::connect(db.config("c").pool_size(1).application_name("idle-broken"))
        .await
        .unwrap();
    store
        .acquire("a", "h", Duration::from_secs(60))
        .await
        .unwrap();
    end_idle_sessions(&db, "idle-broken").await;
    let err = store
        .acquire("b", "h", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    store
        .acquire("b", "h", Duration::from_secs(60))
        .await
        .unwrap();

    let pinging = Store::connect(
        db.config("c")
            .pool_size(1)
            .application_name("idle-pinged")
            .ping_on_checkout(true),
    )
    .await
    .unwrap();
    pinging
        .acquire("c", "h", Duration::from_secs(60))
        .await
        .unwrap();
    end_idle_sessions(&db, "idle-pinged").await;
    pinging
        .acquire("d", "h", Duration::from_secs(60))
        .await
        .unwrap();
}
