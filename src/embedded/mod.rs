//! Throwaway PostgreSQL servers started from the system's binaries.
//!
//! [`EmbeddedServer`] runs `initdb` into a fresh temporary directory, starts a
//! `postgres` server on a free TCP port of `127.0.0.1`, and removes
//! everything again when it is dropped. It is meant for test suites, demos
//! and benchmarks, not for production data.
//!
//! The binaries (`initdb`, `pg_ctl`, `postgres`) are located by
//! [`find_bin_dir`]. PostgreSQL refuses to run as `root`; when the current
//! process is root, every server command is run as the `postgres` OS user
//! through `runuser`.
//!
//! # Access
//!
//! Only the process that started a server can connect to it. A superuser
//! that any local OS user could reach would let them run commands as the
//! user who started it (`COPY … TO PROGRAM`), so:
//!
//! - At start, a random password is generated for the superuser `postgres`
//!   (32 bytes from the kernel's random source). It is kept in this
//!   process's memory and in the URLs [`EmbeddedServer::url`] returns;
//!   `initdb` reads it from a file created 0600 in the 0700 temporary
//!   directory and deleted as soon as `initdb` returns, and the server keeps
//!   only its SCRAM verifier.
//! - `pg_hba.conf` asks every connection, over TCP on loopback or the Unix
//!   socket, normal or replication, for that password (`scram-sha-256`);
//!   there is no `trust` line. The Unix socket lives in a 0700 directory
//!   owned by the server user, next to the 0700 data directory.
//! - The password never appears in `Debug` output, logs or errors; tools run
//!   against the server get it through their `PGPASSWORD` environment
//!   variable, never through their command line (which every user can read
//!   in `ps`).
//!
//! # Cleanup
//!
//! Servers are removed on [`Drop`], but also when the owning process exits
//! without dropping them (a server kept in a `static`, `std::process::exit`,
//! a killed process): every server has a small watchdog shell process whose
//! standard input is a pipe held by the owning process. When that process
//! goes away, the pipe closes, the watchdog's `read` returns, and it stops
//! the server (`pg_ctl stop -m immediate`) and deletes the temporary
//! directory.
//!
//! # Standbys
//!
//! [`EmbeddedServer::start_standby`] clones a running server with
//! `pg_basebackup` into a server of its own that streams the primary's WAL
//! (asynchronously), and [`EmbeddedServer::promote`] turns such a standby
//! into a primary: enough to test what a client does when it meets a
//! standby, or a failover. A standby is an [`EmbeddedServer`] like any
//! other, with its own directory, port and watchdog, and the same superuser
//! password as its primary (it is a copy of it).
//!
//! Everything here is synchronous and uses `std::process`; it can be called
//! from async code, but it blocks the calling thread while commands run.
//!
//! Which file of this module owns what: the table of files in docs/architecture.md.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

mod cluster;
mod error;
mod host;
mod password;

use cluster::{output_tail, read_from, tail, Watchdog};
pub use error::EmbeddedError;
pub use host::{find_bin_dir, find_bin_dir_from};
use host::{resolve_run_as, temp_base, RunAs};
use password::Password;

/// OS user the server runs as when the current process is root; also the
/// database superuser created by `initdb`.
const SERVER_USER: &str = "postgres";

/// Seconds `pg_ctl -w` waits for the server to start or stop.
const PG_CTL_TIMEOUT_SECS: u64 = 30;

/// How many lines of logs and command output end up in errors.
const TAIL_LINES: usize = 40;

/// Options for [`EmbeddedServer::start_with`].
///
/// ```
/// use pgfence::embedded::EmbeddedOptions;
///
/// let mut options = EmbeddedOptions::default();
/// options.extra_settings = vec![("work_mem".into(), "16MB".into())];
/// assert!(!options.fsync);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EmbeddedOptions {
    /// Whether the server calls `fsync`. Off by default: a throwaway server
    /// does not need to survive an OS crash, and it is much faster without.
    /// Committed data still survives [`EmbeddedServer::crash`], which only
    /// kills the server processes.
    pub fsync: bool,
    /// Additional server settings `(name, value)`, written to the server's
    /// configuration after the defaults (`max_connections = 200`,
    /// `shared_buffers = 128MB`, `wal_level = replica`,
    /// `max_wal_senders = 10`), so they can override them (lowering the
    /// last two makes [`EmbeddedServer::start_standby`] fail). `port`,
    /// `listen_addresses`, `unix_socket_directories`,
    /// `unix_socket_permissions` and `password_encryption` are always set
    /// by the server itself and cannot be overridden.
    pub extra_settings: Vec<(String, String)>,
    /// Files `(name, contents)` written into the data directory before the
    /// server starts, owned by the server user with mode 0600 (what
    /// PostgreSQL demands of a private key): a TLS certificate and key, named
    /// by `ssl_cert_file`/`ssl_key_file` in `extra_settings` (relative paths
    /// are relative to the data directory) together with `ssl = on`. A name
    /// is a plain file name that `initdb` did not create.
    pub data_files: Vec<(String, Vec<u8>)>,
    /// The directory of the server binaries (`initdb`, `pg_ctl`, `postgres`) to run instead of the one
    /// [`find_bin_dir`] finds: for example a copy of an installation that also has extensions not installed
    /// on the system (PostgreSQL finds its `share` and `lib` directories relative to its own binary).
    pub bin_dir: Option<PathBuf>,
}

impl Default for EmbeddedOptions {
    /// `fsync` off, no extra settings, no extra files, the binaries [`find_bin_dir`] finds.
    fn default() -> Self {
        Self {
            fsync: false,
            extra_settings: Vec::new(),
            data_files: Vec::new(),
            bin_dir: None,
        }
    }
}

/// A throwaway PostgreSQL server in a temporary directory.
///
/// The server listens on `127.0.0.1` only, on a port chosen at start that
/// stays the same across [`stop`](Self::stop) / [`start_again`](Self::start_again),
/// and accepts the superuser `postgres` only with the random password in
/// [`url`](Self::url), which `Debug` does not show. Dropping the
/// value stops the server immediately and deletes its directory; if the
/// process exits without dropping it, a watchdog process does the same (see
/// the [module documentation](self)).
///
/// `EmbeddedServer` is `Send + Sync`, so it can live in a `static`
/// (`std::sync::OnceLock`) shared by a test binary.
#[derive(Debug)]
pub struct EmbeddedServer {
    port: u16,
    bin_dir: PathBuf,
    root: PathBuf,
    data_dir: PathBuf,
    log_file: PathBuf,
    socket_dir: PathBuf,
    run_as: Option<RunAs>,
    password: Password,
    /// Kept so that `pgfence.conf` can be rewritten for a new port, and so
    /// that a standby gets the same settings as its primary.
    options: EmbeddedOptions,
    temp: Option<TempDir>,
    watchdog: Option<Watchdog>,
}

impl EmbeddedServer {
    /// Starts a server with [`EmbeddedOptions::default`].
    ///
    /// Generates the superuser's password, runs `initdb` into a new
    /// temporary directory (prefix `pgfence-pg-`), starts the server on a
    /// free port and waits until it accepts TCP connections. This takes
    /// about a second.
    ///
    /// ```no_run
    /// use pgfence::embedded::EmbeddedServer;
    ///
    /// let server = EmbeddedServer::start()?;
    /// // The URL carries the password: hand it to a client, never print it.
    /// let config = pgfence::StoreConfig::new(server.url(), "demo");
    /// println!("PostgreSQL on 127.0.0.1:{}", server.port());
    /// server.crash()?; // like a power cut for the server processes
    /// server.start_again()?; // recovers, same port and data
    /// drop(server); // stops the server and deletes its directory
    /// # Ok::<(), pgfence::embedded::EmbeddedError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`EmbeddedError::NoBinaries`] when no PostgreSQL installation is
    /// found, [`EmbeddedError::NoServerUser`] when running as root without a
    /// `postgres` user, and the other variants when a step fails.
    pub fn start() -> Result<Self, EmbeddedError> {
        Self::start_with(EmbeddedOptions::default())
    }

    /// Starts a server with the given options; see [`start`](Self::start).
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub fn start_with(options: EmbeddedOptions) -> Result<Self, EmbeddedError> {
        let started = Instant::now();
        let bin_dir = match &options.bin_dir {
            Some(dir) => dir.clone(),
            None => find_bin_dir()?,
        };
        let run_as = resolve_run_as()?;
        let password = Password::generate()?;
        let mut server = Self::prepare(bin_dir, run_as, options, password)?;
        server.initdb()?;
        server.write_data_files()?;
        server.start_first()?;
        tracing::info!(
            port = server.port,
            data_dir = %server.data_dir.display(),
            bin_dir = %server.bin_dir.display(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedded PostgreSQL started"
        );
        Ok(server)
    }

    /// Starts a streaming-replication standby of this server and waits
    /// until it accepts (read-only) connections.
    ///
    /// `pg_basebackup -R` copies this server's data directory into a new
    /// temporary directory and writes the recovery configuration
    /// (`standby.signal`, and `primary_conninfo` pointing at this server's
    /// port, with the password); the standby then runs on a new free port
    /// with its own socket directory and the same [`EmbeddedOptions`] as
    /// this server (a hot standby refuses to start with a lower
    /// `max_connections` than its primary). Replication is asynchronous and uses no replication slot,
    /// so dropping the standby leaves nothing behind on the primary. The
    /// returned server owns its directory and watchdog like any other, and
    /// is independent of this one: dropping the primary leaves the standby
    /// running (it keeps trying to reconnect), ready to be
    /// [promoted](Self::promote).
    ///
    /// Takes well under a second for a small primary: the base backup copies
    /// the primary's whole data directory, so it grows with it. Replication
    /// needs `wal_level = replica` and `max_wal_senders > 0` on this
    /// server (the defaults) and a `replication` line in `pg_hba.conf`
    /// (there are, with password authentication like the others). The
    /// standby is a copy of this server, so it has the same superuser
    /// password.
    ///
    /// ```no_run
    /// use pgfence::embedded::EmbeddedServer;
    ///
    /// let primary = EmbeddedServer::start()?;
    /// let standby = primary.start_standby()?;
    /// // `standby.url()` is read-only until:
    /// standby.promote()?;
    /// # Ok::<(), pgfence::embedded::EmbeddedError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`EmbeddedError::Command`] when `pg_basebackup` fails (for example
    /// because this server is not running, or its settings do not allow
    /// replication) or the standby does not start, with the command's
    /// output and the standby's log; the others as for
    /// [`start`](Self::start).
    pub fn start_standby(&self) -> Result<EmbeddedServer, EmbeddedError> {
        let started = Instant::now();
        let mut standby = Self::prepare(
            self.bin_dir.clone(),
            self.run_as.clone(),
            self.options.clone(),
            self.password.clone(),
        )?;
        standby.base_backup_of(self)?;
        // The copied `pgfence.conf` names the primary's port and socket
        // directory; `start_first` rewrites it before every attempt.
        standby.start_first()?;
        tracing::info!(
            port = standby.port,
            primary_port = self.port,
            data_dir = %standby.data_dir.display(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedded PostgreSQL standby started"
        );
        Ok(standby)
    }

    /// Promotes a standby to a primary (`pg_ctl promote -w`) and returns
    /// once it accepts writes.
    ///
    /// `pg_ctl` waits until the control file says the server is in
    /// production; the server allows writes before it records that, so
    /// writes work as soon as this returns. The promoted server starts a
    /// new timeline and stops following its former primary, which keeps
    /// running if it was: two primaries with the same history, which is
    /// exactly the split brain that fencing epochs are for.
    ///
    /// # Errors
    ///
    /// [`EmbeddedError::Command`] when the server is not a standby (`pg_ctl`
    /// reports "server is not in standby mode") or is not running, or when
    /// the promotion does not finish within 30 seconds; it carries the tail
    /// of the server log.
    pub fn promote(&self) -> Result<(), EmbeddedError> {
        let started = Instant::now();
        let log_offset = fs::metadata(&self.log_file).map(|m| m.len()).unwrap_or(0);
        let mut cmd = self.server_command(&self.bin_dir.join("pg_ctl"));
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("promote")
            .arg("-w")
            .arg("-t")
            .arg(PG_CTL_TIMEOUT_SECS.to_string());
        let (command, output) = self.run(cmd)?;
        if !output.status.success() {
            let mut text = output_tail(&output);
            let log_tail = tail(&read_from(&self.log_file, log_offset), TAIL_LINES);
            if !log_tail.is_empty() {
                text.push_str("\n--- server log ---\n");
                text.push_str(&log_tail);
            }
            return Err(EmbeddedError::Command {
                command,
                status: output.status.to_string(),
                output: text,
            });
        }
        tracing::info!(
            port = self.port,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedded PostgreSQL promoted"
        );
        Ok(())
    }

    /// A server value with a fresh temporary directory (0700, owned by the
    /// server user) and a running watchdog, but no data directory yet and
    /// port 0.
    fn prepare(
        bin_dir: PathBuf,
        run_as: Option<RunAs>,
        options: EmbeddedOptions,
        password: Password,
    ) -> Result<Self, EmbeddedError> {
        let base = temp_base(run_as.is_some());
        let temp = tempfile::Builder::new()
            .prefix("pgfence-pg-")
            .tempdir_in(&base)
            .map_err(|e| {
                EmbeddedError::io(
                    format!("creating a temporary directory in {}", base.display()),
                    e,
                )
            })?;
        let root = temp.path().to_path_buf();
        // Private whatever the umask: it holds the data directory, the socket
        // directory and, for a moment, the password file.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700)).map_err(|e| {
            EmbeddedError::io(format!("setting permissions of {}", root.display()), e)
        })?;
        // Whoever can enter this directory can reach the Unix socket; the
        // password is still needed there, but only the server user gets this
        // far.
        let socket_dir = root.join("socket");
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&socket_dir)
            .map_err(|e| EmbeddedError::io(format!("creating {}", socket_dir.display()), e))?;

        // From here on, dropping `server` (also on an error) cleans up.
        let mut server = EmbeddedServer {
            port: 0,
            bin_dir,
            data_dir: root.join("data"),
            log_file: root.join("server.log"),
            socket_dir,
            root,
            run_as,
            password,
            options,
            temp: Some(temp),
            watchdog: None,
        };
        if server.run_as.is_some() {
            let mut chown = Command::new("chown");
            chown
                .arg("-R")
                .arg(format!("{SERVER_USER}:"))
                .arg(&server.root);
            server.run_checked(chown)?;
        }
        server.watchdog = Some(server.spawn_watchdog()?);
        Ok(server)
    }

    /// Connection URL of the `postgres` database:
    /// `postgres://postgres:{password}@127.0.0.1:{port}/postgres`.
    ///
    /// It carries the superuser's password (64 hex digits): show it with
    /// [`redact`](crate::connection::redact), never as is.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// Connection URL of another database on this server:
    /// `postgres://postgres:{password}@127.0.0.1:{port}/{database}`.
    ///
    /// The database name is inserted as given; it is not created.
    pub fn url_for(&self, database: &str) -> String {
        format!(
            "postgres://{SERVER_USER}:{}@127.0.0.1:{}/{database}",
            self.password.as_str(),
            self.port
        )
    }

    /// TCP port the server listens on (on `127.0.0.1`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Directory where `initdb`, `pg_ctl` and `postgres` were found (other
    /// tools such as `pgbench` and `psql` usually live there as well).
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The server's data directory (inside the temporary directory).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log file (inside the temporary directory, next to the
    /// data directory).
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// Stops the server cleanly (`pg_ctl stop -m fast`: sessions are
    /// disconnected, a shutdown checkpoint is written) and waits until it is
    /// gone. Does nothing if the server is not running.
    ///
    /// # Errors
    ///
    /// [`EmbeddedError::Command`] if `pg_ctl` fails while the server is
    /// still running.
    pub fn stop(&self) -> Result<(), EmbeddedError> {
        self.pg_ctl_stop("fast")
    }

    /// Stops the server like a crash (`pg_ctl stop -m immediate`: processes
    /// exit without a checkpoint, the next start runs crash recovery).
    /// Committed data survives. Does nothing if the server is not running.
    ///
    /// # Errors
    ///
    /// [`EmbeddedError::Command`] if `pg_ctl` fails while the server is
    /// still running.
    pub fn crash(&self) -> Result<(), EmbeddedError> {
        self.pg_ctl_stop("immediate")
    }

    /// Starts the server again after [`stop`](Self::stop) or
    /// [`crash`](Self::crash), with the same port, data and settings, and
    /// waits until it accepts connections. Does nothing if it is running.
    ///
    /// # Errors
    ///
    /// [`EmbeddedError::Command`] if `pg_ctl start` fails (for example when
    /// another process took the port meanwhile) and
    /// [`EmbeddedError::NotReady`] if the server does not become ready in
    /// time; both carry the tail of the server log.
    pub fn start_again(&self) -> Result<(), EmbeddedError> {
        if self.is_running() {
            return Ok(());
        }
        let started = Instant::now();
        self.pg_ctl_start().map_err(|failure| failure.error)?;
        tracing::info!(
            port = self.port,
            data_dir = %self.data_dir.display(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedded PostgreSQL started again"
        );
        Ok(())
    }

    /// [`stop`](Self::stop) followed by [`start_again`](Self::start_again).
    ///
    /// # Errors
    ///
    /// As for those two.
    pub fn restart(&self) -> Result<(), EmbeddedError> {
        self.stop()?;
        self.start_again()
    }

    /// Whether the server is running (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        let mut cmd = self.server_command(&self.bin_dir.join("pg_ctl"));
        cmd.arg("-D").arg(&self.data_dir).arg("status");
        match self.run(cmd) {
            Ok((_, output)) => output.status.success(),
            Err(_) => false,
        }
    }
}

impl Drop for EmbeddedServer {
    /// Stops the server immediately, deletes the temporary directory and
    /// lets the watchdog exit. Errors are logged at debug level only.
    fn drop(&mut self) {
        if self.data_dir.join("postmaster.pid").exists() {
            let mut cmd = self.server_command(&self.bin_dir.join("pg_ctl"));
            cmd.arg("-D")
                .arg(&self.data_dir)
                .arg("stop")
                .arg("-m")
                .arg("immediate")
                .arg("-w")
                .arg("-t")
                .arg(PG_CTL_TIMEOUT_SECS.to_string());
            match self.run(cmd) {
                Ok((_, output)) if !output.status.success() => {
                    tracing::debug!(
                        output = %output_tail(&output),
                        "pg_ctl stop during drop failed"
                    );
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "pg_ctl stop during drop failed");
                }
            }
        }
        if let Some(temp) = self.temp.take() {
            if let Err(error) = temp.close() {
                tracing::debug!(
                    %error,
                    dir = %self.root.display(),
                    "removing the temporary directory failed"
                );
            }
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            // Closing the pipe makes the watchdog repeat the (now finished)
            // cleanup and exit; reap it so that it does not linger as a zombie.
            drop(watchdog.stdin.take());
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match watchdog.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => break,
                    Ok(None) => thread::sleep(Duration::from_millis(5)),
                }
            }
        }
        tracing::debug!(port = self.port, "embedded PostgreSQL removed");
    }
}
