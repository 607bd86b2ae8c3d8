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

use std::ffi::OsStr;
use std::fmt::{self, Write as _};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// OS user the server runs as when the current process is root; also the
/// database superuser created by `initdb`.
const SERVER_USER: &str = "postgres";

/// Binaries that must be present in a PostgreSQL bin directory.
const REQUIRED_BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// Where Debian and Ubuntu install the versioned server binaries.
const DEBIAN_PG_LIB: &str = "/usr/lib/postgresql";

/// How many times a first start is retried with a new port when the chosen
/// port turned out to be taken.
const PORT_RETRIES: usize = 5;

/// Seconds `pg_ctl -w` waits for the server to start or stop.
const PG_CTL_TIMEOUT_SECS: u64 = 30;

/// How long a TCP connection to the started server is attempted.
const TCP_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many lines of logs and command output end up in errors.
const TAIL_LINES: usize = 40;

/// Random bytes in the superuser's password.
const PASSWORD_BYTES: usize = 32;

/// The whole `pg_hba.conf` of every server: each connection must prove that
/// it knows the superuser's password, whatever way it comes in. `trust`
/// would admit every OS user of the machine as superuser. The replication
/// lines serve `pg_basebackup` and a standby's walreceiver; `::1` is listed
/// although the server listens on `127.0.0.1` only, so that a changed
/// `listen_addresses` does not open a way in.
const PG_HBA: &str = "\
# Written by pgfence's embedded server: password (SCRAM) authentication only.
# TYPE  DATABASE     USER  ADDRESS       METHOD
local   all          all                 scram-sha-256
host    all          all   127.0.0.1/32  scram-sha-256
host    all          all   ::1/128       scram-sha-256
local   replication  all                 scram-sha-256
host    replication  all   127.0.0.1/32  scram-sha-256
host    replication  all   ::1/128       scram-sha-256
";

/// Environment variables that would change how the server or `pg_ctl`
/// behave; they are removed from every command.
const SCRUBBED_ENV: [&str; 6] = [
    "PGDATA",
    "PGPORT",
    "PGHOST",
    "PGHOSTADDR",
    "PGOPTIONS",
    "PGCTLTIMEOUT",
];

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
}

impl Default for EmbeddedOptions {
    /// `fsync` off, no extra settings, no extra files.
    fn default() -> Self {
        Self {
            fsync: false,
            extra_settings: Vec::new(),
            data_files: Vec::new(),
        }
    }
}

/// Errors from starting or controlling an [`EmbeddedServer`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddedError {
    /// No directory with `initdb`, `pg_ctl` and `postgres` was found.
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found (searched: {}); \
         install Debian's `postgresql` package (apt-get install postgresql) or set PG_BIN \
         to the directory that contains them",
        display_paths(.searched)
    )]
    NoBinaries {
        /// Directories that were looked at, in search order.
        searched: Vec<PathBuf>,
    },
    /// The process runs as root, and there is no OS user to run the server
    /// as (PostgreSQL refuses to run as root).
    #[error(
        "running as root, but there is no `{user}` OS user to run PostgreSQL as \
         (initdb and postgres refuse to run as root); install Debian's `postgresql` \
         package, which creates it, or run as a non-root user"
    )]
    NoServerUser {
        /// The user that was looked for.
        user: String,
    },
    /// A step (`initdb`, `pg_ctl`, ...) exited unsuccessfully.
    #[error("`{command}` failed ({status}):\n{output}")]
    Command {
        /// The command line that was run.
        command: String,
        /// Its exit status.
        status: String,
        /// The tail of its standard error and output (and of the server log,
        /// where relevant).
        output: String,
    },
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The server did not accept connections in time.
    #[error("PostgreSQL did not become ready within {waited:?}; server log tail:\n{log_tail}")]
    NotReady {
        /// How long was waited.
        waited: Duration,
        /// The last lines of the server log.
        log_tail: String,
    },
}

impl EmbeddedError {
    fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nothing".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
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

/// The superuser's password. `Debug` does not show it.
#[derive(Clone)]
struct Password(String);

impl Password {
    /// [`PASSWORD_BYTES`] bytes from the kernel's CSPRNG, hex-encoded, so that
    /// the password needs no quoting in a URL, a conninfo string or a file.
    ///
    /// Read from `/dev/urandom` rather than through a crate: this module
    /// relies on Linux already (`runuser`, `/proc`), and it is the same
    /// kernel source the `getrandom` crate reads. `fastrand`, a dependency
    /// for jitter, is not cryptographic.
    fn generate() -> Result<Self, EmbeddedError> {
        let mut bytes = [0u8; PASSWORD_BYTES];
        fs::File::open("/dev/urandom")
            .and_then(|mut source| source.read_exact(&mut bytes))
            .map_err(|e| EmbeddedError::io("reading /dev/urandom for the superuser password", e))?;
        let mut hex = String::with_capacity(2 * PASSWORD_BYTES);
        for byte in bytes {
            let _ = write!(hex, "{byte:02x}");
        }
        Ok(Self(hex))
    }

    fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<hidden>)")
    }
}

/// How to run commands as the server user.
#[derive(Debug, Clone)]
struct RunAs {
    runuser: PathBuf,
    user: &'static str,
}

/// The cleanup process; it acts when `stdin` closes.
#[derive(Debug)]
struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

/// Why a `pg_ctl start` failed.
struct StartFailure {
    port_in_use: bool,
    error: EmbeddedError,
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
        let bin_dir = find_bin_dir()?;
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
    /// [`redact`](crate::redact), never as is.
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

    /// Initializes the data directory, with the superuser's password and
    /// [`PG_HBA`] as `pg_hba.conf`.
    fn initdb(&self) -> Result<(), EmbeddedError> {
        // initdb takes the password from a file only. The file is created
        // 0600 in the temporary directory (0700, owned by the server user),
        // handed to the server user, and removed as soon as initdb returns,
        // whether it succeeded or not.
        let pwfile = self.root.join("pwfile");
        self.write_pwfile(&pwfile)?;
        let mut cmd = self.server_command(&self.bin_dir.join("initdb"));
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("--auth=scram-sha-256")
            .arg("--pwfile")
            .arg(&pwfile)
            .arg(format!("--username={SERVER_USER}"))
            .arg("--encoding=UTF8")
            .arg("--locale=C")
            .arg("--no-sync");
        let initialized = self.run_checked(cmd);
        let removed = fs::remove_file(&pwfile)
            .map_err(|e| EmbeddedError::io(format!("removing {}", pwfile.display()), e));
        initialized?;
        removed?;

        // initdb's own pg_hba.conf already asks for the password everywhere;
        // this one says exactly which connections exist.
        let hba = self.data_dir.join("pg_hba.conf");
        fs::write(&hba, PG_HBA)
            .map_err(|e| EmbeddedError::io(format!("writing {}", hba.display()), e))?;

        let conf = self.data_dir.join("postgresql.conf");
        let mut contents = fs::read_to_string(&conf)
            .map_err(|e| EmbeddedError::io(format!("reading {}", conf.display()), e))?;
        contents.push_str("\n# Settings of the embedded test server.\ninclude 'pgfence.conf'\n");
        fs::write(&conf, contents)
            .map_err(|e| EmbeddedError::io(format!("writing {}", conf.display()), e))
    }

    /// Writes [`EmbeddedOptions::data_files`] into the data directory: new
    /// 0600 files owned by the server user.
    fn write_data_files(&self) -> Result<(), EmbeddedError> {
        for (name, contents) in &self.options.data_files {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(EmbeddedError::io(
                    format!("writing the data file {name:?}"),
                    io::Error::new(io::ErrorKind::InvalidInput, "not a plain file name"),
                ));
            }
            self.write_private_file(&self.data_dir.join(name), contents)?;
        }
        Ok(())
    }

    /// Writes `contents` to a new 0600 file at `path` owned by the server
    /// user (the current user when not running as root).
    fn write_private_file(&self, path: &Path, contents: &[u8]) -> Result<(), EmbeddedError> {
        let context = || format!("writing {}", path.display());
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| EmbeddedError::io(context(), e))?;
        file.write_all(contents)
            .map_err(|e| EmbeddedError::io(context(), e))?;
        if self.run_as.is_some() {
            // The temporary directory was handed to the server user already.
            let owner = fs::metadata(&self.root)
                .map_err(|e| EmbeddedError::io(format!("reading {}", self.root.display()), e))?;
            std::os::unix::fs::chown(path, Some(owner.uid()), Some(owner.gid())).map_err(|e| {
                EmbeddedError::io(format!("handing {} to {SERVER_USER}", path.display()), e)
            })?;
        }
        Ok(())
    }

    /// Writes the superuser's password to a new 0600 file at `path`, owned
    /// by the server user, for `initdb --pwfile`.
    fn write_pwfile(&self, path: &Path) -> Result<(), EmbeddedError> {
        self.write_private_file(path, format!("{}\n", self.password.as_str()).as_bytes())
    }

    /// Fills the data directory with a base backup of `primary`, configured
    /// to follow it as a standby.
    fn base_backup_of(&self, primary: &EmbeddedServer) -> Result<(), EmbeddedError> {
        let mut cmd = self.server_command(&self.bin_dir.join("pg_basebackup"));
        // Over TCP, so that the `primary_conninfo` written by `-R` does not
        // depend on the primary's socket directory. A fast checkpoint: the
        // default spreads it over minutes on a primary with dirty buffers.
        // The WAL written during the backup is streamed into it (`-X
        // stream`), so the backup is consistent without archiving.
        //
        // The password goes through the environment, not the command line.
        // `-R` writes it into `primary_conninfo` (in `postgresql.auto.conf`),
        // since the standby's walreceiver must log in too: that file is in the
        // standby's data directory, 0700 and owned by the server user, who
        // can read both servers' data anyway.
        cmd.env("PGPASSWORD", primary.password.as_str())
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-h")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(primary.port.to_string())
            .arg("-U")
            .arg(SERVER_USER)
            .arg("--no-password")
            .arg("--write-recovery-conf")
            .arg("--wal-method=stream")
            .arg("--checkpoint=fast")
            .arg("--label=pgfence-standby")
            .arg("--no-sync");
        self.run_checked(cmd)?;
        Ok(())
    }

    /// Writes `pgfence.conf`, which `postgresql.conf` includes, so that
    /// every later start uses the same settings and port.
    fn write_settings(&self) -> Result<(), EmbeddedError> {
        let options = &self.options;
        let mut settings: Vec<(&str, String)> = vec![
            ("max_connections", "200".to_owned()),
            ("shared_buffers", "128MB".to_owned()),
            ("fsync", if options.fsync { "on" } else { "off" }.to_owned()),
            // Already PostgreSQL's defaults (since 10); stated here because
            // `start_standby` depends on them.
            ("wal_level", "replica".to_owned()),
            ("max_wal_senders", "10".to_owned()),
        ];
        for (name, value) in &options.extra_settings {
            settings.push((name, value.clone()));
        }
        settings.push(("listen_addresses", "127.0.0.1".to_owned()));
        settings.push(("port", self.port.to_string()));
        settings.push((
            "unix_socket_directories",
            self.socket_dir.to_string_lossy().into_owned(),
        ));
        settings.push(("unix_socket_permissions", "0700".to_owned()));
        // Already the default since PostgreSQL 14; stated because `PG_HBA`
        // accepts SCRAM verifiers only.
        settings.push(("password_encryption", "scram-sha-256".to_owned()));

        let mut text = String::new();
        for (name, value) in settings {
            text.push_str(&format!("{name} = {}\n", conf_quote(&value)));
        }
        let path = self.data_dir.join("pgfence.conf");
        fs::write(&path, text)
            .map_err(|e| EmbeddedError::io(format!("writing {}", path.display()), e))?;
        // Readable by the server user even under a restrictive umask.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))
            .map_err(|e| EmbeddedError::io(format!("setting permissions of {}", path.display()), e))
    }

    /// First start: picks a port, retrying with another one when it turns
    /// out to be taken.
    fn start_first(&mut self) -> Result<(), EmbeddedError> {
        let mut attempt = 0;
        loop {
            self.port = free_port()?;
            self.write_settings()?;
            match self.pg_ctl_start() {
                Ok(()) => return Ok(()),
                Err(failure) if failure.port_in_use && attempt < PORT_RETRIES => {
                    attempt += 1;
                    tracing::debug!(
                        port = self.port,
                        attempt,
                        "port already in use, retrying with another one"
                    );
                }
                Err(failure) => return Err(failure.error),
            }
        }
    }

    /// `pg_ctl start -w`, then waits for a TCP connection to succeed.
    fn pg_ctl_start(&self) -> Result<(), StartFailure> {
        let log_offset = fs::metadata(&self.log_file).map(|m| m.len()).unwrap_or(0);
        let started = Instant::now();
        let mut cmd = self.server_command(&self.bin_dir.join("pg_ctl"));
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&self.log_file)
            .arg("-w")
            .arg("-t")
            .arg(PG_CTL_TIMEOUT_SECS.to_string())
            .arg("start");
        let (command, output) = self.run(cmd).map_err(|error| StartFailure {
            port_in_use: false,
            error,
        })?;
        if !output.status.success() {
            let new_log = read_from(&self.log_file, log_offset);
            let port_in_use = new_log.contains("Address already in use")
                || new_log.contains("could not create any TCP/IP sockets");
            let pg_ctl_output = output_tail(&output);
            let log_tail = tail(&new_log, TAIL_LINES);
            let error = if pg_ctl_output.contains("did not start in time") {
                EmbeddedError::NotReady {
                    waited: started.elapsed(),
                    log_tail,
                }
            } else {
                EmbeddedError::Command {
                    command,
                    status: output.status.to_string(),
                    output: format!("{pg_ctl_output}\n--- server log ---\n{log_tail}"),
                }
            };
            return Err(StartFailure { port_in_use, error });
        }

        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + TCP_READY_TIMEOUT;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(250)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartFailure {
                    port_in_use: false,
                    error: EmbeddedError::NotReady {
                        waited: started.elapsed(),
                        log_tail: tail(&read_from(&self.log_file, log_offset), TAIL_LINES),
                    },
                });
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `pg_ctl stop -m <mode> -w`; fine if the server is already stopped.
    fn pg_ctl_stop(&self, mode: &str) -> Result<(), EmbeddedError> {
        let mut cmd = self.server_command(&self.bin_dir.join("pg_ctl"));
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("stop")
            .arg("-m")
            .arg(mode)
            .arg("-w")
            .arg("-t")
            .arg(PG_CTL_TIMEOUT_SECS.to_string());
        let (command, output) = self.run(cmd)?;
        if output.status.success() || !self.is_running() {
            tracing::debug!(port = self.port, mode, "embedded PostgreSQL stopped");
            return Ok(());
        }
        Err(EmbeddedError::Command {
            command,
            status: output.status.to_string(),
            output: output_tail(&output),
        })
    }

    /// Spawns the process that cleans up once the owning process is gone.
    fn spawn_watchdog(&self) -> Result<Watchdog, EmbeddedError> {
        // Signals aimed at the terminal's process group (Ctrl-C) must not
        // kill the watchdog before the pipe closes; it gets its own process
        // group and ignores them anyway.
        const SCRIPT: &str = "trap '' HUP INT QUIT PIPE\n\
                              read -r _line\n\
                              \"$1\" -D \"$2\" stop -m immediate -w -t 30 >/dev/null 2>&1\n\
                              rm -rf \"$3\" >/dev/null 2>&1\n\
                              exit 0\n";
        let mut cmd = self.server_command(Path::new("/bin/sh"));
        cmd.current_dir("/")
            .arg("-c")
            .arg(SCRIPT)
            .arg("pgfence-watchdog")
            .arg(self.bin_dir.join("pg_ctl"))
            .arg(&self.data_dir)
            .arg(&self.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        tracing::debug!(command = %describe(&cmd), "spawning watchdog");
        let mut child = cmd
            .spawn()
            .map_err(|e| EmbeddedError::io("spawning the cleanup watchdog (/bin/sh)", e))?;
        let stdin = child.stdin.take();
        Ok(Watchdog { child, stdin })
    }

    /// A command for `program`, run as the server user when we are root.
    fn server_command(&self, program: &Path) -> Command {
        let mut cmd = match &self.run_as {
            Some(run_as) => {
                let mut cmd = Command::new(&run_as.runuser);
                cmd.arg("-u").arg(run_as.user).arg("--").arg(program);
                cmd
            }
            None => Command::new(program),
        };
        cmd.current_dir(&self.root);
        cmd
    }

    /// Runs `cmd` to completion, capturing its output; returns the command
    /// line for messages as well.
    fn run(&self, mut cmd: Command) -> Result<(String, Output), EmbeddedError> {
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        // Untranslated messages, so that they can be recognized.
        cmd.env("LC_ALL", "C").stdin(Stdio::null());
        let command = describe(&cmd);
        tracing::debug!(command = %command, "running");
        let output = cmd
            .output()
            .map_err(|e| EmbeddedError::io(format!("running `{command}`"), e))?;
        tracing::debug!(command = %command, status = %output.status, "finished");
        Ok((command, output))
    }

    /// Runs `cmd`, failing with [`EmbeddedError::Command`] unless it succeeds.
    fn run_checked(&self, cmd: Command) -> Result<Output, EmbeddedError> {
        let (command, output) = self.run(cmd)?;
        if output.status.success() {
            Ok(output)
        } else {
            Err(EmbeddedError::Command {
                command,
                status: output.status.to_string(),
                output: output_tail(&output),
            })
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

/// Finds the directory with the PostgreSQL server binaries (`initdb`,
/// `pg_ctl`, `postgres`).
///
/// Search order:
///
/// 1. `$PG_BIN`, if set and non-empty. It is authoritative: when it lacks
///    the binaries, the search fails instead of falling back.
/// 2. `pg_ctl` on `$PATH`; symlinks are resolved, so the real bin directory
///    is returned (for example `/usr/lib/postgresql/15/bin` for a
///    `/usr/local/bin/pg_ctl` symlink).
/// 3. `/usr/lib/postgresql/<version>/bin`, newest numeric version first
///    (Debian's layout).
///
/// ```no_run
/// let bin = pgfence::embedded::find_bin_dir()?;
/// println!("pgbench: {}", bin.join("pgbench").display());
/// # Ok::<(), pgfence::embedded::EmbeddedError>(())
/// ```
///
/// # Errors
///
/// [`EmbeddedError::NoBinaries`], listing the directories looked at.
pub fn find_bin_dir() -> Result<PathBuf, EmbeddedError> {
    let pg_bin = std::env::var_os("PG_BIN");
    let path = std::env::var_os("PATH");
    find_bin_dir_from(pg_bin.as_deref(), path.as_deref())
}

/// [`find_bin_dir`] with the values of `PG_BIN` and `PATH` passed in instead
/// of read from the environment (for tests, which must not change the
/// environment of a multi-threaded process).
///
/// # Errors
///
/// As for [`find_bin_dir`].
#[doc(hidden)]
pub fn find_bin_dir_from(
    pg_bin: Option<&OsStr>,
    path: Option<&OsStr>,
) -> Result<PathBuf, EmbeddedError> {
    let mut searched = Vec::new();

    if let Some(pg_bin) = pg_bin.filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(pg_bin);
        if has_binaries(&dir) {
            return Ok(real_bin_dir(&dir).unwrap_or(dir));
        }
        searched.push(dir);
        return Err(EmbeddedError::NoBinaries { searched });
    }

    if let Some(path) = path {
        for dir in std::env::split_paths(path) {
            let pg_ctl = dir.join("pg_ctl");
            if !is_executable(&pg_ctl) {
                continue;
            }
            let candidate = fs::canonicalize(&pg_ctl)
                .ok()
                .and_then(|real| real.parent().map(Path::to_path_buf))
                .unwrap_or(dir);
            if has_binaries(&candidate) {
                return Ok(candidate);
            }
            if !searched.contains(&candidate) {
                searched.push(candidate);
            }
        }
    }

    let lib = Path::new(DEBIAN_PG_LIB);
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(lib)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name();
                    let version = parse_version(name.to_str()?)?;
                    Some((version, entry.path().join("bin")))
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    if versions.is_empty() {
        searched.push(lib.to_path_buf());
    }
    for (_, bin) in versions {
        if has_binaries(&bin) {
            return Ok(bin);
        }
        searched.push(bin);
    }

    Err(EmbeddedError::NoBinaries { searched })
}

/// `"15"` -> `[15]`, `"9.6"` -> `[9, 6]`; `None` for anything else.
fn parse_version(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|part| part.parse().ok()).collect()
}

/// The directory `dir/pg_ctl` really lives in, if it has all binaries too.
fn real_bin_dir(dir: &Path) -> Option<PathBuf> {
    let real = fs::canonicalize(dir.join("pg_ctl")).ok()?;
    let parent = real.parent()?.to_path_buf();
    has_binaries(&parent).then_some(parent)
}

fn has_binaries(dir: &Path) -> bool {
    REQUIRED_BINARIES
        .iter()
        .all(|name| is_executable(&dir.join(name)))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `Some` when the process runs as root: commands then go through `runuser`.
fn resolve_run_as() -> Result<Option<RunAs>, EmbeddedError> {
    if effective_uid() != Some(0) {
        return Ok(None);
    }
    let user_exists = Command::new("id")
        .arg("-u")
        .arg(SERVER_USER)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|status| status.success())
        .unwrap_or(false);
    if !user_exists {
        return Err(EmbeddedError::NoServerUser {
            user: SERVER_USER.to_owned(),
        });
    }
    let runuser = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| is_executable(p))
        .unwrap_or_else(|| PathBuf::from("runuser"));
    Ok(Some(RunAs {
        runuser,
        user: SERVER_USER,
    }))
}

/// Effective uid, from `/proc/self/status` or else `id -u`.
fn effective_uid() -> Option<u32> {
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        if let Some(rest) = status.lines().find_map(|l| l.strip_prefix("Uid:")) {
            // Real, effective, saved, filesystem.
            if let Some(euid) = rest.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
                return Some(euid);
            }
        }
    }
    let output = Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

/// Where to create the temporary directory. As root, the server user must
/// be able to reach it, so a base under a private directory (such as a
/// `TMPDIR` in `/root`) is replaced with `/tmp`.
fn temp_base(as_other_user: bool) -> PathBuf {
    let default = std::env::temp_dir();
    if !as_other_user || world_traversable(&default) {
        return default;
    }
    let tmp = PathBuf::from("/tmp");
    if world_traversable(&tmp) {
        tmp
    } else {
        default
    }
}

fn world_traversable(dir: &Path) -> bool {
    let Ok(dir) = fs::canonicalize(dir) else {
        return false;
    };
    dir.ancestors().all(|d| {
        fs::metadata(d)
            .map(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

/// A port that was free on `127.0.0.1` a moment ago.
fn free_port() -> Result<u16, EmbeddedError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| EmbeddedError::io("binding 127.0.0.1:0 to find a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| EmbeddedError::io("reading the address of a bound socket", e))?
        .port();
    Ok(port)
}

/// A `postgresql.conf` string literal.
fn conf_quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Everything of `path` from byte `offset` on (lossy; empty on errors).
fn read_from(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut file) = fs::File::open(path) {
        let offset = if file.metadata().map(|m| m.len() >= offset).unwrap_or(false) {
            offset
        } else {
            0
        };
        if file.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = file.read_to_end(&mut bytes);
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The tails of a command's stderr and stdout.
fn output_tail(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut text = tail(stderr.trim_end(), TAIL_LINES);
    let stdout = tail(stdout.trim_end(), TAIL_LINES);
    if !stdout.is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&stdout);
    }
    text
}

/// A readable command line for logs and errors.
fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(shell_word)
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_word(word: &OsStr) -> String {
    let text = word.to_string_lossy();
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c));
    if plain {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}
