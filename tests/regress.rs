//! The SQL surface tested as SQL: `tests/regress/run.sh` runs the psql scripts of `tests/regress/sql/` with
//! PostgreSQL's pg_regress against a throwaway server of its own (the migrations loaded by psql, without diesel)
//! and compares their output with `tests/regress/expected/`. Run from here so that `cargo test` runs it.

use std::path::Path;
use std::process::Command;

/// The repository's root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What a client that is not the Rust library sends gets the answers on record: acquire, the task writes, fence
/// in a transaction and in one statement, a stale and a forged write and their audit rows, renew, renew_many,
/// report_belief and release (`protocol.sql`); and the surface's rules (`surface.sql`): an argument list of an
/// older signature is an error and writes nothing, a NULL secret is 22023 everywhere (renew_many's elements
/// included), every refusal of a tenure is the outcome `refused` with its reason, and a missing right is one
/// answer for every role (`refused` / `no_grant` on a cluster, 42501 instance-wide).
#[test]
fn the_sql_surface_answers_as_recorded() {
    let output = Command::new(repo().join("tests/regress/run.sh"))
        .output()
        .expect("tests/regress/run.sh runs");
    assert!(
        output.status.success(),
        "tests/regress/run.sh failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The SQL section of docs/protocol.md is `tests/regress/sql/protocol.sql`, verbatim: the SQL a client copies
/// from the documentation is the SQL the suite runs, and its answers are the recorded ones.
#[test]
fn the_documented_sql_is_the_tested_sql() {
    let doc = std::fs::read_to_string(repo().join("docs/protocol.md")).unwrap();
    let script = std::fs::read_to_string(repo().join("tests/regress/sql/protocol.sql")).unwrap();
    let start = "<!-- tests/regress/sql/protocol.sql -->\n```sql\n";
    let from = doc
        .find(start)
        .expect("docs/protocol.md marks its SQL block")
        + start.len();
    let to = from + doc[from..].find("```\n").expect("the block ends");
    assert_eq!(
        &doc[from..to],
        script,
        "docs/protocol.md's SQL block differs from tests/regress/sql/protocol.sql"
    );
}
