//! The shapes of the portable guard (`pgfence._install_guard`: plpgsql, and one SQL function on PostgreSQL 18):
//! the installer's choice and its idempotence, and the SQL shape's defence against a caller's hostile
//! search_path, which is that it names every function, operator and type qualified (it pins no search_path: that
//! would cost on every call). Their verdicts are compared call by call in tests/native/differential.rs.
//!
//! Invariants checked: 5 (the secret and the grant are checked on every write, whatever the caller's
//! search_path) through each shape. Shown to fail on the gate mutation `sql-shape-unqualified-operator`.

use crate::common;

use common::fixture::app_role;
use common::{client_as, TestDb};

const FENCE: &str = "pgfence.fence(text, bigint, text, text, text, text)";

/// The language `pgfence.fence` is written in: the shape installed.
async fn shape(c: &tokio_postgres::Client) -> String {
    c.query_one(
        &format!(
            "SELECT l.lanname::text FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang \
              WHERE p.oid = '{FENCE}'::regprocedure"
        ),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// The migrations install the shape the server supports best — SQL from PostgreSQL 18 (server_version_num
/// 180000), plpgsql before — and calling the installer again with no shape keeps it (the function is not
/// replaced: same definition, same privileges); forcing the other shape and calling it again with no shape
/// brings the server's back (what a migrate after an upgrade to 18 does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installer_chooses_by_the_server_version_and_is_idempotent() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let version = db
        .scalar("SELECT current_setting('server_version_num')::bigint")
        .await;
    let best = if version >= 180_000 { "sql" } else { "plpgsql" };
    let other = if best == "sql" { "plpgsql" } else { "sql" };
    assert_eq!(shape(&c).await, best, "server_version_num {version}");
    let before: (String, String) = {
        let r = c
            .query_one(
                &format!(
                    "SELECT pg_get_functiondef('{FENCE}'::regprocedure), coalesce(proacl::text, '') \
                       FROM pg_proc WHERE oid = '{FENCE}'::regprocedure"
                ),
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let row_version = format!("SELECT xmin::text FROM pg_proc WHERE oid = '{FENCE}'::regprocedure");
    let first: String = c.query_one(&row_version, &[]).await.unwrap().get(0);
    let installed: String = c
        .query_one("SELECT pgfence._install_guard()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(installed, best);
    let again: String = c.query_one(&row_version, &[]).await.unwrap().get(0);
    assert_eq!(first, again, "an installed shape is not replaced");
    c.query_one("SELECT pgfence._install_guard($1)", &[&other])
        .await
        .unwrap();
    assert_eq!(shape(&c).await, other);
    c.query_one("SELECT pgfence._install_guard()", &[])
        .await
        .unwrap();
    assert_eq!(shape(&c).await, best);
    let after: (String, String) = {
        let r = c
            .query_one(
                &format!(
                    "SELECT pg_get_functiondef('{FENCE}'::regprocedure), coalesce(proacl::text, '') \
                       FROM pg_proc WHERE oid = '{FENCE}'::regprocedure"
                ),
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(before, after, "the same definition and privileges again");
}

/// A caller whose search_path puts its own schema before pg_catalog, where it defined `=` on bytea, bigint,
/// integer and text to answer true, `<>` on text to answer false and `clock_timestamp()` to answer infinity,
/// gets the verdict through either shape all the same: a forged secret is refused `bad_secret`, an epoch not yet
/// issued `future_epoch`, an expired tenure `expired` — from the fast path too (the session remembers the tenure
/// after its first admitted write). Invariant 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_search_path_cannot_redirect_either_shape_of_the_guard() {
    let db = TestDb::new().await;
    let owner_store = db.store("c").await;
    let app = app_role(&db, &owner_store, "shadow", None).await;
    let owner = db.client().await;
    owner
        .batch_execute(&format!("GRANT CREATE ON DATABASE {} TO {app}", db.name))
        .await
        .unwrap();
    let raw = client_as(&db, &app).await;
    raw.batch_execute(
        "CREATE SCHEMA evil; \
         CREATE FUNCTION evil.yes(bytea, bytea) RETURNS boolean LANGUAGE sql AS 'SELECT true'; \
         CREATE FUNCTION evil.yes(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'; \
         CREATE FUNCTION evil.yes(integer, integer) RETURNS boolean LANGUAGE sql AS 'SELECT true'; \
         CREATE FUNCTION evil.yes(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'; \
         CREATE FUNCTION evil.no(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT false'; \
         CREATE OPERATOR evil.= (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = evil.yes); \
         CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes); \
         CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.yes); \
         CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes); \
         CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.no); \
         CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql \
             AS $$ SELECT '-infinity'::timestamptz $$; \
         SET search_path = evil, pg_catalog",
    )
    .await
    .unwrap();
    let shadowed: bool = raw
        .query_one("SELECT '\\x01'::bytea = '\\x02'::bytea", &[])
        .await
        .unwrap()
        .get(0);
    assert!(shadowed, "the shadows are in effect for the caller");
    let fence = |lease: &str, epoch: i64, secret: &str| {
        let (raw, lease, secret) = (&raw, lease.to_owned(), secret.to_owned());
        async move {
            let row = raw
                .query_one(
                    "SELECT outcome, reason FROM pgfence.fence($1, $2, $3, 'op', NULL, NULL)",
                    &[&lease, &epoch, &secret],
                )
                .await
                .unwrap();
            (row.get::<_, String>(0), row.get::<_, Option<String>>(1))
        }
    };
    for (i, installed) in ["plpgsql", "sql"].into_iter().enumerate() {
        owner
            .query_one("SELECT pgfence._install_guard($1)", &[&installed])
            .await
            .unwrap();
        let lease = format!("c/shadow{i}");
        let (epoch, secret) = common::sql_acquire(&owner, &lease, "h", 600_000).await;
        let ok = ("ok".to_owned(), None);
        let refused = |why: &str| ("refused".to_owned(), Some(why.to_owned()));
        // The first write takes the full guard; the session then remembers the lease and takes the fast path.
        for _ in 0..2 {
            assert_eq!(fence(&lease, epoch, &secret).await, ok, "{installed}");
        }
        let forged = "0".repeat(64);
        assert_eq!(
            fence(&lease, epoch, &forged).await,
            refused("bad_secret"),
            "{installed}"
        );
        assert_eq!(fence(&lease, epoch, &secret).await, ok, "{installed}");
        assert_eq!(
            fence(&lease, epoch + 1, &secret).await,
            refused("future_epoch"),
            "{installed}"
        );
        assert_eq!(fence(&lease, epoch, &secret).await, ok, "{installed}");
        owner
            .execute(
                "UPDATE pgfence.leases SET expires_at = clock_timestamp() - interval '1 second' \
                  WHERE name = $1",
                &[&lease],
            )
            .await
            .unwrap();
        assert_eq!(
            fence(&lease, epoch, &secret).await,
            refused("expired"),
            "{installed}"
        );
    }
}
