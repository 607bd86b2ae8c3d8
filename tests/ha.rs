//! The HA rehearsal: a real pg_auto_failover formation (a monitor and two data nodes, synchronous replication) on
//! loopback, supervised controllers writing through a multi-host URL with `target_session_attrs=read-write`, then
//! a planned failover (`pg_autoctl perform failover`) and a hard kill of the primary (SIGKILL of its keeper and
//! postmaster).
//!
//! Invariants checked across both failovers: no acknowledged guarded write is lost (synchronous replication),
//! no stale write is accepted (no write of an epoch lands after a write of a newer epoch), epochs keep
//! increasing across timelines, and the controllers lead again on the new primary without operator action.
//! Prints the figures the README quotes: time from the failover's start to the first guarded write acknowledged
//! on the new primary, writes acknowledged and lost, stale writes accepted, epochs.
//!
//! Needs `pg_autoctl` (Debian's `postgresql-NN-auto-failover`, installed by `.ci/run`); skipped with a message
//! when it is absent, unless `PGFENCE_REQUIRE_HA` is set (`.ci/run` sets it), when it fails. The formation's servers accept `trust` connections on 127.0.0.1 only, for the length of
//! the test (pg_auto_failover's `--auth` applies to its own nodes' connections too).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pgfence::leader::{LeadershipOptions, PgElector, Supervisor};
use pgfence::{Error, Store, StoreConfig};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const EPOCHS_PER_TIMELINE: i64 = 1 << 32;

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn pg_autoctl() -> Option<PathBuf> {
    ["/usr/bin/pg_autoctl", "/usr/local/bin/pg_autoctl"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// A pg_auto_failover formation in a private temporary directory, run by the `postgres` OS user when the test
/// runs as root (PostgreSQL refuses root). Dropping it stops every process and removes the directory.
struct Formation {
    dir: tempfile::TempDir,
    bin_dir: PathBuf,
    monitor_port: u16,
    node_ports: [u16; 2],
    /// The `setsid pg_autoctl …` processes, reaped on drop.
    children: std::sync::Mutex<Vec<std::process::Child>>,
}

impl Formation {
    fn command(&self, program: &Path) -> Command {
        let path = format!(
            "{}:{}",
            self.bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        // pg_autoctl keeps its configuration and state under XDG directories: keep them in the formation's.
        cmd.env("PATH", path)
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .env("HOME", self.dir.path());
        cmd
    }

    fn autoctl(&self, args: &[&str]) -> std::process::Output {
        let out = self
            .command(&pg_autoctl().unwrap())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_autoctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Starts `pg_autoctl <args>` in the background, in its own session (so that a kill of the test's process
    /// group does not reach it), logging to `log`.
    fn spawn(&self, args: &[&str], log: &str) {
        let log = std::fs::File::create(self.dir.path().join(log)).unwrap();
        let err = log.try_clone().unwrap();
        let mut cmd = self.command(Path::new("setsid"));
        cmd.arg(pg_autoctl().unwrap())
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err);
        let child = cmd.spawn().unwrap();
        self.children.lock().unwrap().push(child);
    }

    fn pgdata(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn monitor_url(&self) -> String {
        format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        )
    }

    /// The multi-host URL an application uses: both nodes, the writable one wins.
    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write&sslmode=disable",
            self.node_ports[0], self.node_ports[1]
        )
    }

    async fn start() -> Formation {
        let bin_dir = pgfence::embedded::find_bin_dir().unwrap();
        let dir = tempfile::Builder::new()
            .prefix("pgfence-ha-")
            .tempdir()
            .unwrap();
        for sub in ["config", "data", "run"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success());
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let formation = Formation {
            dir,
            bin_dir,
            monitor_port: common::unused_port(),
            node_ports: [common::unused_port(), common::unused_port()],
            children: std::sync::Mutex::new(Vec::new()),
        };
        let monitor = formation.pgdata("monitor");
        let port = formation.monitor_port.to_string();
        formation.autoctl(&[
            "create",
            "monitor",
            "--pgdata",
            &monitor,
            "--pgport",
            &port,
            "--hostname",
            "127.0.0.1",
            "--listen",
            "127.0.0.1",
            "--auth",
            "trust",
            "--no-ssl",
        ]);
        formation.spawn(&["run", "--pgdata", &monitor], "monitor.log");
        let monitor_client =
            connect_retrying(&formation.monitor_url(), Duration::from_secs(30)).await;
        drop(monitor_client);
        // The monitor's settings need its superuser (the OS user pg_autoctl runs as), not autoctl_node.
        let monitor_client = connect_retrying(
            &formation
                .monitor_url()
                .replace("autoctl_node@", "postgres@"),
            Duration::from_secs(5),
        )
        .await;
        // Failure detection in seconds rather than pg_auto_failover's defaults (a node unhealthy after 20 s of
        // failed checks, then 30 s for the old primary to demote itself before the standby is promoted), which
        // made a hard kill take 50 s to fail over. The order production relies on is kept: a primary's keeper
        // that loses the monitor and its standby demotes itself after its network_partition_timeout (20 s, not
        // lowered), so primary_demote_timeout must exceed it — in this rehearsal the killed primary's keeper is
        // killed with it, and the planned failover is coordinated, so neither waits on that timeout.
        for (setting, ms) in [
            ("health_check_period", 1000),
            ("health_check_timeout", 1000),
            ("health_check_retry_delay", 500),
            ("health_check_max_retries", 1),
            ("node_considered_unhealthy_timeout", 3000),
            ("primary_demote_timeout", 5000),
        ] {
            // ALTER SYSTEM cannot run in the implicit transaction of a multi-statement query.
            monitor_client
                .batch_execute(&format!("ALTER SYSTEM SET pgautofailover.{setting} = {ms}"))
                .await
                .expect("pg_auto_failover's monitor settings");
        }
        monitor_client
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .unwrap();
        drop(monitor_client);
        for (i, port) in formation.node_ports.iter().enumerate() {
            let name = format!("node{}", i + 1);
            let pgdata = formation.pgdata(&name);
            let port = port.to_string();
            let monitor_url = formation.monitor_url();
            formation.spawn(
                &[
                    "create",
                    "postgres",
                    "--pgdata",
                    &pgdata,
                    "--pgport",
                    &port,
                    "--hostname",
                    "127.0.0.1",
                    "--listen",
                    "127.0.0.1",
                    "--auth",
                    "trust",
                    "--no-ssl",
                    "--monitor",
                    &monitor_url,
                    "--name",
                    &name,
                    "--run",
                ],
                &format!("{name}.log"),
            );
            // The first node must register as primary before the second registers as its standby.
            formation
                .wait_for(Duration::from_secs(60), |states| {
                    states
                        .iter()
                        .filter(|s| s.1 == "primary" || s.1 == "single")
                        .count()
                        == 1
                })
                .await;
        }
        formation
            .wait_for(Duration::from_secs(90), |states| {
                states.len() == 2
                    && states.iter().any(|s| s.1 == "primary" && s.2 == "primary")
                    && states
                        .iter()
                        .any(|s| s.1 == "secondary" && s.2 == "secondary")
            })
            .await;
        formation
    }

    /// (port, reported state, goal state) of every data node, from the monitor.
    async fn states(&self) -> Vec<(i32, String, String)> {
        let Ok((client, conn)) =
            tokio_postgres::connect(&self.monitor_url(), tokio_postgres::NoTls).await
        else {
            return Vec::new();
        };
        tokio::spawn(conn);
        client
            .query(
                "SELECT nodeport, reportedstate::text, goalstate::text FROM pgautofailover.node ORDER BY nodeid",
                &[],
            )
            .await
            .map(|rows| rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
            .unwrap_or_default()
    }

    async fn wait_for(&self, within: Duration, done: impl Fn(&[(i32, String, String)]) -> bool) {
        let deadline = Instant::now() + within;
        loop {
            let states = self.states().await;
            if done(&states) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the formation did not reach the expected state in {within:?}: {states:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn logs(&self) -> String {
        ["monitor.log", "node1.log", "node2.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                format!(
                    "== {f}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn primary_port(&self) -> i32 {
        self.states()
            .await
            .into_iter()
            .find(|s| s.1 == "primary" || s.1 == "wait_primary")
            .map(|s| s.0)
            .expect("a primary")
    }

    /// SIGKILL of a node's keeper and everything it started (its process group: the keeper was started with
    /// setsid, and PostgreSQL runs in its group), so nothing restarts PostgreSQL: a machine gone at once.
    fn kill_node(&self, port: i32) {
        let i = self
            .node_ports
            .iter()
            .position(|p| i32::from(*p) == port)
            .unwrap();
        let pgdata = self.pgdata(&format!("node{}", i + 1));
        let pidfile = self
            .dir
            .path()
            .join("run/pg_autoctl")
            .join(pgdata.trim_start_matches('/'))
            .join("pg_autoctl.pid");
        let keeper = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
            .unwrap_or_else(|| panic!("the keeper's pid in {}", pidfile.display()));
        let status = Command::new("kill")
            .args(["-KILL", "--", &format!("-{keeper}")])
            .status()
            .unwrap();
        assert!(status.success(), "kill of process group {keeper}");
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        for name in ["node1", "node2", "monitor"] {
            let _ = self
                .command(&pg_autoctl().unwrap())
                .args(["stop", "--immediate", "--pgdata", &self.pgdata(name)])
                .output();
        }
        let path = self.dir.path().display().to_string();
        let _ = Command::new("pkill").args(["-KILL", "-f", &path]).status();
        for mut child in self
            .children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn connect_retrying(url: &str, within: Duration) -> tokio_postgres::Client {
    let deadline = Instant::now() + within;
    loop {
        match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                return client;
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("cannot connect to {url}: {e}"),
        }
    }
}

/// A guarded write a controller saw acknowledged: (epoch, event id, when).
type Acked = (i64, i64, Instant);

/// Two processes' supervisors, each running one controller `ha/writer` that appends an event per iteration
/// with its fence while it leads, reporting every acknowledged write.
fn supervisor(
    store: Store,
    holder: &'static str,
    acked: mpsc::UnboundedSender<Acked>,
) -> Supervisor<PgElector> {
    let options = LeadershipOptions::new(Duration::from_secs(2));
    Supervisor::new(PgElector::new(store.clone()), holder).controller(
        "writer",
        options,
        move |ctx| {
            let (store, acked) = (store.clone(), acked.clone());
            async move {
                let fence = ctx.fence();
                loop {
                    if !ctx.is_held() {
                        return Ok(());
                    }
                    let write = async {
                        store.tasks().create(&fence, "job", &json!({})).await?;
                        store
                            .tasks()
                            .append_event(&fence, "job", holder, &json!({ "holder": holder }))
                            .await
                    };
                    let result = tokio::select! {
                        _ = ctx.cancelled() => return Ok(()),
                        result = write => result,
                    };
                    match result {
                        Ok(w) => {
                            let _ = acked.send((
                                fence.epoch().get(),
                                w.event_id.unwrap_or(0),
                                Instant::now(),
                            ));
                        }
                        // Refused by the database: this tenure is over; the supervisor campaigns again.
                        Err(e @ (Error::Stale { .. } | Error::Denied { .. })) => {
                            return Err(e.into())
                        }
                        // The primary is switching: retry while the tenure is believed held.
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            }
        },
    )
}

/// The first write acknowledged at an epoch of timeline `timeline` or later, and when.
async fn first_write_on_timeline(
    rx: &mut mpsc::UnboundedReceiver<Acked>,
    all: &mut Vec<Acked>,
    timeline: i64,
    within: Duration,
) -> Acked {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("no write acknowledged on timeline {timeline} within {within:?}")
            })
            .unwrap();
        all.push(next);
        if next.0 > (timeline - 1) * EPOCHS_PER_TIMELINE {
            return next;
        }
    }
}

/// Collects the acknowledged writes `rx` reports into `all` for `period`.
async fn keep_collecting(
    rx: &mut mpsc::UnboundedReceiver<Acked>,
    all: &mut Vec<Acked>,
    period: Duration,
) {
    let until = Instant::now() + period;
    while Instant::now() < until {
        if let Ok(Some(a)) = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
            all.push(a);
        }
    }
}

/// The record, read on the surviving primary (`url`): every acknowledged write (`all`) is stored with its epoch,
/// no write of an epoch landed after a write of a newer one, and the epochs kept increasing into timeline 3.
/// Prints the figures, with the time from each failover's start to the first write on the new primary.
async fn the_record_lost_nothing_and_took_no_stale_write(
    url: &str,
    all: &[Acked],
    planned: Duration,
    hard: Duration,
) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let stored: std::collections::HashMap<i64, i64> = client
        .query("SELECT id, epoch FROM pgfence.task_events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let lost: Vec<&Acked> = all
        .iter()
        .filter(|(epoch, id, _)| stored.get(id) != Some(epoch))
        .collect();
    // A write of an epoch that lands (takes its id) after a write of a newer epoch was accepted stale.
    let mut by_id: Vec<(i64, i64)> = stored.iter().map(|(id, epoch)| (*id, *epoch)).collect();
    by_id.sort();
    let mut newest = 0;
    let mut stale = 0;
    for (_, epoch) in &by_id {
        if *epoch < newest {
            stale += 1;
        }
        newest = newest.max(*epoch);
    }
    let epochs: Vec<i64> = client
        .query("SELECT epoch FROM pgfence.tenures ORDER BY epoch", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    eprintln!(
        "HA rehearsal: planned failover: first guarded write on the new primary {:.2} s after `perform failover` \
         started; hard kill: {:.2} s after SIGKILL; {} writes acknowledged, {} lost, {} stale writes accepted; \
         epochs {:?}",
        planned.as_secs_f64(),
        hard.as_secs_f64(),
        all.len(),
        lost.len(),
        stale,
        epochs
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert_eq!(stale, 0, "stale writes accepted");
    assert!(epochs.windows(2).all(|w| w[0] < w[1]));
    assert!(
        epochs.iter().any(|e| *e > 2 * EPOCHS_PER_TIMELINE),
        "a tenure on timeline 3: {epochs:?}"
    );
}

/// Guarded writes survive a planned failover and a hard kill of the primary of a pg_auto_failover formation
/// (see the file's header): no acknowledged write lost, no stale write accepted, epochs increasing across
/// timelines, and the controllers leading again on each new primary without operator action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_survive_planned_and_hard_failovers_of_a_pg_auto_failover_formation() {
    if pg_autoctl().is_none() {
        // CI must not count a rehearsal that never ran as a pass.
        assert!(
            std::env::var_os("PGFENCE_REQUIRE_HA").is_none_or(|v| v.is_empty()),
            "pg_autoctl not found, and PGFENCE_REQUIRE_HA is set: install Debian's postgresql-NN-auto-failover"
        );
        eprintln!("SKIPPED: pg_autoctl not found (install Debian's postgresql-NN-auto-failover; .ci/run does)");
        return;
    }
    let formation = Formation::start().await;
    let url = formation.url();
    let admin = Store::connect(StoreConfig::new(&url, "ha")).await.unwrap();
    admin.migrate().await.unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for holder in ["pod-a", "pod-b"] {
        let store = Store::connect(StoreConfig::new(&url, "ha").pool_size(4))
            .await
            .unwrap();
        tasks.push(tokio::spawn(
            supervisor(store, holder, tx.clone()).run(shutdown.clone()),
        ));
    }
    let mut all = Vec::new();
    first_write_on_timeline(&mut rx, &mut all, 1, Duration::from_secs(30)).await;
    // Let them write for a while on timeline 1.
    keep_collecting(&mut rx, &mut all, Duration::from_secs(2)).await;

    // 1. Planned failover.
    let old_primary = formation.primary_port().await;
    let started = Instant::now();
    formation.autoctl(&[
        "perform",
        "failover",
        "--pgdata",
        &formation.pgdata("monitor"),
    ]);
    let first = first_write_on_timeline(&mut rx, &mut all, 2, Duration::from_secs(60)).await;
    let planned = first.2.duration_since(started);
    let new_primary = formation.primary_port().await;
    assert_ne!(old_primary, new_primary);
    keep_collecting(&mut rx, &mut all, Duration::from_secs(2)).await;
    // The old primary must have rejoined as a synchronous standby before the hard kill.
    formation
        .wait_for(Duration::from_secs(60), |states| {
            states.iter().any(|s| s.1 == "primary") && states.iter().any(|s| s.1 == "secondary")
        })
        .await;

    // 2. Hard kill of the primary.
    let killed = formation.primary_port().await;
    let started = Instant::now();
    formation.kill_node(killed);
    let first = match tokio::time::timeout(
        Duration::from_secs(120),
        first_write_on_timeline(&mut rx, &mut all, 3, Duration::from_secs(300)),
    )
    .await
    {
        Ok(first) => first,
        Err(_) => panic!(
            "no write on timeline 3 within 120 s of the kill; states {:?}\n{}",
            formation.states().await,
            formation.logs()
        ),
    };
    let hard = first.2.duration_since(started);
    keep_collecting(&mut rx, &mut all, Duration::from_secs(1)).await;
    shutdown.cancel();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    while let Ok(a) = rx.try_recv() {
        all.push(a);
    }

    the_record_lost_nothing_and_took_no_stale_write(&url, &all, planned, hard).await;
}
