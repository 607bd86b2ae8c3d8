//! The native guard, and every SQL shape of the portable guard (`pgfence._install_guard`), against the portable
//! guard's plpgsql shape, over the verdict's whole truth table: every combination of the lease's state, the
//! presented epoch, the timeline, the secret, the caller's grant, the isolation level and whether the session
//! remembers the tenure, called through the guard under test (`pgfence_native.fence`, or a copy of an SQL shape)
//! in one session and `pgfence.fence` in another with the same identity. Each call runs in a transaction of its own that is rolled
//! back; the two must agree on everything a caller or a later statement of the transaction can see — the whole
//! answer row (or the error's SQLSTATE), the advisory locks the session holds after it, the tenure-secret and
//! guard-held settings the raw-SQL enforcement reads, and the write mark.
//!
//! Invariants checked: 3, 4 and 5 on the native path — it admits exactly what the portable guard admits, refuses
//! with the same reason, and leaves the transaction in the same state. Shown to fail on the gate mutations
//! `native-ignores-secret`, `native-remembers-refusals`, `native-ignores-grant`,
//! `native-ignores-execute-privilege`, `native-ignores-expiry`, `native-ignores-timeline`, `native-any-isolation`,
//! `native-without-lock` and `native-skips-the-write-mark`; the other three native mutations concern a takeover
//! in flight, a snapshot older than the lock and a schema created anew, which no single call's state shows: the
//! same comparison at those moments is tests/native/moments.rs. The SQL shapes' table needs no native build (it
//! runs on every server of the version matrix, .ci/pg-matrix) and is shown to fail on `sql-shape-ignores-grant`.

use crate::common;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use common::TestDb;

/// What the lease looks like when the calls arrive, relative to the tenure `T` the native session remembers.
#[derive(Clone, Copy, Debug)]
enum LeaseState {
    /// `T` held and unexpired.
    Held,
    /// `T` held, its expiry passed, nobody after it.
    Expired,
    /// `T` released by its holder.
    Released,
    /// `T` ended by an operator's force-release.
    ForceReleased,
    /// Another holder acquired after `T`'s release: the current epoch is `T`'s + 1.
    Superseded,
    /// The calls name a lease that does not exist.
    Unknown,
}

/// Who calls: the session's login role (what the cluster grant is judged by) and its current role (what
/// EXECUTE is judged by).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Grant {
    /// Granted the lease's cluster.
    OwnCluster,
    /// Granted another cluster only.
    OtherCluster,
    /// Granted nothing (and so may not execute the guard).
    None,
    /// Granted every cluster.
    EveryCluster,
    /// Granted the cluster and another; the cluster's grant is revoked after the native session remembered `T`.
    Revoked,
    /// Not granted itself: a member of a role granted the cluster.
    ViaMembership,
    /// Logged in as a granted role, then `SET ROLE` to a role it is a member of that is granted nothing.
    SetRole,
}

const STATES: [LeaseState; 6] = [
    LeaseState::Held,
    LeaseState::Expired,
    LeaseState::Released,
    LeaseState::ForceReleased,
    LeaseState::Superseded,
    LeaseState::Unknown,
];
const GRANTS: [Grant; 7] = [
    Grant::OwnCluster,
    Grant::OtherCluster,
    Grant::None,
    Grant::EveryCluster,
    Grant::Revoked,
    Grant::ViaMembership,
    Grant::SetRole,
];
const ISOLATION: [&str; 3] = ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"];

/// The presented secret, relative to `T`.
#[derive(Clone, Copy, Debug)]
enum Secret {
    Right,
    Wrong,
    /// The secret of the tenure before `T` (same holder).
    Previous,
    Null,
}
const SECRETS: [Secret; 4] = [Secret::Right, Secret::Wrong, Secret::Previous, Secret::Null];

/// The roles of the table, made once: (login role, role to `SET ROLE` to) per [`Grant`].
struct Roles(BTreeMap<String, (String, Option<String>)>);

impl Roles {
    async fn make(db: &TestDb, owner: &tokio_postgres::Client) -> Roles {
        let grant = |role: String, cluster: &'static str| async move {
            let cluster = if cluster == "*" {
                "NULL".to_owned()
            } else {
                format!("'{cluster}'")
            };
            owner
                .batch_execute(&format!(
                    "SELECT pgfence.grant_application('{role}', {cluster})"
                ))
                .await
                .unwrap();
            role
        };
        let mut map = BTreeMap::new();
        let own = grant(common::role(db, "own").await, "c").await;
        map.insert(format!("{:?}", Grant::OwnCluster), (own.clone(), None));
        let other = grant(common::role(db, "other").await, "d").await;
        map.insert(format!("{:?}", Grant::OtherCluster), (other, None));
        let none = common::role(db, "none").await;
        map.insert(format!("{:?}", Grant::None), (none.clone(), None));
        let every = grant(common::role(db, "every").await, "*").await;
        map.insert(format!("{:?}", Grant::EveryCluster), (every, None));
        let revoked = grant(grant(common::role(db, "revoked").await, "d").await, "c").await;
        map.insert(format!("{:?}", Grant::Revoked), (revoked, None));
        let team = format!("{}_team", db.name);
        owner
            .batch_execute(&format!("CREATE ROLE {team} NOLOGIN"))
            .await
            .unwrap();
        let team = grant(team, "c").await;
        let member = common::role(db, "member").await;
        owner
            .batch_execute(&format!("GRANT {team} TO {member}; GRANT {none} TO {own}"))
            .await
            .unwrap();
        map.insert(format!("{:?}", Grant::ViaMembership), (member, None));
        map.insert(format!("{:?}", Grant::SetRole), (own, Some(none)));
        Roles(map)
    }

    fn of(&self, grant: Grant) -> &(String, Option<String>) {
        &self.0[&format!("{grant:?}")]
    }
}

/// A SQL literal of `text` (or NULL).
fn literal(text: Option<&str>) -> String {
    text.map_or_else(
        || "NULL".to_owned(),
        |t| format!("'{}'", t.replace('\'', "''")),
    )
}

/// One call through `function` in a transaction of its own at `isolation`, and what the session shows after it:
/// the answer row as JSON (or the SQLSTATE), then the advisory locks it holds and the settings pgfence reads
/// (the write mark's second blanked: two sessions may straddle one). Rolled back.
async fn observe(
    c: &tokio_postgres::Client,
    function: &str,
    isolation: &str,
    (lease, epoch, secret): (&str, i64, Option<&str>),
    lock_key: i32,
) -> String {
    let sql = format!(
        "BEGIN ISOLATION LEVEL {isolation}; \
         SELECT row_to_json(f)::text FROM {function}({}, {epoch}, {}, 'op', 't', 'k') f; \
         SELECT concat_ws(' | ', \
           (SELECT string_agg(mode || ':' || classid || ':' || objid || ':' || objsubid, ',' \
                              ORDER BY mode, classid, objid, objsubid) \
              FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()), \
           'secret=' || CASE coalesce(current_setting('pgfence.tenure_secret_{lock_key}', true), '') \
                          WHEN '' THEN 'none' WHEN {presented} THEN 'presented' ELSE 'other' END, \
           'held=' || coalesce(current_setting('pgfence.guard_held_{lock_key}', true), ''), \
           'mark=' || regexp_replace(coalesce(current_setting('pgfence.write_mark', true), ''), \
                                     '^(-?[0-9]+):[0-9]+:', '\\1:*:'))",
        literal(Some(lease)),
        literal(secret),
        presented = literal(secret),
    );
    let seen = match c.simple_query(&sql).await {
        Ok(messages) => messages
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some(r.get(0).unwrap_or("").to_owned())
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(" || "),
        Err(e) => format!("error {}", e.code().map_or("?", |s| s.code())),
    };
    c.batch_execute("ROLLBACK").await.unwrap();
    seen
}

/// The three sessions of the table: the guard under test's (`function`: `pgfence_native.fence`, whose memory is
/// the native guard's, or a copy of an SQL shape, whose memory is the session's `pgfence._known_slot`), the
/// portable guard's (same identity) and the owner's, which makes the leases' states.
struct Sessions {
    native: tokio_postgres::Client,
    function: String,
    portable: tokio_postgres::Client,
    owner: tokio_postgres::Client,
}

impl Sessions {
    /// Both calling sessions as `who` (login role, then current role), or back to the superuser they logged in as.
    async fn become_(&self, who: Option<&(String, Option<String>)>) {
        let mut sql = "RESET ROLE; RESET SESSION AUTHORIZATION;".to_owned();
        if let Some((login, role)) = who {
            write!(sql, " SET SESSION AUTHORIZATION {login};").unwrap();
            if let Some(role) = role {
                write!(sql, " SET ROLE {role};").unwrap();
            }
        }
        for c in [&self.native, &self.portable] {
            c.batch_execute(&sql).await.unwrap();
        }
    }

    /// A new tenure of `lease` (holder `holder`): its epoch and secret.
    async fn acquire(&self, lease: &str, holder: &str) -> (i64, String) {
        common::sql_acquire(&self.owner, lease, holder, 600_000).await
    }

    /// The epochs of `lease` the session under test remembers (read as the superuser).
    async fn remembered(&self, lease: &str, who: &(String, Option<String>)) -> Vec<i64> {
        self.become_(None).await;
        let epochs = self.memory(lease).await;
        self.become_(Some(who)).await;
        epochs
    }

    /// A copy of an SQL shape gets `pgfence.fence`'s privileges again (a grant or a revocation of a cluster
    /// re-grants a role's privileges on the documented functions only).
    async fn sync_privileges(&self) {
        if self.function == "pgfence_native.fence" {
            return;
        }
        self.owner
            .batch_execute(&format!(
                "UPDATE pg_proc SET proacl = (SELECT f.proacl FROM pg_proc f \
                  WHERE f.oid = 'pgfence.fence(text, bigint, text, text, text, text)'::regprocedure) \
                  WHERE oid = '{}(text, bigint, text, text, text, text)'::regprocedure",
                self.function
            ))
            .await
            .unwrap();
    }

    /// The epochs of `lease` the session under test remembers: the native guard's memory, or the lock key's memory
    /// of the SQL shapes ("<lock key> <epoch> <lease>" in the session setting `pgfence._known_slot` names).
    async fn memory(&self, lease: &str) -> Vec<i64> {
        if self.function == "pgfence_native.fence" {
            return common::remembered(&self.native, lease).await;
        }
        self.native
            .query(
                "SELECT m[1]::bigint FROM regexp_match(coalesce(current_setting(pgfence._known_slot($1), true), ''),                  '^[0-9]+ ([0-9]+) (.*)$') m WHERE m[2] = $1",
                &[&lease],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}

/// One row of the table's setups: the calls of every epoch, secret and isolation level against one lease.
#[derive(Clone, Copy, Debug)]
struct Setup {
    grant: Grant,
    state: LeaseState,
    old_timeline: bool,
    remembered: bool,
}

/// The tenure `T` the calls are judged against: the lease, `T`'s epoch and secret, the previous tenure's secret,
/// the lease's lock key, and the name the calls present.
struct Tenure {
    lease: String,
    epoch: i64,
    secret: String,
    previous_secret: String,
    lock_key: i32,
    presented: String,
}

/// Makes `setup`'s world for lease number `i`: two tenures of one holder (the previous one and `T`), `T`
/// remembered by the native session when the setup says so (admitted once as the superuser), both sessions
/// becoming the caller, the grant revoked when it is, then the lease's state and timeline.
async fn prepare(s: &Sessions, roles: &Roles, setup: Setup, i: usize) -> Tenure {
    let lease = format!("c/x{i}");
    let (_, previous_secret) = s.acquire(&lease, "h").await;
    let (epoch, secret) = s.acquire(&lease, "h").await;
    let lock_key = common::lock_key(&s.owner, &lease).await;
    let who = roles.of(setup.grant);
    if setup.grant == Grant::Revoked {
        s.owner
            .batch_execute(&format!(
                "SELECT pgfence.grant_application('{}', 'c')",
                who.0
            ))
            .await
            .unwrap();
        s.sync_privileges().await;
    }
    s.become_(None).await;
    if setup.remembered {
        // Admitted once, committed, by each session: the native session remembers the tenure in its memory, the
        // portable one in its session setting (pgfence._known_slot); both then take their fast paths.
        for (c, function) in [
            (&s.native, s.function.as_str()),
            (&s.portable, "pgfence.fence"),
        ] {
            let outcome: String = c
                .query_one(
                    &format!("SELECT outcome FROM {function}($1, $2, $3, 'op', 't', 'k')"),
                    &[&lease, &epoch, &secret],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(outcome, "ok", "{setup:?}: T not admitted by {function}");
        }
        let epochs = s.memory(&lease).await;
        assert_eq!(epochs.len(), 1, "{setup:?}: T not remembered");
    }
    s.become_(Some(who)).await;
    if setup.grant == Grant::Revoked {
        s.owner
            .batch_execute(&format!("SELECT pgfence.revoke('{}', 'c')", who.0))
            .await
            .unwrap();
        s.sync_privileges().await;
    }
    let change = match setup.state {
        LeaseState::Held | LeaseState::Unknown => String::new(),
        LeaseState::Expired => format!(
            "UPDATE pgfence.leases SET expires_at = now() - interval '1 second' WHERE name = '{lease}';"
        ),
        LeaseState::Released => format!("SELECT pgfence.release('{lease}', {epoch}, '{secret}');"),
        LeaseState::ForceReleased => format!("SELECT pgfence.force_release('{lease}');"),
        LeaseState::Superseded => format!(
            "SELECT pgfence.release('{lease}', {epoch}, '{secret}'); SELECT pgfence.acquire('{lease}', 'h2', 600000);"
        ),
    };
    let timeline = if setup.old_timeline && !matches!(setup.state, LeaseState::Unknown) {
        format!("UPDATE pgfence.leases SET timeline = timeline - 1 WHERE name = '{lease}';")
    } else {
        String::new()
    };
    s.owner
        .batch_execute(&format!("{change}{timeline}"))
        .await
        .unwrap();
    let presented = match setup.state {
        LeaseState::Unknown => format!("c/gone{i}"),
        _ => lease.clone(),
    };
    Tenure {
        lease,
        epoch,
        secret,
        previous_secret,
        lock_key,
        presented,
    }
}

/// Every setup of the table, in a fixed order.
fn setups() -> Vec<Setup> {
    let mut out = Vec::new();
    for grant in GRANTS {
        for state in STATES {
            for old_timeline in [false, true] {
                for remembered in [false, true] {
                    out.push(Setup {
                        grant,
                        state,
                        old_timeline,
                        remembered,
                    });
                }
            }
        }
    }
    out
}

/// The calls of one setup, as (epoch, secret, isolation): every combination, the one that may make a session
/// forget `T` — `T`'s own epoch and secret under READ COMMITTED, when refused — last, so that every other call
/// meets the memory as the setup made it; then that call again, as a caller retries.
fn calls(t: &Tenure) -> Vec<(i64, Secret, &'static str)> {
    let mut out = Vec::new();
    for epoch in [t.epoch - 1, t.epoch, t.epoch + 1] {
        for secret in SECRETS {
            for isolation in ISOLATION {
                out.push((epoch, secret, isolation));
            }
        }
    }
    out.sort_by_key(|(e, s, i)| *e == t.epoch && matches!(s, Secret::Right) && *i == ISOLATION[0]);
    // And once more: a caller retrying after its transaction was rolled back meets what the first call left.
    out.push((t.epoch, Secret::Right, ISOLATION[0]));
    out
}

/// Runs one setup: every call through both guards. Returns the disagreements (described without secrets) and
/// counts the portable guard's answers into `tally`.
async fn run_setup(
    s: &Sessions,
    roles: &Roles,
    setup: Setup,
    i: usize,
    tally: &mut BTreeMap<String, usize>,
) -> Vec<String> {
    let t = prepare(s, roles, setup, i).await;
    let mut differ = Vec::new();
    let all = calls(&t);
    for (k, (epoch, secret, isolation)) in all.iter().copied().enumerate() {
        if setup.remembered && k + 2 == all.len() {
            let remembered = s.remembered(&t.lease, roles.of(setup.grant)).await;
            assert_eq!(
                remembered,
                vec![t.epoch],
                "{setup:?}: the memory changed before the last call"
            );
        }
        let value = match secret {
            Secret::Right => Some(t.secret.as_str()),
            Secret::Wrong => {
                Some("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
            }
            Secret::Previous => Some(t.previous_secret.as_str()),
            Secret::Null => None,
        };
        let call = (t.presented.as_str(), epoch, value);
        let native = observe(&s.native, &s.function, isolation, call, t.lock_key).await;
        let portable = observe(&s.portable, "pgfence.fence", isolation, call, t.lock_key).await;
        let answer = portable.split(" || ").next().unwrap_or("").to_owned();
        let answer = answer
            .split(",\"current_epoch\"")
            .next()
            .unwrap_or("")
            .to_owned();
        *tally.entry(answer).or_default() += 1;
        if native != portable {
            differ.push(format!(
                "{setup:?}, epoch T{:+}, secret {secret:?}, {isolation}:\n  {}: {native}\n  portable: {portable}",
                epoch - t.epoch,
                s.function
            ));
        }
    }
    differ
}

/// Runs the whole table through `s` and checks that the two guards agreed on every call, that every combination
/// ran and that the table reached every answer the verdict gives.
async fn run_table(s: &Sessions, roles: &Roles) {
    let mut tally = BTreeMap::new();
    let mut differ = Vec::new();
    let all = setups();
    for (i, setup) in all.iter().copied().enumerate() {
        differ.extend(run_setup(s, roles, setup, i, &mut tally).await);
        // Enough to show what differs; the rest of the table would say the same again.
        if differ.len() >= 8 {
            break;
        }
    }
    let combinations: usize = tally.values().sum();
    assert!(
        differ.is_empty(),
        "the guards disagree ({} disagreements in the first {combinations} calls):\n{}",
        differ.len(),
        differ.join("\n")
    );
    // Every combination, and each setup's retry of its last call.
    assert_eq!(combinations, 6 * 3 * 2 * 4 * 7 * 3 * 2 + all.len());
    // The table reached every answer the verdict gives: a test that met only one kind would prove little.
    let seen: Vec<&String> = tally.keys().collect();
    for want in [
        "{\"outcome\":\"ok\"",
        "\"reason\":\"superseded\"",
        "\"reason\":\"future_epoch\"",
        "\"reason\":\"released\"",
        "\"reason\":\"expired\"",
        "\"reason\":\"failover\"",
        "\"reason\":\"bad_secret\"",
        "\"reason\":\"unknown_lease\"",
        "\"reason\":\"no_grant\"",
        "error 42501",
        "error 22023",
        "error PF004",
    ] {
        assert!(
            seen.iter().any(|k| k.contains(want)),
            "no call answered {want}: {tally:#?}"
        );
    }
}

/// Invariants 3, 4 and 5 on the native path: over every combination of lease state (held, expired, released,
/// force-released, superseded, unknown), presented epoch (previous, current, future), timeline (current, before
/// the last promotion), secret (right, wrong, the previous tenure's, NULL), grant (own cluster, another cluster,
/// none, every cluster, revoked, through membership, SET ROLE), isolation level and memory (remembered or not),
/// the native guard and the portable guard (the shape the server's migrate installed) leave the caller the same
/// answer and the transaction the same locks, settings and write mark. 6,048 combinations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_guard_agrees_with_the_verdict_on_every_combination() {
    let db = TestDb::new().await;
    if !common::create_native(&db.client().await).await {
        return;
    }
    let s = Sessions {
        native: db.client().await,
        function: "pgfence_native.fence".to_owned(),
        portable: db.client().await,
        owner: db.client().await,
    };
    let roles = Roles::make(&db, &s.owner).await;
    run_table(&s, &roles).await;
}

/// The shapes of `pgfence.fence` that `pgfence._install_guard` installs besides the reference, plpgsql.
const SQL_SHAPES: [&str; 1] = ["sql"];

/// Installs the plpgsql shape as `pgfence.fence` (the reference) and a copy of `shape` beside it, with
/// `pgfence.fence`'s owner (its privileges: [`Sessions::sync_privileges`]); returns the copy's name.
async fn install_beside(owner: &tokio_postgres::Client, shape: &str) -> String {
    let name = format!("pgfence._fence_shape_{shape}");
    let args = "(text, bigint, text, text, text, text)";
    owner
        .batch_execute(&format!(
            "SELECT pgfence._install_guard('plpgsql'); SELECT pgfence._install_guard('{shape}'); \
             DO $$ BEGIN \
                 EXECUTE replace(pg_get_functiondef('pgfence.fence{args}'::regprocedure), \
                                 'FUNCTION pgfence.fence(', 'FUNCTION {name}('); \
                 EXECUTE format('ALTER FUNCTION {name}{args} OWNER TO %s', \
                                (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'pgfence')); \
                 REVOKE ALL ON FUNCTION {name}{args} FROM PUBLIC; \
             END $$; \
             SELECT pgfence._install_guard('plpgsql')"
        ))
        .await
        .unwrap();
    let languages: Vec<String> = owner
        .query(
            &format!(
                "SELECT l.lanname::text FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang \
                  WHERE p.oid IN ('pgfence.fence{args}'::regprocedure, '{name}{args}'::regprocedure) \
                  ORDER BY p.oid = '{name}{args}'::regprocedure"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        languages,
        ["plpgsql", shape],
        "the reference, then the copy"
    );
    name
}

/// Invariants 3, 4 and 5 through every SQL shape of the portable guard: the same table as the native guard's
/// (6,048 combinations), each shape `pgfence._install_guard` can install called beside the plpgsql shape, on
/// whatever server runs the test (a shape is forced, not chosen by the server's version): the same answer, the
/// same locks, settings and write mark. Needs no native build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sql_shape_of_the_guard_agrees_with_the_verdict_on_every_combination() {
    for shape in SQL_SHAPES {
        // A database of its own per shape (the table's leases and roles are made anew).
        let db = TestDb::new().await;
        let owner = db.client().await;
        // The installer knows the reference and SQL_SHAPES, no other.
        let unknown = owner
            .query_one("SELECT pgfence._install_guard('c')", &[])
            .await
            .unwrap_err();
        assert_eq!(unknown.code().map(|c| c.code()), Some("22023"));
        let roles = Roles::make(&db, &owner).await;
        let s = Sessions {
            function: install_beside(&owner, shape).await,
            native: db.client().await,
            portable: db.client().await,
            owner,
        };
        s.sync_privileges().await;
        run_table(&s, &roles).await;
    }
}
