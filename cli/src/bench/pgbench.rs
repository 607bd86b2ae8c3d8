//! The external reference: `pgbench -M prepared` sending the same guarded SQL as the raw path, against the same
//! server, in the same interleaved rounds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio_postgres::config::Host;

use super::workload::{Workload, OPERATION};
use super::{new_histogram, Failure};

/// A pgbench binary, the connection it uses (as libpq environment variables: no password on a command line)
/// and the scripts, written once into a temporary directory. The tenure secret travels like the password: in
/// the environment (`PGOPTIONS`, a setting of pgbench's own sessions), never in a script, an argument or SQL text.
pub(super) struct Pgbench {
    exe: PathBuf,
    env: Vec<(&'static str, String)>,
    dir: tempfile::TempDir,
    lease: String,
    epoch: i64,
    secret: String,
    pub(super) version: String,
}

/// What one pgbench round measured.
pub(super) struct PgbenchRound {
    pub(super) transactions: u64,
    pub(super) seconds: f64,
    pub(super) tx_per_s: f64,
    pub(super) latency: Histogram<u64>,
}

/// `pgbench` on PATH, else next to the server binaries.
pub(super) fn find(server_bin: Option<&Path>) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("pgbench"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        server_bin
            .map(|dir| dir.join("pgbench"))
            .filter(|p| p.is_file())
    })
}

impl Pgbench {
    pub(super) fn new(
        exe: PathBuf,
        connector: &pgfence::connection::Connector,
        batches: &[u32],
        lease: &str,
        epoch: i64,
        secret: &str,
    ) -> Result<Pgbench, Failure> {
        let version = Command::new(&exe)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .map_err(|e| Failure::new(1, format!("running {} --version: {e}", exe.display())))?;
        let config = connector.config();
        let mut env = vec![("PGAPPNAME", "pgfence-bench-pgbench".to_owned())];
        // The same TLS as pgfence's own connections: PGSSLMODE, PGSSLROOTCERT, PGSSLCERT, PGSSLKEY.
        env.extend(connector.libpq_env());
        if let Some(host) = config.get_hosts().first() {
            env.push((
                "PGHOST",
                match host {
                    Host::Tcp(name) => name.clone(),
                    Host::Unix(path) => path.display().to_string(),
                },
            ));
        }
        if let Some(port) = config.get_ports().first() {
            env.push(("PGPORT", port.to_string()));
        }
        if let Some(user) = config.get_user() {
            env.push(("PGUSER", user.to_owned()));
        }
        if let Some(password) = config.get_password() {
            env.push(("PGPASSWORD", String::from_utf8_lossy(password).into_owned()));
        }
        if let Some(db) = config.get_dbname() {
            env.push(("PGDATABASE", db.to_owned()));
        }
        // Each pgbench session reads it once into the variable :secret (see secret_once), which pgbench then sends
        // as a bind parameter (-M prepared). Environments are private to the user, as PGPASSWORD's is; command
        // lines are not (ps), nor is statement text (pg_stat_activity, the server log).
        env.push(("PGOPTIONS", format!("-c {SECRET_SETTING}={secret}")));
        let dir = tempfile::Builder::new()
            .prefix("pgfence-bench-")
            .tempdir()
            .map_err(|e| Failure::new(1, format!("creating a directory for pgbench: {e}")))?;
        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text)
                .map_err(|e| Failure::new(1, format!("writing the pgbench script {name}: {e}")))
        };
        for &batch in batches {
            write(&format!("fenced-{batch}.sql"), fenced_script(batch))?;
        }
        write("append.sql", append_script())?;
        Ok(Pgbench {
            exe,
            env,
            dir,
            lease: lease.to_owned(),
            epoch,
            secret: secret.to_owned(),
            version,
        })
    }

    /// Runs one round of `workload` with `clients` connections for about `duration` (whole seconds, at least
    /// one: `pgbench -T` counts seconds). Blocking.
    pub(super) fn round(
        &self,
        workload: Workload,
        clients: u32,
        batch: u32,
        duration: Duration,
    ) -> Result<PgbenchRound, Failure> {
        let script = match workload {
            Workload::PgbenchFenced => format!("fenced-{batch}.sql"),
            Workload::PgbenchAppend => "append.sql".to_owned(),
            other => unreachable!("{} is not a pgbench workload", other.name()),
        };
        let secs = duration.as_secs_f64().round().max(1.0) as u64;
        let logs = self.dir.path().join("logs");
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs)
            .map_err(|e| Failure::new(1, format!("creating {}: {e}", logs.display())))?;
        let mut cmd = Command::new(&self.exe);
        // -M prepared: script variables (the secret among them) are bind parameters; -M simple would write them
        // into the statement text.
        cmd.args(["-n", "-M", "prepared"])
            .arg(format!("-c{clients}"))
            .arg(format!("-j{clients}"))
            .arg(format!("-T{secs}"))
            .arg("-f")
            .arg(self.dir.path().join(&script))
            .arg("-D")
            .arg(format!("lease={}", self.lease))
            .arg("-D")
            .arg(format!("epoch={}", self.epoch))
            .arg("-D")
            .arg(format!("op={OPERATION}"))
            .arg("-D")
            .arg(format!("kind={OPERATION}"))
            .arg("-D")
            .arg("payload={}")
            .arg("-D")
            .arg("secret_read=0")
            // Every transaction's latency, like the HDR histograms of the other paths.
            .arg("-l")
            .arg(format!("--log-prefix={}", logs.join("lat").display()))
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        for var in [
            "PGOPTIONS",
            "PGSERVICE",
            "PGSSLMODE",
            "PGSSLROOTCERT",
            "PGSSLCERT",
            "PGSSLKEY",
        ] {
            cmd.env_remove(var);
        }
        for (name, value) in &self.env {
            cmd.env(name, value);
        }
        let output = cmd
            .output()
            .map_err(|e| Failure::new(1, format!("running {}: {e}", self.exe.display())))?;
        // pgbench prints no variable's value unless debugging (-d); redacted all the same before anything is shown.
        let redact =
            |bytes: &[u8]| String::from_utf8_lossy(bytes).replace(&self.secret, "<secret>");
        let stdout = redact(&output.stdout);
        if !output.status.success() {
            let stderr = redact(&output.stderr);
            return Err(Failure::new(
                1,
                format!(
                    "pgbench ({}, {clients} clients) failed with {}: {}",
                    workload.name(),
                    output.status,
                    stderr.trim()
                ),
            ));
        }
        let tx_per_s = stdout
            .lines()
            .find(|l| l.starts_with("tps = ") && l.contains("without initial connection time"))
            .and_then(|l| l["tps = ".len()..].split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| Failure::new(1, format!("no tps in pgbench's output: {stdout}")))?;
        let transactions = stdout
            .lines()
            .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
            .and_then(|v| v.split('/').next())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if stdout
            .lines()
            .filter_map(|l| l.strip_prefix("number of failed transactions: "))
            .any(|v| !v.starts_with('0'))
        {
            return Err(Failure::new(
                1,
                format!("pgbench reported failed transactions: {stdout}"),
            ));
        }
        let mut latency = new_histogram();
        let entries = std::fs::read_dir(&logs)
            .map_err(|e| Failure::new(1, format!("reading {}: {e}", logs.display())))?;
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            // client_id transaction_no time(µs) script_no time_epoch time_us
            for line in text.lines() {
                if let Some(us) = line
                    .split_whitespace()
                    .nth(2)
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    latency.saturating_record(us.max(1));
                }
            }
        }
        Ok(PgbenchRound {
            transactions,
            seconds: secs as f64,
            tx_per_s,
            latency,
        })
    }
}

/// The setting of pgbench's sessions that carries the tenure secret (given in `PGOPTIONS`).
const SECRET_SETTING: &str = "pgfence_bench.secret";

/// The first lines of every script: on a session's first transaction, the secret is read from its setting into
/// the variable `:secret` (pgbench keeps a client's variables across its transactions). One extra statement per
/// connection; every transaction then sends the secret as a bind parameter, like the raw path.
fn secret_once() -> String {
    format!(
        "\\if :secret_read = 0\n\
         SELECT current_setting('{SECRET_SETTING}') AS secret \\gset\n\
         \\set secret_read 1\n\
         \\endif\n"
    )
}

/// BEGIN; guard; UPDATE of the client's `batch` rows; COMMIT — the statements of `raw-fenced`, the tenure
/// secret as a bind parameter (`:secret`, see [`secret_once`]).
fn fenced_script(batch: u32) -> String {
    format!(
        "{}\
         \\set lo :client_id * {batch}\n\
         \\set hi :lo + {batch}\n\
         BEGIN;\n\
         SELECT * FROM pgfence.fence(:lease, :epoch, :secret, :op, NULL, NULL);\n\
         UPDATE pgfence_bench.rows SET v = v + 1 WHERE id >= :lo AND id < :hi;\n\
         COMMIT;\n",
        secret_once()
    )
}

/// The statement of `append` and `raw-append`, on the client's own task (key = client id).
fn append_script() -> String {
    format!(
        "{}\
         \\set key :client_id\n\
         SELECT * FROM pgfence.append_event(:lease, :epoch, :secret, :key, :kind, :payload);\n",
        secret_once()
    )
}
