//! [`EmbeddedError`]: what starting or controlling a server can fail with.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Errors from starting or controlling an [`EmbeddedServer`](super::EmbeddedServer).
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
    pub(super) fn io(context: impl Into<String>, source: io::Error) -> Self {
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
