//! The SQL as the migrations leave it: `sql/` holds one file per function of the schema `pgfence`, its whole
//! definition as PostgreSQL prints it (`pg_get_functiondef`) on a freshly migrated database. A migration that
//! changes a function changes its file (`PGFENCE_BLESS=1 cargo test --test suite sql_source::` rewrites them), so
//! the diff in `sql/` shows the function's whole new text in one place, whichever migration changed it. And the
//! limits and the guard lock's class, named once in the SQL, are the values of the Rust constants.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::TestDb;

/// The repository's root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory of the functions' sources.
fn sql_dir() -> PathBuf {
    repo().join("sql")
}

/// Whether this run rewrites `sql/` instead of comparing with it.
fn blessing() -> bool {
    std::env::var("PGFENCE_BLESS").is_ok_and(|v| v == "1")
}

/// The migration (its directory name) whose `up.sql` defines `pgfence.<name>` last, in the order they apply: the
/// one to read, or to follow with a new migration, when the function is to change.
fn defined_in(name: &str) -> Option<String> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(repo().join("migrations"))
        .expect("read migrations/")
        .map(|e| e.expect("a migrations/ entry").path())
        .filter(|p| p.join("up.sql").is_file())
        .collect();
    dirs.sort();
    let patterns = [
        format!("CREATE FUNCTION pgfence.{name}("),
        format!("CREATE OR REPLACE FUNCTION pgfence.{name}("),
    ];
    dirs.iter()
        .rev()
        .find(|dir| {
            let up = std::fs::read_to_string(dir.join("up.sql")).expect("read up.sql");
            patterns.iter().any(|p| up.contains(p.as_str()))
        })
        .map(|dir| dir.file_name().unwrap().to_string_lossy().into_owned())
}

/// Every function of the schema `pgfence` on a freshly migrated database, by name, as its file in `sql/` reads.
async fn functions_as_migrated() -> BTreeMap<String, String> {
    let db = TestDb::new().await;
    let client = db.client().await;
    let rows = client
        .query(
            "SELECT p.proname::text, pg_catalog.pg_get_functiondef(p.oid) \
               FROM pg_catalog.pg_proc p \
              WHERE p.pronamespace = 'pgfence'::regnamespace \
              ORDER BY 1",
            &[],
        )
        .await
        .expect("read the functions' definitions");
    let mut functions = BTreeMap::new();
    for row in rows {
        let name: String = row.get(0);
        let definition: String = row.get(1);
        let migration = defined_in(&name)
            .unwrap_or_else(|| panic!("no migration has CREATE FUNCTION pgfence.{name}("));
        let text = format!(
            "-- pgfence.{name} as the migrations leave it; defined last in migrations/{migration}/up.sql.\n\
             -- Generated from the database (see README.md): edit the migrations, then bless.\n{definition}"
        );
        assert!(
            functions.insert(name.clone(), text).is_none(),
            "pgfence.{name} is overloaded: sql/ has one file per name"
        );
    }
    functions
}

/// Every Rust source of the library (`src/`) and of the command line (`cli/src/`), by path, with the SQL in its
/// string literals made comparable: line continuations (`\` at the end of a line) joined. Their SQL is held to
/// the same one-text rules as the migrations'.
fn rust_sources() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.expect("a source entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let key = path
                    .strip_prefix(repo())
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                out.insert(key, text.replace("\\\n", " "));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&repo().join("src"), &mut out);
    walk(&repo().join("cli").join("src"), &mut out);
    assert!(
        out.contains_key("src/lib.rs"),
        "the Rust sources were not found"
    );
    out
}

/// The `.sql` files in `sql/`, by function name.
fn files_in_sql_dir() -> BTreeMap<String, String> {
    let Ok(entries) = std::fs::read_dir(sql_dir()) else {
        return BTreeMap::new();
    };
    entries
        .map(|e| e.expect("an sql/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, text)
        })
        .collect()
}

/// Each function of the schema has its file in `sql/`, with its definition as the migrations leave it; no file
/// names a function the migrations do not create. `PGFENCE_BLESS=1` rewrites the files (and removes the extra ones)
/// instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_function_has_its_current_text_in_sql_dir() {
    let migrated = functions_as_migrated().await;
    let files = files_in_sql_dir();
    if blessing() {
        std::fs::create_dir_all(sql_dir()).expect("create sql/");
        for name in files.keys().filter(|n| !migrated.contains_key(*n)) {
            std::fs::remove_file(sql_dir().join(format!("{name}.sql")))
                .expect("remove a stale file");
        }
        for (name, text) in &migrated {
            if files.get(name) != Some(text) {
                std::fs::write(sql_dir().join(format!("{name}.sql")), text).expect("write sql/");
            }
        }
        return;
    }
    let missing: Vec<&String> = migrated
        .keys()
        .filter(|n| !files.contains_key(*n))
        .collect();
    let extra: Vec<&String> = files
        .keys()
        .filter(|n| !migrated.contains_key(*n))
        .collect();
    let differ: Vec<&String> = migrated
        .iter()
        .filter(|(n, text)| files.get(*n).is_some_and(|f| f != *text))
        .map(|(n, _)| n)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && differ.is_empty(),
        "sql/ is not the migrations' SQL (run PGFENCE_BLESS=1 cargo test --test suite sql_source:: and review \
         the diff): no file for {missing:?}; a file but no such function for {extra:?}; a different text for \
         {differ:?}"
    );
}

/// Every limit the database checks and the guard lock's class are the Rust API's constants, so that neither side
/// can change alone: the SQL names each once (pgfence._max_name_len() …), the library exports each as a constant.
/// (`MAX_PAYLOAD_BYTES`, `MAX_PAYLOAD_DEPTH` and `MAX_SHARDS` are the library's alone: the database checks no
/// payload depth or shard count, and stores up to 16 MiB of jsonb as a backstop, `pgfence._payload_problem`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_constants_are_the_rust_constants() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT pgfence._max_name_len()::bigint, pgfence._max_cluster_len()::bigint, \
                    pgfence._max_holder_len()::bigint, pgfence._max_label_len()::bigint, \
                    pgfence._max_kind_len()::bigint, pgfence._min_ttl_ms(), pgfence._max_ttl_ms(), \
                    pgfence._max_member_weight()::bigint, pgfence._max_group_names()::bigint, \
                    pgfence._guard_lock_class()",
            &[],
        )
        .await
        .expect("read the SQL constants");
    let sql = |i: usize| row.get::<_, i64>(i);
    assert_eq!(sql(0), pgfence::limits::MAX_NAME_LEN as i64, "MAX_NAME_LEN");
    assert_eq!(
        sql(0),
        pgfence::limits::MAX_GROUP_LEN as i64,
        "MAX_GROUP_LEN"
    );
    assert_eq!(
        sql(1),
        pgfence::limits::MAX_CLUSTER_LEN as i64,
        "MAX_CLUSTER_LEN"
    );
    assert_eq!(
        sql(2),
        pgfence::limits::MAX_HOLDER_LEN as i64,
        "MAX_HOLDER_LEN"
    );
    assert_eq!(
        sql(3),
        pgfence::limits::MAX_OPERATION_LEN as i64,
        "MAX_OPERATION_LEN"
    );
    assert_eq!(sql(4), pgfence::limits::MAX_KIND_LEN as i64, "MAX_KIND_LEN");
    assert_eq!(
        sql(5),
        pgfence::limits::MIN_TTL.as_millis() as i64,
        "MIN_TTL"
    );
    assert_eq!(
        sql(6),
        pgfence::limits::MAX_TTL.as_millis() as i64,
        "MAX_TTL"
    );
    assert_eq!(sql(7), i64::from(pgfence::limits::MAX_WEIGHT), "MAX_WEIGHT");
    assert_eq!(
        sql(8),
        pgfence::limits::MAX_GROUP_NAMES as i64,
        "MAX_GROUP_NAMES"
    );
    assert_eq!(
        row.get::<_, i32>(9),
        pgfence::schema::GUARD_LOCK_CLASS,
        "GUARD_LOCK_CLASS"
    );
    // The secret has no limit function: its length is what acquire issues.
    let secret: String = client
        .query_one(
            "SELECT secret FROM pgfence.acquire('c/sql-constants', 'h', 60000)",
            &[],
        )
        .await
        .expect("acquire")
        .get(0);
    assert_eq!(secret.len(), pgfence::limits::SECRET_LEN, "SECRET_LEN");
    // The shards of a sharded controller are names of its group: within the group's limit.
    assert!(pgfence::limits::MAX_SHARDS as usize <= pgfence::limits::MAX_GROUP_NAMES);
}

/// Invariant: the native guard (`native/pgfence_native.c`, which cannot call SQL for them) uses the names the SQL
/// uses: the advisory lock class (`PGFENCE_LOCK_CLASS`, as `pgfence._guard_lock_class()`) and the marker setting
/// a native admission leaves (`pgfence._guard_held_setting(lock_key)`, which `pgfence._await_takeover` reads), for
/// every kind of lock key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_guard_names_what_the_sql_names() {
    let source = std::fs::read_to_string(repo().join("native/pgfence_native.c"))
        .expect("read the native guard");
    let after = |marker: &str| {
        let at = source
            .find(marker)
            .unwrap_or_else(|| panic!("no {marker:?} in native/pgfence_native.c"));
        source[at + marker.len()..].to_owned()
    };
    let class: i32 = after("#define PGFENCE_LOCK_CLASS ")
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("PGFENCE_LOCK_CLASS is a number");
    let format = after("snprintf(setting, sizeof(setting), \"")
        .split('"')
        .next()
        .expect("the marker's format")
        .to_owned();
    assert_eq!(format.matches("%d").count(), 1, "{format}");
    let db = TestDb::new().await;
    let client = db.client().await;
    let sql_class: i32 = client
        .query_one("SELECT pgfence._guard_lock_class()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(class, sql_class, "PGFENCE_LOCK_CLASS");
    for key in [i32::MIN, -1, 0, 7, i32::MAX] {
        let sql: String = client
            .query_one("SELECT pgfence._guard_held_setting($1)", &[&key])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            format.replace("%d", &key.to_string()),
            sql,
            "the marker of lock key {key}"
        );
    }
}

/// The lease-row comparisons of `text` that judge whether a tenure is live (`x.expires_at` or `x.timeline`
/// compared with anything, `x.state` compared with `'held'`), outside comments, as written.
fn liveness_comparisons(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("--").next().unwrap_or("");
        for column in [".expires_at", ".timeline", ".state"] {
            let mut from = 0;
            while let Some(k) = code[from..].find(column) {
                let at = from + k;
                from = at + column.len();
                let alias = code[..at]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .count();
                let rest = code[from..].trim_start();
                // A qualified operator is the same comparison (the SQL shape of the guard writes them so).
                let rest = rest.strip_prefix("OPERATOR(pg_catalog.").unwrap_or(rest);
                let op = ["<=", ">=", "<>", "<", ">", "="]
                    .into_iter()
                    .find(|op| rest.starts_with(op));
                let judged = match (column, op) {
                    (".state", Some(op)) => rest[op.len()..].trim_start().starts_with("'held'"),
                    (_, Some(_)) => true,
                    _ => false,
                };
                if alias > 0 && judged {
                    out.push(code[at - alias..].trim().to_owned());
                }
            }
        }
    }
    out
}

/// Invariant: the verdict on a write is written once — whether a tenure is live in `pgfence._loss_reason`, whether
/// a secret is the tenure's in `pgfence._secret_verdict`, whether the session may use a cluster in
/// `pgfence._grant_of` — and every other function asks them (the native guard's copy in C is held to them by
/// tests/native/differential.rs). A function that compares a lease's expiry or timeline itself, checks a tenure's
/// secret hash itself or scans the grants by membership itself is a second copy of the rule, free to drift.
#[test]
fn the_verdict_on_a_write_is_written_once() {
    // A member's liveness is membership's own rule (its rows, its expiry), not a tenure's.
    let membership = [
        "_flaps_after",
        "_member_loss",
        "join_group",
        "leave_group",
        "_rebalance_due",
        "assign_group",
        "rebalance_inputs",
    ];
    // The one exception, on purpose: the SQL shape of pgfence.fence (in _install_guard's text) states the three
    // rules again with every operator qualified, since the rules' own functions, inlined there, would be planned
    // under the caller's search_path (they pin none). It is held to them call by call instead, over the verdict's
    // whole truth table (tests/native/differential.rs: every SQL shape against the plpgsql shape).
    let restated = "_install_guard";
    let mut copies = Vec::new();
    for (name, text) in files_in_sql_dir() {
        if name == restated {
            assert!(
                !liveness_comparisons(&text).is_empty()
                    && text.contains("pg_has_role(session_user, g.role"),
                "{restated} no longer restates the rules: drop the exception"
            );
            continue;
        }
        if name != "_loss_reason" && !membership.contains(&name.as_str()) {
            for found in liveness_comparisons(&text) {
                copies.push(format!("{name}: judges liveness itself: {found}"));
            }
        }
        if name != "_secret_verdict"
            && text.contains("tenure_secrets")
            && text.contains("_secret_matches(")
        {
            copies.push(format!("{name}: matches a tenure's secret itself"));
        }
        // _readable_clusters lists the clusters the same membership test admits (row-level security's list).
        if !["_grant_of", "_readable_clusters"].contains(&name.as_str())
            && text.contains("pg_has_role(session_user, g.role")
        {
            copies.push(format!("{name}: judges a grant itself"));
        }
    }
    // The SQL inside Rust strings too. The one exception: the benchmark's model of a bare advisory-lock guard
    // (`pgfence_bench.fence_advisory`, what pgfence.fence costs above the floor), which is not pgfence's verdict.
    for (path, mut text) in rust_sources() {
        if path == "cli/src/bench/workload.rs" {
            let start = text
                .find("CREATE FUNCTION pgfence_bench.fence_advisory(")
                .expect("the benchmark's advisory-lock model is gone: drop its exception");
            let end = start + text[start..].find("$$;").expect("its end");
            text.replace_range(start..end, "");
        }
        for found in liveness_comparisons(&text) {
            copies.push(format!("{path}: judges liveness itself: {found}"));
        }
    }
    assert!(
        copies.is_empty(),
        "second copies of the verdict's rules (call _loss_reason, _secret_verdict or _grant_of instead):\n{}",
        copies.join("\n")
    );
    // The checker finds what it forbids: the copies the fast path had before it asked the rule.
    let old_admits = "    SELECT l.lock_key = p_lock_key AND l.epoch = p_epoch AND l.state = 'held' AND l.expires_at > p_now\n           AND l.timeline >= p_timeline -- l.expires_at > x\n";
    assert_eq!(
        liveness_comparisons(old_admits),
        vec![
            "l.expires_at > p_now",
            "l.state = 'held' AND l.expires_at > p_now",
            "l.timeline >= p_timeline"
        ]
    );
}

/// Where `text` judges whether an effect's attempt is in doubt by itself: a missing outcome tied to its tenure's
/// epoch or liveness (`outcome IS NULL AND e.epoch < …`, `… AND (l.epoch IS DISTINCT FROM e.epoch …`,
/// `… AND pgfence._loss_reason(…`), whitespace aside.
fn in_doubt_judgements(text: &str) -> Vec<String> {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let rule = regex::Regex::new(r"outcome IS NULL AND \(?\s*(\w+\.epoch|pgfence\._loss_reason)")
        .expect("a valid pattern");
    rule.find_iter(&flat)
        .map(|m| m.as_str().to_owned())
        .collect()
}

/// Invariant: the in-doubt rule (an attempt is in doubt when unsettled and its outcome 'unknown', or missing
/// while its tenure is not the live one) is one text, `pgfence._in_doubt`, which every reader and writer of the
/// ledger asks — no function in `sql/` and no SQL in a Rust string judges it again (a copy drifts: the Rust read
/// of the ledger once judged liveness without the timeline, so after a promotion it showed an attempt as not in
/// doubt that `in_doubt_effects` listed).
#[test]
fn the_in_doubt_rule_is_written_once() {
    let mut copies = Vec::new();
    for (name, text) in files_in_sql_dir() {
        if name != "_in_doubt" {
            for found in in_doubt_judgements(&text) {
                copies.push(format!("sql/{name}.sql: {found}"));
            }
        }
    }
    for (path, text) in rust_sources() {
        for found in in_doubt_judgements(&text) {
            copies.push(format!("{path}: {found}"));
        }
    }
    assert!(
        copies.is_empty(),
        "second copies of the in-doubt rule (call pgfence._in_doubt instead):\n{}",
        copies.join("\n")
    );
    // The checker finds what it forbids: the copies there were before the rule had one text.
    for old in [
        "AND (e.outcome = 'unknown' OR (e.outcome IS NULL AND e.epoch < p_epoch))",
        "ELSIF e.outcome IS NULL AND e.epoch >= p_epoch THEN",
        "OR (e.outcome IS NULL\n                AND pgfence._loss_reason(l, NULL::text, e.epoch, clock_timestamp(), pgfence._timeline()) IS NOT NULL))",
        "(e.settlement IS NULL AND (e.outcome = 'unknown' OR (e.outcome IS NULL AND (l.epoch IS DISTINCT FROM e.epoch OR l.state <> 'held'",
    ] {
        assert_eq!(in_doubt_judgements(old).len(), 1, "{old}");
    }
}
