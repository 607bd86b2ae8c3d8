//! Replica groups in the database: joins, heartbeats, leaves, the stored assignment (claimed, computed by one
//! member, read by each), and every refusal — through Rust and through SQL, with real roles. Membership is no fence (invariant 3 stays the lease's), but it must be as hard
//! to bend as a lease: the same member name never counts twice, a forged heartbeat is refused, audited and holds
//! no lock, a role reads and joins only groups of its clusters (invariant 8), and bad input is a typed error
//! that writes nothing.

use crate::common;

use std::time::Duration;

use common::fixture::{app_role, app_store};
use common::{client_as, sqlstate, store_as, TestDb};
use std::collections::BTreeMap;

use pgfence::groups::{MemberSpec, NameSets, Rebalance};
use pgfence::{Error, LossReason, Store};

const TTL: Duration = Duration::from_secs(30);

fn spec(names: &[&str]) -> MemberSpec {
    MemberSpec::new(names.iter().copied())
}

async fn member_rows(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM pgfence.members").await
}

/// The members the group's next assignment counts, with whether each is settled.
async fn counted(store: &Store, group: &str) -> Vec<(String, bool)> {
    store
        .groups()
        .rebalance_inputs(group, &NameSets::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.member, m.settled))
        .collect()
}

/// Invariant: the stored assignment counts settled members only, is computed under one member's claim once the
/// quiet time after a change has passed, is read by each member as its own names (with its generation), and a
/// leave of a counted member makes the next one due at once; the members' rows show what each is assigned and
/// leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_settles_the_group_is_assigned_once_and_a_leave_is_due_at_once() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let mut a = store
        .groups()
        .join("g", "a", &spec(&["x", "y"]).weight(3).pin(["y"]), TTL)
        .await
        .unwrap();
    assert_eq!(
        (a.incarnation(), a.settled(), a.news_at_join().generation),
        (1, false, 0),
        "settled at its first heartbeat; nothing assigned yet"
    );
    assert!(a.channel().starts_with("pgfence_group_"), "{}", a.channel());
    let mut b = store
        .groups()
        .join("g", "b", &spec(&["x", "y"]).exclude(["y"]), TTL)
        .await
        .unwrap();
    assert!(counted(&store, "g").await.is_empty(), "nobody settled yet");
    let news = store.groups().heartbeat(&mut a, TTL).await.unwrap();
    assert!(a.settled());
    let quiet = news.rebalance_in.expect("a settle makes an assignment due");
    assert!(quiet <= Duration::from_secs(1), "{quiet:?}");
    store.groups().heartbeat(&mut b, TTL).await.unwrap();
    assert_eq!(
        counted(&store, "g").await,
        [("a".to_owned(), true), ("b".to_owned(), true)]
    );
    // Before the quiet time has passed, nobody may claim it.
    match store.groups().claim_rebalance(&a).await.unwrap() {
        Rebalance::NotDue { wait: Some(_) } => {}
        other => panic!("expected not due yet, got {other:?}"),
    }
    let (version, generation) = claim(&store, &a).await;
    match store.groups().claim_rebalance(&b).await.unwrap() {
        Rebalance::Claimed { wait } => assert!(wait > Duration::ZERO),
        other => panic!("expected claimed by a, got {other:?}"),
    }
    let moves: BTreeMap<String, String> = [("x", "b"), ("y", "a")]
        .into_iter()
        .map(|(n, m)| (n.to_owned(), m.to_owned()))
        .collect();
    let both = ["a".to_owned(), "b".to_owned()];
    assert_eq!(
        store
            .groups()
            .store_assignment(&a, version, generation, &moves, &[], &both)
            .await
            .unwrap(),
        Rebalance::Assigned { generation: 1 }
    );
    let own = store.groups().assigned_names("g", "b").await.unwrap();
    assert_eq!(
        (own.generation, own.names, own.members),
        (1, vec!["x".to_owned()], 2)
    );
    assert_eq!(store.groups().assignment("g").await.unwrap().owners, moves);
    assert_eq!(
        store
            .groups()
            .heartbeat(&mut b, TTL)
            .await
            .unwrap()
            .rebalance_in,
        None,
        "nothing pending"
    );

    // A lease held under the member's name is what it leads; another holder's is not.
    let lease = store.acquire("x", "b", TTL).await.unwrap();
    store.acquire("y", "someone-else", TTL).await.unwrap();
    let rows = store.groups().members(Some("c/g")).await.unwrap();
    let leads: Vec<_> = rows
        .iter()
        .map(|r| (r.assigned.clone(), r.leads.clone()))
        .collect();
    assert_eq!(
        leads,
        [
            (vec!["y".to_owned()], vec![]),
            (vec!["x".to_owned()], vec!["x".to_owned()])
        ]
    );
    store.release(&lease).await.unwrap();

    a_counted_member_leaves(&store, &mut a, &b).await;
}

/// Invariant (liveness without a claim storm): a change tells the group's channel when the rebalance may be
/// claimed — `changed <ms>`, the quiet time after a settle (at most 1 s here, what the heartbeat that settled
/// answers), 0 after a leave (due at once) — so that members ask for the claim then, not at every
/// change. The group's other payload, `assigned <generation>`, is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_change_says_when_its_rebalance_may_be_claimed() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let mut a = store
        .groups()
        .join("g", "a", &spec(&["x", "y"]), TTL)
        .await
        .unwrap();
    let (_listener, mut rx) = common::listen(&db.url, a.channel()).await;
    // Bounded: a notification committed before the call returned reaches the listener within it.
    async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a notification on the group's channel within 10 s")
            .unwrap()
    }
    let changed_in = |payload: String| -> u64 {
        let ms = payload
            .strip_prefix("changed ")
            .unwrap_or_else(|| panic!("expected changed <ms>, got {payload:?}"));
        ms.parse().unwrap_or_else(|_| panic!("{payload:?}"))
    };

    // A settle (a's first heartbeat): due after the quiet time, as the heartbeat's own answer says (one statement,
    // both from the group's row as the settle left it).
    let news = store.groups().heartbeat(&mut a, TTL).await.unwrap();
    let said = changed_in(next(&mut rx).await);
    let answered = news
        .rebalance_in
        .expect("a settle makes an assignment due")
        .as_millis() as u64;
    assert!(
        (1..=1000).contains(&said) && said.abs_diff(answered) <= 5,
        "the notification said {said} ms, the heartbeat {answered} ms"
    );

    // A second member joins and settles; once assigned, a leave of a counted member is due at once.
    let mut b = store
        .groups()
        .join("g", "b", &spec(&["x", "y"]), TTL)
        .await
        .unwrap();
    store.groups().heartbeat(&mut b, TTL).await.unwrap();
    let (version, generation) = claim(&store, &a).await;
    let both = ["a".to_owned(), "b".to_owned()];
    let moves: BTreeMap<String, String> = [("x", "a"), ("y", "b")]
        .into_iter()
        .map(|(n, m)| (n.to_owned(), m.to_owned()))
        .collect();
    store
        .groups()
        .store_assignment(&a, version, generation, &moves, &[], &both)
        .await
        .unwrap();
    // b's settle said `changed <ms>` too; then the stored assignment is announced.
    loop {
        let payload = next(&mut rx).await;
        if payload == "assigned 1" {
            break;
        }
        changed_in(payload);
    }
    store.groups().leave(&b).await.unwrap();
    assert_eq!(changed_in(next(&mut rx).await), 0, "a leave is due at once");
}

/// The end of [`a_member_joins_settles_the_group_is_assigned_once_and_a_leave_is_due_at_once`]: `b` (counted)
/// leaves; the next assignment is due at once, counts `a` only, and refuses a computation from the generation
/// before the stored one.
async fn a_counted_member_leaves(
    store: &Store,
    a: &mut pgfence::groups::Member,
    b: &pgfence::groups::Member,
) {
    assert!(store.groups().leave(b).await.unwrap());
    assert!(
        !store.groups().leave(b).await.unwrap(),
        "leaving twice changes nothing"
    );
    let news = store.groups().heartbeat(a, TTL).await.unwrap();
    assert_eq!(
        news.rebalance_in,
        Some(Duration::ZERO),
        "a counted member's leave is due at once"
    );
    assert_eq!(
        counted(store, "g").await,
        [("a".to_owned(), true)],
        "a member that left is not counted"
    );
    // A computation from the generation before the stored one is refused, whoever claims.
    let (version, _) = claim(store, a).await;
    let to_a: BTreeMap<String, String> = [("x".to_owned(), "a".to_owned())].into();
    let only_a = ["a".to_owned()];
    assert_eq!(
        store
            .groups()
            .store_assignment(a, version, 0, &to_a, &[], &only_a)
            .await
            .unwrap(),
        Rebalance::Stale,
        "computed from generation 0, stored is 1"
    );
    assert_eq!(
        store
            .groups()
            .store_assignment(a, version, 1, &to_a, &[], &only_a)
            .await
            .unwrap(),
        Rebalance::Assigned { generation: 2 }
    );
    let rows = store.groups().members(Some("c/g")).await.unwrap();
    assert_eq!(
        rows.len(),
        2,
        "a member that left stays visible to operators"
    );
    assert!(rows
        .iter()
        .any(|r| r.member == "b" && !r.live && !r.settled));
    assert!(matches!(store.groups().leave(a).await, Ok(true)));
}

/// Claims the group's next assignment for `member` once it is due (waiting the database's word for how long).
async fn claim(store: &Store, member: &pgfence::groups::Member) -> (i64, i64) {
    for _ in 0..50 {
        match store.groups().claim_rebalance(member).await.unwrap() {
            Rebalance::Claim {
                version,
                generation,
                ..
            } => return (version, generation),
            Rebalance::NotDue { wait: Some(wait) } | Rebalance::Claimed { wait } => {
                tokio::time::sleep(wait + Duration::from_millis(5)).await
            }
            other => panic!("expected a claim, got {other:?}"),
        }
    }
    panic!("no claim after 50 tries");
}

/// Invariant: the same member name from two processes never counts twice — the second is refused while the first
/// is live (with the time it has left, by the database clock), joins once the first left, and the first's
/// heartbeats are then answered `superseded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_member_name_from_two_processes_never_counts_twice() {
    let db = TestDb::new().await;
    let (one, two) = (db.store("c").await, db.store("c").await);
    let mut first = one
        .groups()
        .join("g", "pod", &spec(&["x"]), TTL)
        .await
        .unwrap();
    match two.groups().join("g", "pod", &spec(&["x"]), TTL).await {
        Err(Error::MemberTaken {
            member, expires_in, ..
        }) => {
            assert_eq!(member, "pod");
            assert!(expires_in <= TTL && expires_in > TTL / 2, "{expires_in:?}");
        }
        other => panic!("expected MemberTaken, got {other:?}"),
    }
    assert_eq!(
        one.groups().members(Some("c/g")).await.unwrap().len(),
        1,
        "one row: the refused join wrote nothing"
    );
    one.groups().leave(&first).await.unwrap();
    let mut second = two
        .groups()
        .join("g", "pod", &spec(&["x"]), TTL)
        .await
        .unwrap();
    assert_eq!(second.incarnation(), 2);
    two.groups().heartbeat(&mut second, TTL).await.unwrap();
    assert!(
        second.settled(),
        "the first left in order: no flap, settled at its first heartbeat"
    );
    match one.groups().heartbeat(&mut first, TTL).await {
        Err(Error::MemberLost {
            reason: LossReason::Superseded,
            ..
        }) => {}
        other => panic!("expected superseded, got {other:?}"),
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        0,
        "a superseded heartbeat is no forgery"
    );
}

/// Invariant: bad input — through Rust or SQL — is a typed error (`InvalidInput` naming the field; SQLSTATE
/// 22023) and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_member_input_is_a_typed_error_and_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let cases: Vec<(MemberSpec, &str)> = vec![
        (spec(&["x"]).weight(0), "weight"),
        (
            spec(&["x"]).weight(pgfence::limits::MAX_WEIGHT + 1),
            "weight",
        ),
        (spec(&[]), "names"),
        (spec(&["x"]).pin(["y"]), "pin"),
        (spec(&["x"]).pin(["x"]).exclude(["x"]), "pin"),
        (spec(&["bad\u{7}name"]), "lease name"),
    ];
    for (bad, field) in cases {
        match store.groups().join("g", "a", &bad, TTL).await {
            Err(Error::InvalidInput { field: f, .. }) => assert_eq!(f, field, "{bad:?}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    for (group, member) in [("", "a"), ("g", ""), ("g\n", "a"), ("g", &*"m".repeat(257))] {
        assert!(
            matches!(
                store.groups().join(group, member, &spec(&["x"]), TTL).await,
                Err(Error::InvalidInput { .. })
            ),
            "{group:?} {member:?}"
        );
    }
    assert!(matches!(
        store
            .groups()
            .join("g", "a", &spec(&["x"]), Duration::from_millis(10))
            .await,
        Err(Error::InvalidInput { field: "ttl", .. })
    ));
    let client = db.client().await;
    for call in [
        "pgfence.join_group('c/g', 'a', 0, '{x}', '{}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', -1, '{x}', '{}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', 1001, '{x}', '{}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', 1, '{}', '{}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', 1, NULL, '{}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', 1, '{x,x}', '{}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', 1, '{x,NULL}', '{}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', 1, '{x}', '{y}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', 1, '{x}', '{x}', '{x}', 1000)",
        "pgfence.join_group('cg', 'a', 1, '{x}', '{}', '{}', 1000)",
        "pgfence.join_group('c/g', NULL, 1, '{x}', '{}', '{}', 1000)",
        "pgfence.join_group('c/g', 'a', 1, '{x}', '{}', '{}', 10)",
        "pgfence.join_group('c/g', 'a', 1, (SELECT array_agg(i::text) FROM generate_series(1, 131073) i), '{}', '{}', 1000)",
        "pgfence.heartbeat('c/g', 'a', 0, 'x', 1000)",
        "pgfence.heartbeat('c/g', 'a', 1, NULL, 1000)",
        "pgfence.leave_group('c/g', 'a', 1, NULL)",
        "pgfence.claim_rebalance('c/g', 'a', 0, 'x')",
        "pgfence.assign_group('c/g', 'a', 1, 'x', -1, 0, '{}', '{}', '{}', '{}')",
        "pgfence.assign_group('c/g', 'a', 1, 'x', 0, NULL, '{}', '{}', '{}', '{}')",
        "pgfence.assign_group('c/g', 'a', 1, 'x', 0, 0, '{x}', '{}', '{}', '{}')",
        "pgfence.assign_group('c/g', 'a', 1, 'x', 0, 0, '{x}', '{NULL}', '{}', '{}')",
        "pgfence.assign_group('c/g', 'a', 1, 'x', 0, 0, '{}', '{}', NULL, '{}')",
        "pgfence.group_assignment('nocluster')",
        "pgfence.rebalance_inputs('c/g\n')",
        "pgfence.assigned_names('c/g', NULL)",
    ] {
        let err = client
            .query(&format!("SELECT * FROM {call}"), &[])
            .await
            .expect_err(call);
        assert_eq!(sqlstate(&err), "22023", "{call}: {err}");
    }
    assert_eq!(member_rows(&db).await, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.name_sets").await
            + db.scalar("SELECT count(*) FROM pgfence.groups").await,
        0,
        "no name set or group stored"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfence.rejections").await,
        0,
        "bad input is not audited"
    );
}

/// Invariant: a heartbeat or leave with a forged secret is refused and audited, and — decided before any lock —
/// one left open in a transaction delays neither the member's own heartbeat nor its leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_heartbeat_is_refused_audited_and_holds_no_lock() {
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let (app, store) = app_store(&db, &owner, "app", "c").await;
    let mut member = store
        .groups()
        .join("g", "a", &spec(&["x"]), TTL)
        .await
        .unwrap();

    let forger = client_as(&db, &app).await;
    forger.batch_execute("BEGIN").await.unwrap();
    let forged = "0".repeat(64);
    for call in [
        format!("SELECT outcome, reason FROM pgfence.heartbeat('c/g', 'a', 1, '{forged}', 30000)"),
        format!("SELECT outcome, reason FROM pgfence.leave_group('c/g', 'a', 1, '{forged}')"),
    ] {
        let row = forger.query_one(&call, &[]).await.unwrap();
        assert_eq!(
            (row.get::<_, String>(0), row.get::<_, String>(1)),
            ("refused".into(), "bad_secret".into())
        );
    }
    // The forger's transaction stays open: the member's own calls must not wait for it.
    let started = std::time::Instant::now();
    store.groups().heartbeat(&mut member, TTL).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    forger.batch_execute("COMMIT").await.unwrap();
    let audited: i64 = db
        .scalar(&format!(
            "SELECT sum(count)::bigint FROM pgfence.rejections WHERE role = '{app}' AND reason = 'bad_secret' \
              AND operation IN ('heartbeat', 'leave_group')"
        ))
        .await;
    assert_eq!(audited, 2);
    assert!(store.groups().leave(&member).await.unwrap());
}

/// Invariant 8 for groups: a role granted another cluster can neither join, heartbeat nor read a group of this
/// cluster (refused and audited, or 42501 for a read), and sees none of its members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_role_cannot_join_or_read_a_group() {
    let db = TestDb::new().await;
    let owner = db.store("c").await;
    let app = app_role(&db, &owner, "app", Some("c")).await;
    let other = app_role(&db, &owner, "other", Some("d")).await;
    let mine = store_as(&db, &app, "c").await;
    mine.groups()
        .join("g", "a", &spec(&["x"]), TTL)
        .await
        .unwrap();
    let intruder: Store = store_as(&db, &other, "c").await;
    match intruder.groups().join("g", "b", &spec(&["x"]), TTL).await {
        Err(Error::Denied {
            reason: LossReason::NoGrant,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(intruder.groups().assignment("g").await.is_err());
    assert!(intruder.groups().assigned_names("g", "a").await.is_err());
    assert!(intruder.groups().members(None).await.unwrap().is_empty());
    let client = client_as(&db, &other).await;
    for query in [
        "SELECT count(*) FROM pgfence.group_members",
        "SELECT count(*) FROM pgfence.members",
    ] {
        match client.query_one(query, &[]).await {
            Ok(row) => assert_eq!(row.get::<_, i64>(0), 0, "{query}"),
            Err(e) => assert_eq!(sqlstate(&e), "42501", "{query}: {e}"),
        }
    }
    assert_eq!(
        mine.groups().members(Some("c/g")).await.unwrap().len(),
        1,
        "nothing of the intruder's written"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfence.rejections WHERE role = '{other}' AND reason = 'no_grant'"
        ))
        .await,
        1
    );
}

/// Invariant (hysteresis, database clock): a member whose last incarnation expired instead of leaving is a flap
/// — it is settled (counted by the next assignment) only one ttl later; one that left in order is settled at its
/// first heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_expired_settles_one_ttl_after_it_joins_again() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let ttl = Duration::from_millis(400);
    store
        .groups()
        .join("g", "a", &spec(&["x"]), ttl)
        .await
        .unwrap();
    // Wait for the expiry by the database clock (the member is not renewed).
    while db
        .scalar("SELECT count(*) FROM pgfence.group_members WHERE live")
        .await
        > 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        counted(&store, "g").await.is_empty(),
        "an expired member is not counted"
    );
    let mut again = store
        .groups()
        .join("g", "a", &spec(&["x"]), ttl)
        .await
        .unwrap();
    assert!(!again.settled(), "a flap is not settled at once");
    assert!(
        counted(&store, "g").await.is_empty(),
        "a flap that was never assigned anything is not counted before it settles"
    );
    assert_eq!(
        db.scalar("SELECT flaps::bigint FROM pgfence.members").await,
        1
    );
    // Heartbeats settle it once a ttl has passed since the join (database clock), not before.
    let joined = std::time::Instant::now();
    loop {
        store.groups().heartbeat(&mut again, ttl).await.unwrap();
        if again.settled() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        joined.elapsed() >= ttl - Duration::from_millis(100),
        "{:?}",
        joined.elapsed()
    );
    store.groups().leave(&again).await.unwrap();
    let mut orderly = store
        .groups()
        .join("g", "a", &spec(&["x"]), ttl)
        .await
        .unwrap();
    store.groups().heartbeat(&mut orderly, ttl).await.unwrap();
    assert!(
        orderly.settled(),
        "after a leave, no flap: settled at its first heartbeat"
    );
    assert_eq!(
        db.scalar("SELECT flaps::bigint FROM pgfence.members").await,
        0
    );
}

/// Liveness: a join waiting for the member's row (held by a transaction left open) waits a bounded time and then
/// fails with PF003 naming the blocker, never hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_blocked_on_the_members_row_fails_in_bounded_time_naming_the_blocker() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let first = store
        .groups()
        .join("g", "a", &spec(&["x"]), TTL)
        .await
        .unwrap();
    store.groups().leave(&first).await.unwrap();
    let blocker = db.client().await;
    blocker
        .batch_execute(
            "SET application_name = 'member-row-blocker'; BEGIN; \
             SELECT 1 FROM pgfence.members WHERE member = 'a' FOR UPDATE",
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let result = store.groups().join("g", "a", &spec(&["x"]), TTL).await;
    let waited = started.elapsed();
    match result {
        Err(e) => {
            assert_eq!(
                e.sqlstate(),
                Some(pgfence::sqlstate::SqlState::LockWaitEnded),
                "{e}"
            );
            assert!(e.to_string().contains("member-row-blocker"), "{e}");
        }
        Ok(m) => panic!("joined while the row was locked: {m:?}"),
    }
    // The bound: pgfence._lock_wait_ms() (the takeover grace, 2 s, + 5 s).
    assert!(waited < Duration::from_secs(9), "{waited:?}");
    blocker.batch_execute("ROLLBACK").await.unwrap();
    store
        .groups()
        .join("g", "a", &spec(&["x"]), TTL)
        .await
        .unwrap();
}

/// Invariant (the model's finding, `docs/model.md`): an assignment computed while a counted member was away is
/// refused once that member is back (`member_back`, answered `Stale`) and writes nothing — a late store (its
/// reply lost, run after the member joined again under its name) must not move the names of a member that counts
/// now; the claimant's next computation, counting it, is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_computation_that_left_out_a_member_that_is_back_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
    let store = db.store("c").await;
    let short = Duration::from_millis(600);
    let mut b = store
        .groups()
        .join("g", "b", &spec(&["x", "y"]), TTL)
        .await
        .unwrap();
    let mut a = store
        .groups()
        .join("g", "a", &spec(&["x", "y"]), short)
        .await
        .unwrap();
    store.groups().heartbeat(&mut b, TTL).await.unwrap();
    store.groups().heartbeat(&mut a, short).await.unwrap();
    let (version, generation) = claim(&store, &b).await;
    let both = ["a".to_owned(), "b".to_owned()];
    let first: BTreeMap<String, String> = [("x", "a"), ("y", "b")]
        .into_iter()
        .map(|(n, m)| (n.to_owned(), m.to_owned()))
        .collect();
    assert_eq!(
        store
            .groups()
            .store_assignment(&b, version, generation, &first, &[], &both)
            .await
            .unwrap(),
        Rebalance::Assigned { generation: 1 }
    );
    // `a` expires (by the database clock): a rebalance is due, and b computes one without it.
    while db
        .scalar("SELECT count(*) FROM pgfence.members WHERE member = 'a' AND expires_at > clock_timestamp()")
        .await
        > 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (version, generation) = claim(&store, &b).await;
    assert_eq!(generation, 1);
    let only_b = ["b".to_owned()];
    let without_a: BTreeMap<String, String> = [("x".to_owned(), "b".to_owned())].into();
    // `a` joins again under its name before the store runs: counted by the stored assignment, it counts at once.
    store
        .groups()
        .join("g", "a", &spec(&["x", "y"]), TTL)
        .await
        .unwrap();
    let before = db
        .scalar("SELECT count(*) FROM pgfence.assignments WHERE member = 'a'")
        .await;
    assert_eq!(
        store
            .groups()
            .store_assignment(&b, version, generation, &without_a, &[], &only_b)
            .await
            .unwrap(),
        Rebalance::Stale,
        "computed without a member that is back"
    );
    assert_eq!(
        (
            db.scalar("SELECT count(*) FROM pgfence.assignments WHERE member = 'a'")
                .await,
            db.scalar("SELECT generation FROM pgfence.groups").await,
            db.scalar("SELECT count(*) FROM pgfence.members WHERE counted")
                .await,
        ),
        (before, 1, 2),
        "a refused store writes nothing"
    );
    assert_eq!(
        store
            .groups()
            .store_assignment(&b, version, generation, &BTreeMap::new(), &[], &both)
            .await
            .unwrap(),
        Rebalance::Assigned { generation: 2 },
        "the computation counting it is stored"
    );
    assert_eq!(store.groups().assignment("g").await.unwrap().owners, first);
}
