//! What a server needs from the machine: the PostgreSQL binaries ([`find_bin_dir`]), the OS user to run them
//! as when this process is root, a temporary directory that user can reach, and a free port.

use std::ffi::OsStr;
use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{EmbeddedError, SERVER_USER};

/// Binaries that must be present in a PostgreSQL bin directory.
const REQUIRED_BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// Where Debian and Ubuntu install the versioned server binaries.
const DEBIAN_PG_LIB: &str = "/usr/lib/postgresql";

/// How to run commands as the server user.
#[derive(Debug, Clone)]
pub(super) struct RunAs {
    pub(super) runuser: PathBuf,
    pub(super) user: &'static str,
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
pub(super) fn resolve_run_as() -> Result<Option<RunAs>, EmbeddedError> {
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
pub(super) fn temp_base(as_other_user: bool) -> PathBuf {
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
pub(super) fn free_port() -> Result<u16, EmbeddedError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| EmbeddedError::io("binding 127.0.0.1:0 to find a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| EmbeddedError::io("reading the address of a bound socket", e))?
        .port();
    Ok(port)
}
