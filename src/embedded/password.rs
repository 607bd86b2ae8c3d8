//! The superuser's password: random, and never shown.

use std::fmt::{self, Write as _};
use std::fs;
use std::io::Read;

use super::EmbeddedError;

/// Random bytes in the superuser's password.
const PASSWORD_BYTES: usize = 32;

/// The superuser's password. `Debug` does not show it.
#[derive(Clone)]
pub(super) struct Password(String);

impl Password {
    /// [`PASSWORD_BYTES`] bytes from the kernel's CSPRNG, hex-encoded, so that
    /// the password needs no quoting in a URL, a conninfo string or a file.
    ///
    /// Read from `/dev/urandom` rather than through a crate: this module
    /// relies on Linux already (`runuser`, `/proc`), and it is the same
    /// kernel source the `getrandom` crate reads. `fastrand`, a dependency
    /// for jitter, is not cryptographic.
    pub(super) fn generate() -> Result<Self, EmbeddedError> {
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

    pub(super) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<hidden>)")
    }
}
