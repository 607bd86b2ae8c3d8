//! [`TenureSecret`]: what proves a tenure besides its epoch.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits::SECRET_LEN;

/// The secret of one tenure: the database returns it once, with the epoch, when it grants the tenure, and keeps
/// only its SHA-256, which no role but the schema owner can read. Every guarded write, renewal and release
/// presents it, so knowing a tenure's (lease, epoch) — from the tables, an error or a log — is not enough to
/// write under it or to end it.
///
/// It never shows: `Debug` prints `TenureSecret(<redacted>)`, there is no `Display`, and pgfence puts it in no
/// log, error, audit row or CLI output. It does serialize (as its text), so that a leader can hand its
/// [`Fence`](crate::Fence) to its own workers: treat a serialized fence like a credential.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenureSecret(String);

impl TenureSecret {
    /// A secret from its text: the 64 hexadecimal characters `pgfence.acquire` returned.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when the text is not [`SECRET_LEN`] hexadecimal characters; the text is never
    /// repeated in the error.
    pub fn parse(text: impl Into<String>) -> Result<TenureSecret> {
        let text = text.into();
        if text.len() != SECRET_LEN || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(
                "tenure secret",
                format!("must be {SECRET_LEN} hexadecimal characters"),
            ));
        }
        Ok(TenureSecret(text))
    }

    /// The secret's text, to pass to the SQL functions yourself (`pgfence.fence(lease, epoch, secret, …)`).
    /// Never log it.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenureSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenureSecret(<redacted>)")
    }
}

impl TryFrom<String> for TenureSecret {
    type Error = Error;
    fn try_from(text: String) -> Result<TenureSecret> {
        TenureSecret::parse(text)
    }
}

impl From<TenureSecret> for String {
    fn from(secret: TenureSecret) -> String {
        secret.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenure secret is exactly `SECRET_LEN` hexadecimal characters (either condition alone is not enough);
    /// `Debug` shows nothing of it; serde writes its text and reads it back through the same check, as a fence
    /// handed to a worker is.
    #[test]
    fn tenure_secrets_parse_strictly_redact_and_round_trip() {
        let text = "a1".repeat(SECRET_LEN / 2);
        let secret = TenureSecret::parse(text.clone()).unwrap();
        assert_eq!(secret.expose_secret(), text);
        for bad in [
            "a1".repeat(SECRET_LEN / 2 - 1),
            "a1".repeat(SECRET_LEN / 2 + 1),
            "g1".repeat(SECRET_LEN / 2),
            String::new(),
        ] {
            let error = TenureSecret::parse(bad.clone()).unwrap_err();
            assert!(
                matches!(&error, Error::InvalidInput { field, .. } if *field == "tenure secret"),
                "{error}"
            );
            assert!(TenureSecret::try_from(bad).is_err());
        }
        assert_eq!(format!("{secret:?}"), "TenureSecret(<redacted>)");
        let json = serde_json::to_string(&secret).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<TenureSecret>(&json).unwrap(), secret);
        assert!(serde_json::from_str::<TenureSecret>("\"g1\"").is_err());
        assert_eq!(String::from(secret), text);
    }
}
