//! The replica processes of the story: started as `pgfence replica` children of this program, their event lines
//! gathered into one log and the last lines of their stderr kept, killed, stopped, and watched for an early exit.

use std::collections::{BTreeMap, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{DRAIN, GRACE, GROUP, NAMES, STDERR_LINES, TTL, WRITE_EVERY};
use crate::demo::Narrator;
use crate::Failure;

/// Every event line of every replica, in arrival order.
type Log = Arc<Mutex<Vec<Value>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Replica {
    member: String,
    child: tokio::process::Child,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// The task reading its event lines: done once it read the last one (end of file).
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Replica {
    /// Waits (bounded) until its last event line is in the log: a process that exited may still have lines in
    /// the pipe.
    async fn read_out(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
    }
}

/// The replica processes. Each is killed when dropped (`kill_on_drop`): an error, a failed check or Ctrl-C
/// never leaves one running against a server that is about to be removed.
pub(super) struct Fleet {
    exe: std::path::PathBuf,
    url: String,
    /// The global flags the replicas share with this process (cluster, timeouts, expected identity).
    flags: Vec<String>,
    log: Log,
    replicas: Vec<Replica>,
}

impl Fleet {
    /// A fleet of no replica yet, each one [`Fleet::spawn`] starts running `exe` with `flags` against `url`.
    pub(super) fn new(exe: std::path::PathBuf, url: String, flags: Vec<String>) -> Fleet {
        Fleet {
            exe,
            url,
            flags,
            log: Arc::default(),
            replicas: Vec::new(),
        }
    }

    pub(super) fn spawn(&mut self, member: &str) -> Result<(), Failure> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut child = tokio::process::Command::new(&self.exe)
            .args(&self.flags)
            .args(["replica", "--group", GROUP, "--member", member])
            .args(["--controllers", &NAMES.to_string()])
            .args(["--ttl", &ms(TTL), "--grace", &ms(GRACE)])
            .args(["--write-every", &ms(WRITE_EVERY), "--drain", &ms(DRAIN)])
            // The URL travels in the environment, never on a command line that `ps` shows.
            .env("DATABASE_URL", &self.url)
            .env_remove("PGFENCE_CLUSTER")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Failure::new(1, format!("cannot start a replica: {e}")))?;
        let reader = child.stdout.take().map(|stdout| {
            let log = self.log.clone();
            let member = member.to_owned();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let event = serde_json::from_str::<Value>(&line).unwrap_or_else(
                        |_| serde_json::json!({"event": "unreadable", "member": member, "line": line}),
                    );
                    lock(&log).push(event);
                }
            })
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let tail = stderr.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut tail = lock(&tail);
                    if tail.len() == STDERR_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        self.replicas.push(Replica {
            member: member.to_owned(),
            child,
            stderr,
            reader,
        });
        Ok(())
    }

    /// SIGKILL: no release, no leave, no last words.
    pub(super) async fn kill(&mut self, member: &str) -> Result<(), Failure> {
        let Some(i) = self.replicas.iter().position(|r| r.member == member) else {
            return Ok(());
        };
        let mut replica = self.replicas.remove(i);
        replica
            .child
            .kill()
            .await
            .map_err(|e| Failure::new(1, format!("cannot kill {member}: {e}")))?;
        replica.read_out().await;
        Ok(())
    }

    /// SIGTERM to every replica at once (each drains, releases and leaves), then each one's exit code (`None`:
    /// still running 10 s later, and killed) and, for those that did not exit 0, the last lines of their stderr.
    pub(super) async fn stop_all(
        &mut self,
    ) -> (BTreeMap<String, Option<i32>>, Vec<(String, Vec<String>)>) {
        for replica in &self.replicas {
            if let Some(pid) = replica.child.id() {
                let _ = tokio::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
        }
        let mut exits = BTreeMap::new();
        let mut tails = Vec::new();
        for mut replica in self.replicas.drain(..) {
            let code =
                match tokio::time::timeout(Duration::from_secs(10), replica.child.wait()).await {
                    Ok(Ok(status)) => status.code(),
                    _ => {
                        let _ = replica.child.kill().await;
                        None
                    }
                };
            replica.read_out().await;
            if code != Some(0) {
                tails.push((
                    replica.member.clone(),
                    lock(&replica.stderr).iter().cloned().collect(),
                ));
            }
            exits.insert(replica.member, code);
        }
        (exits, tails)
    }

    /// A replica that is no longer running, with its exit code and the last lines of its stderr.
    pub(super) fn crashed(&mut self) -> Option<(String, Option<i32>, Vec<String>)> {
        self.replicas
            .iter_mut()
            .find_map(|r| match r.child.try_wait() {
                Ok(Some(status)) => Some((
                    r.member.clone(),
                    status.code(),
                    lock(&r.stderr).iter().cloned().collect(),
                )),
                _ => None,
            })
    }

    pub(super) fn events(&self) -> Vec<Value> {
        lock(&self.log).clone()
    }

    pub(super) fn mark(&self) -> usize {
        lock(&self.log).len()
    }
}

/// Says so when a replica exited while the group was converging (it should run until stopped).
pub(super) fn tell_crash(story: &Narrator, fleet: &mut Fleet) {
    if let Some((member, code, tail)) = fleet.crashed() {
        story.say(
            &member,
            format!(
                "exited unexpectedly ({}); its last log lines: {}",
                code.map_or_else(
                    || "killed by a signal".to_owned(),
                    |c| format!("exit code {c}")
                ),
                tail.join(" | ")
            ),
        );
    }
}
