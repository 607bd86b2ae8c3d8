//! The trust boundary against roles of the same cluster and careless grants (invariant 8, and invariant 7's
//! liveness: a role without a tenure's secret can never make that tenure's holder, or a takeover of it, wait).
//!
//! Every entry point decides holder, epoch and secret on an unlocked read before it takes any lock, so a role
//! that presents a forged secret and leaves its transaction open holds nothing the holder or an operator needs.

use crate::common;

use std::time::{Duration, Instant};

use common::{client_as, role, url_as, TestDb};
use pgfence::{Lease, Store, StoreConfig};

const TTL: Duration = Duration::from_secs(60);

/// How long a forged call left open may delay the holder at most.
const HOLDER_DELAY: Duration = Duration::from_millis(50);

async fn store_as(db: &TestDb, role: &str, cluster: &str) -> Store {
    Store::connect(StoreConfig::new(url_as(db, role), cluster))
        .await
        .unwrap()
}

/// A database with a holder role and an attacker role (both granted cluster `ta`), an operator of `ta`, and a
/// lease `ta/x` held by the holder role: (db, holder's store, the lease, attacker, operator).
async fn holder_and_attacker() -> (TestDb, Store, Lease, String, String) {
    let db = TestDb::new().await;
    let (holder, attacker, operator) = (
        role(&db, "holder").await,
        role(&db, "attacker").await,
        role(&db, "oper").await,
    );
    let owner = db.store("ta").await;
    owner.grant_application(&holder, Some("ta")).await.unwrap();
    owner.grant_application(&attacker, Some("ta")).await.unwrap();
    owner.grant_operator(&operator, Some("ta")).await.unwrap();
    let store = store_as(&db, &holder, "ta").await;
    let lease = store.acquire("x", "a-ctrl", TTL).await.unwrap();
    (db, store, lease, attacker, operator)
}

/// The forged calls a role of the same cluster can leave open in a transaction: each presents the current
/// holder and epoch (both readable) with a wrong secret. Before "decide before locking", each of them held the
/// lease row (or the belief row) until its transaction ended.
fn forged_calls(epoch: i64) -> Vec<(&'static str, String)> {
    let forged = "f".repeat(64);
    vec![
        (
            "renew",
            format!("SELECT * FROM pgfence.renew('ta/x', 'a-ctrl', {epoch}, '{forged}', 60000)"),
        ),
        (
            "renew_many",
            format!(
                "SELECT * FROM pgfence.renew_many(array_fill('ta/x'::text, ARRAY[2000]), \
                 array_fill({epoch}::bigint, ARRAY[2000]), array_fill('{forged}'::text, ARRAY[2000]), \
                 'a-ctrl', 60000)"
            ),
        ),
        (
            "release",
            format!("SELECT * FROM pgfence.release('ta/x', 'a-ctrl', {epoch}, '{forged}')"),
        ),
        (
            "report_belief",
            format!(
                "SELECT pgfence.report_belief('ta/x', {epoch}, '{forged}', 'end', now(), now(), NULL, \
                 'released', NULL)"
            ),
        ),
        (
            "fence",
            format!("SELECT * FROM pgfence.fence('ta/x', {epoch}, '{forged}', 'hold')"),
        ),
        (
            "create_task",
            format!("SELECT * FROM pgfence.create_task('ta/x', {epoch}, '{forged}', 'k', '{{}}')"),
        ),
    ]
}

/// Invariant 7's liveness against a role without the secret: with each forged call left open in a transaction
/// of another role of the same cluster, the holder's renewal (alone and batched), its belief report and an
/// operator's takeover are not delayed (the holder by at most 50 ms; the takeover finishes within the grace
/// + 1 s, and needs no grace here since nothing of the tenure is in flight), and every forged call was refused
/// and audited. Fails on a function that locks before it checks the secret: the holder then waits for the
/// attacker's transaction (PF003 after the lock-wait bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_call_left_open_delays_neither_the_holder_nor_a_takeover() {
    let (db, store, mut lease, attacker, operator) = holder_and_attacker().await;
    let holder_raw = db.client().await;
    let grace = Duration::from_millis(
        db.scalar("SELECT takeover_grace_ms FROM pgfence.instance")
            .await as u64,
    );
    for (what, sql) in forged_calls(lease.epoch().get()) {
        let open = client_as(&db, &attacker).await;
        open.batch_execute("BEGIN").await.unwrap();
        let answer = open
            .simple_query(&sql)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        drop(answer);

        let started = Instant::now();
        store
            .renew(&mut lease)
            .await
            .unwrap_or_else(|e| panic!("renewal behind an open forged {what}: {e}"));
        let renewal = started.elapsed();
        let secret = lease.fence().secret().expose_secret().to_owned();
        let started = Instant::now();
        let outcome: String = holder_raw
            .query_one(
                "SELECT outcome FROM pgfence.renew_many(ARRAY['ta/x'], ARRAY[$1::bigint], ARRAY[$2], \
                 'a-ctrl', 60000)",
                &[&lease.epoch().get(), &secret],
            )
            .await
            .unwrap_or_else(|e| panic!("batched renewal behind an open forged {what}: {e}"))
            .get(0);
        let batched = started.elapsed();
        assert_eq!(outcome, "renewed", "{what}");
        let started = Instant::now();
        holder_raw
            .query_one(
                "SELECT pgfence.report_belief('ta/x', $1, $2, 'start', now(), now())",
                &[&lease.epoch().get(), &secret],
            )
            .await
            .unwrap_or_else(|e| panic!("belief report behind an open forged {what}: {e}"));
        let report = started.elapsed();
        for (step, took) in [
            ("renew", renewal),
            ("renew_many", batched),
            ("report_belief", report),
        ] {
            assert!(
                took <= HOLDER_DELAY,
                "the holder's {step} took {took:?} behind an open forged {what}"
            );
        }
        open.batch_execute("COMMIT").await.unwrap();
        let audited = db
            .scalar(&format!(
                "SELECT count(*) FROM pgfence.rejections WHERE role = '{attacker}' AND reason = 'bad_secret' \
                   AND operation = '{}'",
                match what {
                    "renew_many" => "renew",
                    "fence" => "hold",
                    other => other,
                }
            ))
            .await;
        assert_eq!(audited, 1, "the forged {what} is audited");
    }

    // The operator's takeover, with every forged call open at once (each from a role of its own: one role's
    // open refusal holds its own audit row, which that role's next refusal of the same kind waits for).
    let owner = db.store("ta").await;
    let mut open = Vec::new();
    for (i, (what, sql)) in forged_calls(lease.epoch().get()).into_iter().enumerate() {
        let attacker = role(&db, &format!("attacker{i}")).await;
        owner.grant_application(&attacker, Some("ta")).await.unwrap();
        let client = client_as(&db, &attacker).await;
        client.batch_execute("BEGIN").await.unwrap();
        client
            .simple_query(&sql)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        open.push(client);
    }
    let oper = store_as(&db, &operator, "ta").await;
    let started = Instant::now();
    oper.force_release("x")
        .await
        .expect("the operator's takeover");
    let took = started.elapsed();
    assert!(
        took <= grace + Duration::from_secs(1),
        "the takeover took {took:?} behind the open forged calls (grace {grace:?})"
    );
    assert!(
        took <= HOLDER_DELAY * 4,
        "nothing of the tenure was in flight, yet the takeover took {took:?}"
    );
}
