//! How a server is built and run: its data directory and settings (`initdb`, a base backup for a standby), its
//! `pg_ctl` starts and stops, its watchdog, and the commands run as the server user, with their output kept for
//! errors.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::host::free_port;
use super::{EmbeddedError, EmbeddedServer, PG_CTL_TIMEOUT_SECS, SERVER_USER, TAIL_LINES};

/// How many times a first start is retried with a new port when the chosen
/// port turned out to be taken.
const PORT_RETRIES: usize = 5;

/// How long a TCP connection to the started server is attempted.
const TCP_READY_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The cleanup process; it acts when `stdin` closes.
#[derive(Debug)]
pub(super) struct Watchdog {
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
}

/// Why a `pg_ctl start` failed.
pub(super) struct StartFailure {
    pub(super) port_in_use: bool,
    pub(super) error: EmbeddedError,
}

impl EmbeddedServer {
    /// Initializes the data directory, with the superuser's password and
    /// [`PG_HBA`] as `pg_hba.conf`.
    pub(super) fn initdb(&self) -> Result<(), EmbeddedError> {
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
    pub(super) fn write_data_files(&self) -> Result<(), EmbeddedError> {
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
    pub(super) fn base_backup_of(&self, primary: &EmbeddedServer) -> Result<(), EmbeddedError> {
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
    pub(super) fn start_first(&mut self) -> Result<(), EmbeddedError> {
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
    pub(super) fn pg_ctl_start(&self) -> Result<(), StartFailure> {
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
    pub(super) fn pg_ctl_stop(&self, mode: &str) -> Result<(), EmbeddedError> {
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
    pub(super) fn spawn_watchdog(&self) -> Result<Watchdog, EmbeddedError> {
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
    pub(super) fn server_command(&self, program: &Path) -> Command {
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
    pub(super) fn run(&self, mut cmd: Command) -> Result<(String, Output), EmbeddedError> {
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
    pub(super) fn run_checked(&self, cmd: Command) -> Result<Output, EmbeddedError> {
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

/// A `postgresql.conf` string literal.
fn conf_quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Everything of `path` from byte `offset` on (lossy; empty on errors).
pub(super) fn read_from(path: &Path, offset: u64) -> String {
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
pub(super) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The tails of a command's stderr and stdout.
pub(super) fn output_tail(output: &Output) -> String {
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
