//! Integration tests of `pgfence::embedded` against the system's PostgreSQL
//! binaries.

use crate::common::port_accepts;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use pgfence::embedded::{
    find_bin_dir, find_bin_dir_from, EmbeddedError, EmbeddedOptions, EmbeddedServer,
};

/// Set in the environment of the re-executed test binary in
/// `watchdog_cleans_up_after_exit_without_drop`.
const CHILD_ENV: &str = "PGFENCE_EMBEDDED_WATCHDOG_CHILD";
const CHILD_TEST: &str = "embedded::watchdog_child_process";

/// Runs `f` with a fresh client connection to `url` on a single-threaded
/// runtime.
fn with_client<T>(
    url: &str,
    f: impl for<'c> FnOnce(
        &'c tokio_postgres::Client,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<T, tokio_postgres::Error>> + 'c>,
    >,
) -> Result<T, tokio_postgres::Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        let result = f(&client).await;
        drop(client);
        let _ = driver.await;
        result
    })
}

/// `SELECT 1` through a new connection.
fn select_one(url: &str) -> Result<i32, tokio_postgres::Error> {
    with_client(url, |client| {
        Box::pin(async move {
            client
                .query_one("SELECT 1", &[])
                .await?
                .try_get::<_, i32>(0)
        })
    })
}

/// The value of a server setting.
fn show(url: &str, setting: &str) -> String {
    let sql = format!("SHOW {setting}");
    with_client(url, |client| {
        Box::pin(async move {
            client
                .query_one(sql.as_str(), &[])
                .await?
                .try_get::<_, String>(0)
        })
    })
    .expect("SHOW")
}

/// Polls `condition` every 50 ms until it holds or `timeout` passes.
fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The superuser password in a server's URL.
fn password_of(url: &str) -> String {
    let config: tokio_postgres::Config = url.parse().expect("a valid URL");
    let password = config.get_password().expect("a password in the URL");
    String::from_utf8(password.to_vec()).expect("a UTF-8 password")
}

/// A server starts, answers `SELECT 1` on `url()`, and dropping it stops it
/// and deletes its whole temporary directory.
#[test]
fn start_connect_drop_removes_data_dir() {
    let server = EmbeddedServer::start().expect("start");
    let url = server.url();
    let password = password_of(&url);
    assert_eq!(
        url,
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/postgres",
            server.port()
        )
    );
    assert_eq!(
        server.url_for("other"),
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/other",
            server.port()
        )
    );
    assert!(server.is_running());
    assert_eq!(select_one(&url).expect("SELECT 1"), 1);

    let data_dir = server.data_dir().to_path_buf();
    let root = data_dir.parent().expect("temp dir").to_path_buf();
    assert!(data_dir.join("PG_VERSION").exists());
    let port = server.port();

    drop(server);
    assert!(
        !data_dir.exists(),
        "data dir {} still exists",
        data_dir.display()
    );
    assert!(!root.exists(), "temp dir {} still exists", root.display());
    assert!(!port_accepts(port), "port {port} still accepts connections");
}

/// After `crash()` the server is unreachable; `start_again()` brings it back
/// on the same port, and a row committed before the crash survives the crash
/// recovery.
#[test]
fn crash_and_start_again_keeps_port_and_committed_data() {
    let server = EmbeddedServer::start().expect("start");
    let url = server.url();
    let port = server.port();
    with_client(&url, |client| {
        Box::pin(async move {
            client
                .batch_execute(
                    "CREATE TABLE survivor (id int PRIMARY KEY, note text);
                     INSERT INTO survivor VALUES (1, 'committed before the crash');",
                )
                .await
        })
    })
    .expect("create and insert");

    server.crash().expect("crash");
    assert!(!server.is_running());
    assert!(!port_accepts(port), "port {port} still accepts connections");
    assert!(select_one(&url).is_err());
    // Crashing a crashed server is a no-op.
    server.crash().expect("second crash");

    server.start_again().expect("start again");
    assert_eq!(server.port(), port);
    assert_eq!(server.url(), url);
    assert!(server.is_running());
    let note = with_client(&url, |client| {
        Box::pin(async move {
            client
                .query_one("SELECT note FROM survivor WHERE id = 1", &[])
                .await?
                .try_get::<_, String>(0)
        })
    })
    .expect("select after recovery");
    assert_eq!(note, "committed before the crash");

    let log = std::fs::read_to_string(server.log_file()).expect("server log");
    assert!(
        log.contains("not properly shut down") || log.contains("automatic recovery"),
        "no crash recovery in the server log:\n{log}"
    );
}

/// `restart()` stops the server cleanly and starts it again on the same
/// port; a stopped server can be stopped again and started with
/// `start_again()`.
#[test]
fn restart_and_stop_start_again() {
    let server = EmbeddedServer::start().expect("start");
    let port = server.port();
    let url = server.url();
    assert_eq!(select_one(&url).expect("before restart"), 1);

    server.restart().expect("restart");
    assert_eq!(server.port(), port);
    assert_eq!(select_one(&url).expect("after restart"), 1);

    server.stop().expect("stop");
    assert!(!server.is_running());
    assert!(select_one(&url).is_err());
    server.stop().expect("stopping a stopped server");
    server.start_again().expect("start again");
    // Starting a running server is a no-op.
    server.start_again().expect("start again while running");
    assert_eq!(select_one(&url).expect("after start_again"), 1);
}

/// Options reach the server: `fsync` is off by default, on when asked, and
/// `extra_settings` are applied and kept across a restart.
#[test]
fn options_are_applied_and_kept_across_restarts() {
    let default = EmbeddedServer::start().expect("start");
    assert_eq!(show(&default.url(), "fsync"), "off");
    assert_eq!(show(&default.url(), "max_connections"), "200");
    assert_eq!(show(&default.url(), "listen_addresses"), "127.0.0.1");
    drop(default);

    let mut options = EmbeddedOptions::default();
    options.fsync = true;
    options.extra_settings = vec![
        ("work_mem".to_owned(), "7MB".to_owned()),
        ("application_name".to_owned(), "it's embedded".to_owned()),
    ];
    let server = EmbeddedServer::start_with(options).expect("start with options");
    let url = server.url();
    assert_eq!(show(&url, "fsync"), "on");
    assert_eq!(show(&url, "work_mem"), "7MB");
    server.restart().expect("restart");
    assert_eq!(show(&url, "work_mem"), "7MB");
    assert_eq!(show(&url, "application_name"), "it's embedded");
}

/// Not a test on its own: when re-executed by
/// `watchdog_cleans_up_after_exit_without_drop` (with `CHILD_ENV` set), it
/// starts a server, prints its data directory and port, and exits the
/// process without dropping the server. Otherwise it does nothing: ignored, so that it never counts as a pass
/// (the watchdog test re-executes this binary into it with `--ignored`).
#[test]
#[ignore = "the watchdog test's child process, run by it"]
fn watchdog_child_process() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let server = EmbeddedServer::start().expect("start in child");
    assert_eq!(select_one(&server.url()).expect("SELECT 1 in child"), 1);
    println!("PGFENCE_DATA_DIR={}", server.data_dir().display());
    println!("PGFENCE_PORT={}", server.port());
    use std::io::Write;
    std::io::stdout().flush().expect("flush");
    std::process::exit(0);
}

/// When the owning process exits without dropping the server (as happens to
/// servers kept in `static`s), the watchdog stops the server and removes
/// its directory.
#[test]
fn watchdog_cleans_up_after_exit_without_drop() {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args([
            CHILD_TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child test process");

    let mut data_dir: Option<PathBuf> = None;
    let mut port: Option<u16> = None;
    let stdout = child.stdout.take().expect("child stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child stdout");
        // The harness prints "test <name> ... " in front of the first line.
        if let Some((_, dir)) = line.split_once("PGFENCE_DATA_DIR=") {
            data_dir = Some(PathBuf::from(dir));
        } else if let Some((_, p)) = line.split_once("PGFENCE_PORT=") {
            port = Some(p.parse().expect("port"));
        }
        if data_dir.is_some() && port.is_some() {
            break;
        }
    }
    let status = child.wait().expect("wait for child");
    let (data_dir, port) = match (data_dir, port) {
        (Some(d), Some(p)) => (d, p),
        _ => panic!("child did not report its server (exit status {status})"),
    };
    assert!(status.success(), "child failed: {status}");
    let root = data_dir.parent().expect("temp dir").to_path_buf();

    let cleaned = wait_until(Duration::from_secs(15), || {
        !root.exists() && !port_accepts(port)
    });
    assert!(
        cleaned,
        "after 15 s: temp dir {} exists: {}, port {port} accepts: {}",
        root.display(),
        root.exists(),
        port_accepts(port)
    );
    assert!(!Path::new(&data_dir).exists());
}

/// An explicit `PG_BIN` without the binaries is an error (no silent
/// fallback), and its message tells how to install PostgreSQL.
#[test]
fn pg_bin_without_binaries_is_no_binaries_error() {
    let empty = tempfile::tempdir().expect("tempdir");
    let err = find_bin_dir_from(Some(empty.path().as_os_str()), None).expect_err("must fail");
    let message = err.to_string();
    match &err {
        EmbeddedError::NoBinaries { searched } => {
            assert_eq!(searched, &vec![empty.path().to_path_buf()]);
        }
        other => panic!("expected NoBinaries, got {other:?}"),
    }
    assert!(message.contains("postgresql"), "{message}");
    assert!(message.contains("apt-get install postgresql"), "{message}");
    assert!(message.contains("PG_BIN"), "{message}");
}

/// A `pg_ctl` symlink found on `PATH` resolves to the real bin directory, and
/// an empty `PG_BIN` counts as unset.
#[test]
fn pg_ctl_symlink_on_path_resolves_to_real_bin_dir() {
    let real = find_bin_dir().expect("PostgreSQL binaries");
    let real = std::fs::canonicalize(real).expect("canonicalize");
    let links = tempfile::tempdir().expect("tempdir");
    for name in ["pg_ctl", "initdb", "postgres"] {
        std::os::unix::fs::symlink(real.join(name), links.path().join(name)).expect("symlink");
    }
    let found = find_bin_dir_from(Some(OsStr::new("")), Some(links.path().as_os_str()))
        .expect("found via PATH");
    assert_eq!(found, real);
    assert!(found.join("pg_ctl").exists());
}

/// Whether this process runs as root (and so can run commands as another OS user).
fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Runs `SELECT 1` with `psql` as the OS user `nobody`, on the connection string `conninfo`, with `password`
/// in its `PGPASSWORD` (nothing else from this process's environment reaches libpq: no `PGPASSFILE`, no
/// prompt).
fn psql_as_nobody(psql: &Path, conninfo: &str, password: Option<&str>) -> std::process::Output {
    let mut command = Command::new("runuser");
    command
        .args(["-u", "nobody", "--"])
        .arg(psql)
        .args([
            "-X",
            "--no-password",
            "-A",
            "-t",
            "-c",
            "SELECT 1",
            "-d",
            conninfo,
        ])
        .current_dir("/")
        .stdin(Stdio::null());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PG") {
            command.env_remove(name);
        }
    }
    command
        .env("LC_ALL", "C")
        .env("PGPASSFILE", "/nonexistent/pgpass");
    if let Some(password) = password {
        command.env("PGPASSWORD", password);
    }
    command
        .output()
        .expect("run psql as nobody through runuser")
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let entry = entry.expect("dir entry");
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files
}

/// The invariant of `pgfence::embedded`'s "Access" section: only the process that started a server can
/// connect to it. Another OS user of the machine (as superuser they could run commands as the user who started
/// it, with `COPY … TO PROGRAM`) is refused over TCP on loopback without a password and with a wrong one, and
/// cannot even reach the Unix socket; the same `psql`, as the same user, gets in with the password from
/// `url()`, so the refusals come from the server, not from the client's setup. Also checked: `pg_hba.conf` has
/// no `trust` line (every line asks for `scram-sha-256`), the password is stored as a SCRAM verifier and
/// nowhere in clear under the server's directory (the file `initdb` read it from is gone), the temporary,
/// data and socket directories are 0700, and `Debug` does not show the password.
///
/// Against a `trust` configuration the connections without a password succeed, and the test fails. It runs
/// `psql` as `nobody` through `runuser`, so it needs root; otherwise it says so and passes.
#[test]
fn another_os_user_cannot_connect() {
    if !running_as_root() {
        eprintln!(
            "skipped another_os_user_cannot_connect: running as another OS user needs root (runuser)"
        );
        return;
    }
    let server = EmbeddedServer::start().expect("start");
    let url = server.url();
    let password = password_of(&url);
    assert_eq!(password.len(), 64, "32 random bytes, hex-encoded");
    assert!(password.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(select_one(&url).expect("SELECT 1 with url()"), 1);
    assert!(
        !format!("{server:?}").contains(&password),
        "Debug shows the password: {server:?}"
    );

    let psql = server.bin_dir().join("psql");
    assert!(
        psql.is_file(),
        "no psql next to the server binaries: {}",
        psql.display()
    );
    let tcp = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        server.port()
    );

    let with_password = psql_as_nobody(&psql, &tcp, Some(&password));
    assert!(
        with_password.status.success()
            && String::from_utf8_lossy(&with_password.stdout).trim() == "1",
        "the control failed: psql as nobody with the right password: {with_password:?}"
    );

    let without = psql_as_nobody(&psql, &tcp, None);
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert!(
        !without.status.success() && stderr.contains("no password supplied"),
        "nobody without a password over TCP: {without:?}"
    );

    let wrong = psql_as_nobody(&psql, &tcp, Some(&"0".repeat(64)));
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success()
            && stderr.contains("password authentication failed for user \"postgres\""),
        "nobody with a wrong password over TCP: {wrong:?}"
    );

    let socket_dir = show(&url, "unix_socket_directories");
    assert!(!socket_dir.is_empty());
    let socket = format!(
        "host={socket_dir} port={} user=postgres dbname=postgres",
        server.port()
    );
    for password in [None, Some(password.as_str())] {
        let refused = psql_as_nobody(&psql, &socket, password);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && stderr.contains("Permission denied"),
            "nobody through the Unix socket in {socket_dir}: {refused:?}"
        );
    }

    let hba = std::fs::read_to_string(server.data_dir().join("pg_hba.conf")).expect("pg_hba.conf");
    let rules: Vec<&str> = hba
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    assert!(!rules.is_empty(), "pg_hba.conf has no rules:\n{hba}");
    for rule in rules {
        assert_eq!(
            rule.split_whitespace().last(),
            Some("scram-sha-256"),
            "a pg_hba.conf line without password authentication: {rule}"
        );
    }
    let verifier = with_client(&url, |client| {
        Box::pin(async move {
            client
                .query_one(
                    "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'",
                    &[],
                )
                .await?
                .try_get::<_, String>(0)
        })
    })
    .expect("read pg_authid");
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");

    let root = server.data_dir().parent().expect("temp dir").to_path_buf();
    for dir in [
        &root,
        &server.data_dir().to_path_buf(),
        &PathBuf::from(&socket_dir),
    ] {
        let mode = std::fs::metadata(dir)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", dir.display());
    }
    // Stopped, so that no file changes while it is read.
    server.stop().expect("stop");
    for file in files_under(&root) {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !bytes
                .windows(password.len())
                .any(|w| w == password.as_bytes()),
            "the password is in clear in {}",
            file.display()
        );
    }
}

/// Servers can be shared from a `static`.
#[test]
fn server_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<EmbeddedServer>();
}
