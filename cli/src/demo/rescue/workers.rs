//! The worker processes of the rescue story: `pgfence rescue-worker` children of this program, their event lines
//! gathered in arrival order, their pauses answered on stdin, frozen, resumed and killed by signal.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::Failure;

struct Proc {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    /// The task reading its event lines: done once it read the last one (end of file).
    reader: Option<tokio::task::JoinHandle<()>>,
}

/// The workers, each killed when dropped (`kill_on_drop`): a failed step never leaves one running against a
/// server that is about to be removed.
pub(super) struct Workers {
    exe: std::path::PathBuf,
    url: String,
    engine_url: String,
    /// The global flags the workers share with this process (cluster, timeouts, expected identity).
    flags: Vec<String>,
    procs: BTreeMap<String, Proc>,
    /// The lease of every worker ever started (kept after it exits).
    leases: BTreeMap<String, String>,
    sender: mpsc::UnboundedSender<Value>,
    receiver: mpsc::UnboundedReceiver<Value>,
    /// Every event read so far, in arrival order.
    pub(super) log: Vec<Value>,
}

/// A worker's command line beyond its lease and name.
#[derive(Debug, Clone, Default)]
pub(super) struct Spec {
    pub(super) tasks: u32,
    pub(super) ttl: Duration,
    pub(super) pause_at: Vec<String>,
    pub(super) lose_reply: u8,
    pub(super) late: u8,
    pub(super) until_done: bool,
}

impl Workers {
    pub(super) fn new(
        exe: std::path::PathBuf,
        url: String,
        engine_url: String,
        flags: Vec<String>,
    ) -> Workers {
        let (sender, receiver) = mpsc::unbounded_channel();
        Workers {
            exe,
            url,
            engine_url,
            flags,
            procs: BTreeMap::new(),
            leases: BTreeMap::new(),
            sender,
            receiver,
            log: Vec::new(),
        }
    }

    /// Starts worker `member` on `lease`.
    pub(super) fn spawn(&mut self, lease: &str, member: &str, spec: &Spec) -> Result<(), Failure> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .args(&self.flags)
            .args(["rescue-worker", "--lease", lease, "--member", member])
            .args(["--tasks", &spec.tasks.to_string(), "--ttl", &ms(spec.ttl)])
            .args(["--lose-reply", &spec.lose_reply.to_string()])
            .args(["--late", &spec.late.to_string()]);
        for pause in &spec.pause_at {
            command.args(["--pause-at", pause]);
        }
        if spec.until_done {
            command.arg("--until-done");
        }
        let mut child = command
            // The URLs travel in the environment, never on a command line that `ps` shows.
            .env("DATABASE_URL", &self.url)
            .env("PGFENCE_ENGINE_URL", &self.engine_url)
            .env_remove("PGFENCE_CLUSTER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Failure::new(1, format!("cannot start a worker: {e}")))?;
        let reader = child.stdout.take().map(|stdout| {
            let sender = self.sender.clone();
            let member = member.to_owned();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let event = serde_json::from_str::<Value>(&line).unwrap_or_else(
                        |_| serde_json::json!({"event": "unreadable", "member": member, "line": line}),
                    );
                    if sender.send(event).is_err() {
                        return;
                    }
                }
            })
        });
        let stdin = child.stdin.take();
        self.leases.insert(member.to_owned(), lease.to_owned());
        self.procs.insert(
            member.to_owned(),
            Proc {
                child,
                stdin,
                reader,
            },
        );
        Ok(())
    }

    /// The lease of worker `member`.
    pub(super) fn lease_of(&self, member: &str) -> Option<&str> {
        self.leases.get(member).map(String::as_str)
    }

    /// Takes the events that arrived, without waiting.
    pub(super) fn drain(&mut self) {
        while let Ok(event) = self.receiver.try_recv() {
            self.log.push(event);
        }
    }

    /// Waits until an event for which `wanted` holds arrives (and returns it), reading every event into the log;
    /// fails after `within`, or at once on a `stuck` event (a worker found a task waiting for an effect that the
    /// in-doubt list does not show).
    pub(super) async fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        wanted: impl Fn(&Value) -> bool,
    ) -> Result<Value, Failure> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = match tokio::time::timeout(left, self.receiver.recv()).await {
                Ok(Some(event)) => event,
                Ok(None) | Err(_) => {
                    let last: Vec<String> = self
                        .log
                        .iter()
                        .rev()
                        .take(8)
                        .rev()
                        .map(Value::to_string)
                        .collect();
                    return Err(Failure::new(
                        1,
                        format!(
                            "rescue: {what}: not seen within {within:?}; the last events: {}",
                            last.join(" | ")
                        ),
                    ));
                }
            };
            self.log.push(event.clone());
            if event["event"] == "stuck" {
                return Err(Failure::new(
                    1,
                    format!(
                        "rescue: {what}: worker {} found task {} waiting for effect {}, which the in-doubt list \
                         does not show: that intent would be lost",
                        event["member"], event["task"], event["key"]
                    ),
                ));
            }
            if wanted(&event) {
                return Ok(event);
            }
        }
    }

    /// [`wait_for`](Self::wait_for), answering at once with an event already read that `wanted` holds for.
    pub(super) async fn seen_or_wait(
        &mut self,
        what: &str,
        within: Duration,
        wanted: impl Fn(&Value) -> bool,
    ) -> Result<Value, Failure> {
        self.drain();
        if let Some(event) = self.log.iter().find(|e| wanted(e)) {
            return Ok(event.clone());
        }
        self.wait_for(what, within, wanted).await
    }

    /// Lets a paused worker go on.
    pub(super) async fn go(&mut self, member: &str) -> Result<(), Failure> {
        let proc = self
            .procs
            .get_mut(member)
            .ok_or_else(|| Failure::new(1, format!("no worker {member}")))?;
        if let Some(stdin) = proc.stdin.as_mut() {
            stdin
                .write_all(b"go\n")
                .await
                .map_err(|e| Failure::new(1, format!("cannot resume {member}: {e}")))?;
            let _ = stdin.flush().await;
        }
        Ok(())
    }

    /// Sends `signal` (`STOP`, `CONT`) to worker `member`.
    pub(super) async fn signal(&self, member: &str, signal: &str) -> Result<(), Failure> {
        let pid = self
            .procs
            .get(member)
            .and_then(|p| p.child.id())
            .ok_or_else(|| Failure::new(1, format!("worker {member} is not running")))?;
        let status = tokio::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .await
            .map_err(|e| Failure::new(1, format!("cannot signal {member}: {e}")))?;
        if !status.success() {
            return Err(Failure::new(1, format!("kill -{signal} {member} failed")));
        }
        Ok(())
    }

    /// SIGKILL: no release, no outcome, no last words.
    pub(super) async fn kill(&mut self, member: &str) {
        if let Some(mut proc) = self.procs.remove(member) {
            let _ = proc.child.kill().await;
            if let Some(reader) = proc.reader.take() {
                let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
            }
        }
        self.drain();
    }

    /// Waits (bounded) for every worker to exit by itself; kills the ones still running. Answers the members
    /// that had to be killed.
    pub(super) async fn finish(&mut self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut killed = Vec::new();
        let members: Vec<String> = self.procs.keys().cloned().collect();
        for member in members {
            let Some(mut proc) = self.procs.remove(&member) else {
                continue;
            };
            // A worker paused at a point goes on when its stdin closes.
            drop(proc.stdin.take());
            let left = deadline.saturating_duration_since(Instant::now());
            if !matches!(
                tokio::time::timeout(left, proc.child.wait()).await,
                Ok(Ok(_))
            ) {
                let _ = proc.child.kill().await;
                killed.push(member);
            }
            // Its last lines: the reader ends at the end of the pipe, which the exit closed.
            if let Some(reader) = proc.reader.take() {
                let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
            }
        }
        self.drain();
        killed
    }

    /// Members that are still running.
    pub(super) fn running(&mut self) -> Vec<String> {
        self.procs
            .iter_mut()
            .filter_map(|(m, p)| matches!(p.child.try_wait(), Ok(None)).then(|| m.clone()))
            .collect()
    }
}
