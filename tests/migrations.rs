//! The migrations one at a time, as an upgrade applies them: each applies on a database holding the data the
//! ones before it could write, its down.sql undoes it, and the end state is the schema of a database migrated at
//! once, on which the data written along the way is still guarded. The harness of the upgrade tests that
//! docs/schema-changes.md asks for from the first release on (there is no release yet: this applies the tree's
//! own migrations in order).

use crate::common;

use std::time::Duration;

use common::{client_as, creator, role, store_as, TestDb};
use diesel::migration::MigrationSource;
use diesel::pg::Pg;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use diesel_migrations::MigrationHarness;
use pgfence::tasks::TaskState;
use pgfence::{Error, Lease, LossReason, Store};
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

/// Every pgfence object as text, one line each, sorted: functions (with a hash of their definition and their
/// privileges), relations, columns, constraints, indexes, triggers (and whether they are enabled), policies, views
/// and composite types. Two databases with the same snapshot have the same schema.
const SNAPSHOT: &str = "
SELECT coalesce(string_agg(x, E'\\n' ORDER BY x), '') FROM (
    SELECT 'function ' || p.oid::regprocedure || ' ' || md5(pg_get_functiondef(p.oid)) || ' '
           || coalesce(p.proacl::text, 'default')
      FROM pg_proc p WHERE p.pronamespace = 'pgfence'::regnamespace
    UNION ALL
    SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' rls ' || c.relrowsecurity || ' '
           || coalesce(c.relacl::text, 'default') || ' ' || coalesce(c.reloptions::text, '')
      FROM pg_class c WHERE c.relnamespace = 'pgfence'::regnamespace
    UNION ALL
    SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || ' ' || a.attnotnull || ' ' || a.attidentity::text || ' ' || a.attgenerated::text || ' '
           || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
      FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE c.relnamespace = 'pgfence'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
      FROM pg_constraint WHERE connamespace = 'pgfence'::regnamespace
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(i.indexrelid)
      FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = 'pgfence'::regnamespace
    UNION ALL
    SELECT 'trigger ' || t.tgrelid::regclass || ' ' || t.tgname || ' ' || t.tgenabled::text || ' '
           || pg_get_triggerdef(t.oid)
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     WHERE c.relnamespace = 'pgfence'::regnamespace AND NOT t.tgisinternal
    UNION ALL
    SELECT 'policy ' || tablename || ' ' || policyname || ' ' || cmd || ' ' || coalesce(qual, '') || ' '
           || coalesce(with_check, '')
      FROM pg_policies WHERE schemaname = 'pgfence'
    UNION ALL
    SELECT 'view ' || viewname || ' ' || definition FROM pg_views WHERE schemaname = 'pgfence'
    UNION ALL
    SELECT 'schema ' || coalesce(nspacl::text, 'default') FROM pg_namespace WHERE nspname = 'pgfence'
) objects(x)";

async fn snapshot(db: &TestDb) -> String {
    db.client()
        .await
        .query_one(SNAPSHOT, &[])
        .await
        .unwrap()
        .get(0)
}

/// A migration harness on `db`, set up as `Store::migrate` sets up its connection: the pgfence schema first, on
/// the search path, so that diesel keeps its record of applied migrations there.
struct Harness(Option<AsyncConnectionWrapper<AsyncPgConnection>>);

impl Harness {
    async fn open(db: &TestDb) -> Harness {
        let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
        conn.batch_execute("CREATE SCHEMA IF NOT EXISTS pgfence; SET search_path = pgfence")
            .await
            .unwrap();
        Harness(Some(AsyncConnectionWrapper::from(conn)))
    }

    /// Runs `step` on the harness's connection, on a blocking thread: diesel's harness is synchronous and blocks
    /// on the runtime.
    async fn run<T: Send + 'static>(
        &mut self,
        step: impl FnOnce(&mut AsyncConnectionWrapper<AsyncPgConnection>) -> T + Send + 'static,
    ) -> T {
        let mut conn = self.0.take().expect("harness connection");
        let (conn, out) = tokio::task::spawn_blocking(move || {
            let out = step(&mut conn);
            (conn, out)
        })
        .await
        .unwrap();
        self.0 = Some(conn);
        out
    }

    async fn next(&mut self) -> String {
        self.run(|conn| {
            conn.run_next_migration(pgfence::schema::MIGRATIONS)
                .unwrap()
                .to_string()
        })
        .await
    }

    async fn revert(&mut self) -> String {
        self.run(|conn| {
            conn.revert_last_migration(pgfence::schema::MIGRATIONS)
                .unwrap()
                .to_string()
        })
        .await
    }
}

/// After the migrations one at a time, the data written along the way is still guarded: the live tenure
/// (`current`) renews and writes, its superseded predecessor is refused and audited, a new acquisition issues a
/// larger epoch, and a role granted the cluster uses it.
async fn the_data_written_along_the_way_is_still_guarded(
    db: &TestDb,
    store: &Store,
    superseded: &Lease,
    current: &mut Lease,
) {
    store.renew(current).await.unwrap();
    let moved = store
        .tasks()
        .transition(
            &current.fence(),
            "job",
            TaskState::Pending,
            TaskState::Running,
            &json!({}),
        )
        .await
        .unwrap();
    assert_eq!(moved.task.state, TaskState::Running);
    match store
        .tasks()
        .append_event(&superseded.fence(), "job", "late", &json!({}))
        .await
    {
        Err(Error::Stale {
            reason: LossReason::Superseded,
            current: Some(epoch),
            ..
        }) => assert_eq!(epoch, current.epoch()),
        other => panic!("expected a stale refusal, got {other:?}"),
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections WHERE reason = 'superseded'")
            .await,
        2,
        "the refusals before and after the last migrations, each in its row"
    );
    store.release(current).await.unwrap();
    let next = store.acquire("a", "pod-2", TTL).await.unwrap();
    assert!(next.epoch() > current.epoch());

    let (_, as_app) = common::fixture::app_store(db, store, "app", "up").await;
    let mine = as_app.acquire("b", "app-1", TTL).await.unwrap();
    as_app
        .tasks()
        .create(&mine.fence(), "job", &json!({}))
        .await
        .unwrap();
    assert_eq!(
        as_app.admin().leases().await.unwrap().len(),
        2,
        "the granted role reads its cluster's leases, the one from before the roles migration included"
    );
}

/// The migrations apply one at a time, each on the data the ones before it let the library write: a lease after
/// the lease protocol, a stale fence refused and audited after the guard, a task after the tasks. Each one's
/// down.sql undoes exactly it (the roles' leaves PUBLIC revoked: see its down.sql) and it applies again. At the
/// end the schema is that of a database migrated at once, and the data written along the way is still guarded:
/// the live tenure renews and writes, its superseded predecessor is refused and audited, a new acquisition
/// issues a larger epoch, and a role granted the cluster uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_one_at_a_time_on_data_and_end_as_a_fresh_schema() {
    let reference = TestDb::empty().await;
    reference.store("up").await.migrate().await.unwrap();
    let fresh = snapshot(&reference).await;

    let db = TestDb::empty().await;
    let versions: Vec<String> = MigrationSource::<Pg>::migrations(&pgfence::schema::MIGRATIONS)
        .unwrap()
        .iter()
        .map(|m| m.name().version().to_string())
        .collect();
    assert_eq!(versions.len(), 6, "{versions:?}");
    let mut harness = Harness::open(&db).await;
    let mut before = snapshot(&db).await;
    let mut store: Option<Store> = None;
    let (mut superseded, mut current) = (None, None);
    for (step, version) in versions.iter().enumerate() {
        assert_eq!(&harness.next().await, version);
        let after = snapshot(&db).await;
        // The first migration's down.sql drops the schema, diesel's own record of applied migrations with it.
        if step > 0 {
            assert_eq!(&harness.revert().await, version);
            if step < versions.len() - 1 {
                assert_eq!(
                    snapshot(&db).await,
                    before,
                    "{version}/down.sql undoes {version}/up.sql"
                );
            }
            assert_eq!(&harness.next().await, version);
            assert_eq!(
                snapshot(&db).await,
                after,
                "{version} applies again after its down.sql"
            );
        }
        before = after;
        let store = match &store {
            Some(store) => store.clone(),
            None => store.insert(db.store("up").await).clone(),
        };
        match step {
            // The lease protocol: two tenures of one lease.
            1 => {
                superseded = Some(store.acquire("a", "pod-1", TTL).await.unwrap());
                current = Some(store.acquire("a", "pod-1", TTL).await.unwrap());
            }
            // The guard: the superseded tenure is refused and audited.
            2 => {
                let fence = superseded.as_ref().unwrap().fence();
                let refused = store
                    .fenced(&fence, "upgrade", async |_| Ok::<_, Error>(()))
                    .await
                    .unwrap_err();
                assert!(matches!(refused, Error::Stale { .. }), "{refused:?}");
            }
            // Tasks: one, written by the current tenure.
            3 => {
                let fence = current.as_ref().unwrap().fence();
                let write = store
                    .tasks()
                    .create(&fence, "job", &json!({"n": 1}))
                    .await
                    .unwrap();
                assert!(write.created);
            }
            _ => {}
        }
    }
    assert!(
        db.store("up").await.migrate().await.unwrap().is_empty(),
        "nothing left to apply"
    );
    assert_eq!(
        snapshot(&db).await,
        fresh,
        "one at a time ends where all at once does"
    );

    let store = store.unwrap();
    let (superseded, mut current) = (superseded.unwrap(), current.unwrap());
    the_data_written_along_the_way_is_still_guarded(&db, &store, &superseded, &mut current).await;
}

/// How many objects the schema `pgfence` holds (relations, functions, types), 0 when it does not exist.
async fn objects_in_schema(db: &TestDb) -> i64 {
    db.scalar(
        "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = n.oid) \
              + (SELECT count(*) FROM pg_proc WHERE pronamespace = n.oid) \
              + (SELECT count(*) FROM pg_type WHERE typnamespace = n.oid) \
           FROM pg_namespace n WHERE n.nspname = 'pgfence' \
         UNION ALL SELECT 0 ORDER BY 1 DESC LIMIT 1",
    )
    .await
}

/// The migrating role as a store.
async fn store_of(db: &TestDb, who: &str) -> Store {
    store_as(db, who, "c").await
}

/// Asserts a migration refused for the schema's trust (42501 through `sqlstate()`), naming `culprit` and a fix.
fn assert_refused_naming(err: &Error, culprit: &str, fix: &str) {
    assert!(matches!(err, Error::Migration { .. }), "{err:?}");
    assert_eq!(
        err.sqlstate(),
        Some(pgfence::sqlstate::SqlState::InsufficientPrivilege),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains(culprit) && text.contains(fix), "{text}");
}

/// Schema squatting (the trust root must be the owner's alone): a role with CREATE on the database that makes
/// the schema `pgfence` first and lets the owner use and create in it would own pgfence's functions. The owner's
/// migrate is refused (42501) naming the squatter and how to fix it, and nothing is created in the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_schema_another_role_made_first() {
    let db = TestDb::empty().await;
    let (owner, squatter) = (creator(&db, "owner").await, creator(&db, "squatter").await);
    client_as(&db, &squatter)
        .await
        .batch_execute(&format!(
            "CREATE SCHEMA pgfence; GRANT USAGE, CREATE ON SCHEMA pgfence TO {owner}"
        ))
        .await
        .unwrap();
    let err = store_of(&db, &owner).await.migrate().await.unwrap_err();
    assert_refused_naming(&err, &squatter, "DROP SCHEMA pgfence");
    println!("{err}");
    assert_eq!(objects_in_schema(&db).await, 0, "nothing was created");
    // The first migration's own check, for a harness that skipped Store::migrate's (here a superuser's).
    let mut harness = Harness::open(&db).await;
    let refused = harness
        .run(|conn| {
            conn.run_next_migration(pgfence::schema::MIGRATIONS)
                .map(|v| v.to_string())
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap_err();
    assert!(
        refused.contains("refusing to install") && refused.contains(&squatter),
        "{refused}"
    );
    drop(harness);

    // Once the squatter's schema is gone (with the harness's record), the owner installs pgfence.
    client_as(&db, &squatter)
        .await
        .batch_execute("DROP SCHEMA pgfence CASCADE")
        .await
        .unwrap();
    assert!(!store_of(&db, &owner)
        .await
        .migrate()
        .await
        .unwrap()
        .is_empty());
}

/// The trust root stays the owner's on every later migrate: an object of another role in the otherwise fine
/// schema (here diesel's record of applied migrations, made by a role the owner let create in it, before the
/// first migration; and a function after the install) is refused, 42501, naming that role and the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_another_roles_object_in_the_schema() {
    let db = TestDb::empty().await;
    let (owner, squatter) = (creator(&db, "owner").await, role(&db, "squatter").await);
    let as_owner = client_as(&db, &owner).await;
    as_owner
        .batch_execute(&format!(
            "CREATE SCHEMA pgfence; GRANT USAGE, CREATE ON SCHEMA pgfence TO {squatter}"
        ))
        .await
        .unwrap();
    client_as(&db, &squatter)
        .await
        .batch_execute(
            "CREATE TABLE pgfence.__diesel_schema_migrations (version varchar(50) PRIMARY KEY, \
             run_on timestamp NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    let err = store_of(&db, &owner).await.migrate().await.unwrap_err();
    assert_refused_naming(&err, &squatter, "__diesel_schema_migrations");
    // The owner's own grant of CREATE to another role is refused too.
    assert!(err.to_string().contains("grants CREATE"), "{err}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgfence'::regnamespace")
            .await,
        0,
        "no migration ran"
    );

    // Installed, then a foreign object appears (a superuser hands a function to another role).
    as_owner
        .batch_execute("DROP SCHEMA pgfence CASCADE")
        .await
        .unwrap();
    let store = store_of(&db, &owner).await;
    store.migrate().await.unwrap();
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION pgfence.planted() RETURNS int LANGUAGE sql AS 'SELECT 1'; \
             ALTER FUNCTION pgfence.planted() OWNER TO {squatter}"
        ))
        .await
        .unwrap();
    let err = store.migrate().await.unwrap_err();
    assert_refused_naming(&err, &squatter, "pgfence.planted()");
}

/// A schema privilege the owner did not grant, or CREATE on the schema for another role, is refused on a later
/// migrate (42501 naming the grantee and the REVOKE to run); once revoked, migrate is a no-op again. The normal
/// path: a fresh database, the owner migrates twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_foreign_create_grant_and_migrates_twice_otherwise() {
    let db = TestDb::empty().await;
    let (owner, other) = (creator(&db, "owner").await, role(&db, "other").await);
    let store = store_of(&db, &owner).await;
    assert!(!store.migrate().await.unwrap().is_empty());
    assert!(
        store.migrate().await.unwrap().is_empty(),
        "twice is a no-op"
    );

    let as_owner = client_as(&db, &owner).await;
    as_owner
        .batch_execute(&format!("GRANT CREATE ON SCHEMA pgfence TO {other}"))
        .await
        .unwrap();
    let err = store.migrate().await.unwrap_err();
    assert_refused_naming(&err, &other, "REVOKE CREATE ON SCHEMA pgfence FROM");
    as_owner
        .batch_execute(&format!("REVOKE CREATE ON SCHEMA pgfence FROM {other}"))
        .await
        .unwrap();
    assert!(store.migrate().await.unwrap().is_empty());
}
