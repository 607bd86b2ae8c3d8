//! Connection strings as libpq reads them: the TLS parameters pgfence resolves itself (taken out of the string,
//! percent-decoded, completed from the libpq environment), one host of a multi-host string, and the forms a
//! string is shown in (redacted, as an endpoint) that never carry a password.

use std::str::FromStr;

use crate::error::{Error, Result};

/// The connection-string parameters pgfence reads itself, and the libpq environment variable of each.
pub(super) const TLS_PARAMETERS: [(&str, &str); 4] = [
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
];

/// The TLS parameters as given: by the connection string, else by the environment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Given {
    pub(super) mode: Option<String>,
    pub(super) root_cert: Option<String>,
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
}

impl Given {
    fn slot(&mut self, name: &str) -> Option<&mut Option<String>> {
        match name {
            "sslmode" => Some(&mut self.mode),
            "sslrootcert" => Some(&mut self.root_cert),
            "sslcert" => Some(&mut self.cert),
            "sslkey" => Some(&mut self.key),
            _ => None,
        }
    }

    /// Fills what the connection string left out from the environment (libpq's precedence).
    pub(super) fn or_env(mut self, env: &dyn Fn(&str) -> Option<String>) -> Given {
        for (name, var) in TLS_PARAMETERS {
            if let Some(slot) = self.slot(name) {
                if slot.is_none() {
                    *slot = env(var).filter(|v| !v.is_empty());
                }
            }
        }
        self
    }
}

/// Takes pgfence's TLS parameters out of a connection string: returns the rest (for tokio-postgres) and the
/// parameters. A string that does not parse is returned whole, for tokio-postgres to report.
pub(super) fn split_tls_parameters(url: &str) -> Result<(String, Given)> {
    let mut given = Given::default();
    let rest = if let Some(scheme) = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|s| url.starts_with(s))
    {
        // As tokio-postgres (and libpq) read a URL: the credentials end at the first `@`, the query starts at the
        // first `?` after them.
        let after_scheme = &url[scheme.len()..];
        let host_start = after_scheme.find('@').map_or(0, |at| at + 1);
        let Some(q) = after_scheme[host_start..].find('?') else {
            return Ok((url.to_owned(), given));
        };
        let query_at = scheme.len() + host_start + q;
        let mut kept = Vec::new();
        for pair in url[query_at + 1..].split('&') {
            let slot = pair
                .split_once('=')
                .and_then(|(key, value)| Some((given.slot(&percent_decode(key)?)?, value)));
            match slot {
                Some((slot, value)) => {
                    *slot = Some(percent_decode(value).ok_or_else(|| Error::InvalidUrl {
                        reason: "a TLS parameter is not valid percent-encoded UTF-8".to_owned(),
                    })?)
                }
                None => kept.push(pair),
            }
        }
        let mut rest = url[..query_at].to_owned();
        if !kept.is_empty() {
            rest.push('?');
            rest.push_str(&kept.join("&"));
        }
        rest
    } else {
        let Some(pairs) = keyword_pairs(url) else {
            return Ok((url.to_owned(), given));
        };
        let mut kept = Vec::new();
        for (key, value, span) in pairs {
            match given.slot(key) {
                Some(slot) => *slot = Some(value),
                None => kept.push(&url[span]),
            }
        }
        kept.join(" ")
    };
    Ok((rest, given))
}

fn percent_decode(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

/// The `key = value` pairs of a libpq keyword/value string (values quoted with `'`, `\` escaping the next
/// character), each with its byte span; `None` if it does not parse. The grammar is tokio-postgres's.
fn keyword_pairs(text: &str) -> Option<Vec<(&str, String, std::ops::Range<usize>)>> {
    let bytes: Vec<(usize, char)> = text.char_indices().collect();
    let mut i = 0;
    let at = |i: usize| bytes.get(i).map_or(text.len(), |&(at, _)| at);
    let mut pairs = Vec::new();
    loop {
        while bytes.get(i).is_some_and(|&(_, c)| c.is_whitespace()) {
            i += 1;
        }
        if i == bytes.len() {
            return Some(pairs);
        }
        let start = i;
        while bytes
            .get(i)
            .is_some_and(|&(_, c)| !c.is_whitespace() && c != '=')
        {
            i += 1;
        }
        let key = &text[at(start)..at(i)];
        while bytes.get(i).is_some_and(|&(_, c)| c.is_whitespace()) {
            i += 1;
        }
        if key.is_empty() || bytes.get(i).map(|&(_, c)| c) != Some('=') {
            return None;
        }
        i += 1;
        while bytes.get(i).is_some_and(|&(_, c)| c.is_whitespace()) {
            i += 1;
        }
        let mut value = String::new();
        let quoted = bytes.get(i).map(|&(_, c)| c) == Some('\'');
        if quoted {
            i += 1;
        }
        loop {
            match bytes.get(i).map(|&(_, c)| c) {
                None if quoted => return None,
                None => break,
                Some('\'') if quoted => {
                    i += 1;
                    break;
                }
                Some(c) if c.is_whitespace() && !quoted => break,
                Some('\\') => {
                    if let Some(&(_, next)) = bytes.get(i + 1) {
                        value.push(next);
                    }
                    i += 2;
                }
                Some(c) => {
                    value.push(c);
                    i += 1;
                }
            }
        }
        if !quoted && value.is_empty() {
            return None;
        }
        pairs.push((key, value, at(start)..at(i.min(bytes.len()))));
    }
}

/// `conninfo` (a `postgres://` URL or a `key=value` string) naming `database` instead of its own database.
///
/// In a URL the path becomes `database` (percent-encoded) and a `dbname` query parameter, which would override the
/// path, is dropped; the rest (credentials, hosts, parameters) is kept as written. A `key=value` string gets a
/// quoted `dbname` after its own parameters, which the last occurrence wins.
///
/// ```
/// assert_eq!(
///     pgfence::connection::with_database("postgres://u@h:5433/app?sslmode=require&dbname=x", "scratch db"),
///     "postgres://u@h:5433/scratch%20db?sslmode=require"
/// );
/// assert_eq!(pgfence::connection::with_database("host=h user=u", "o'k"), r"host=h user=u dbname='o\'k'");
/// ```
pub fn with_database(conninfo: &str, database: &str) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let Some((scheme, rest)) = conninfo.split_once("://") else {
        let quoted = database.replace('\\', "\\\\").replace('\'', "\\'");
        return format!("{conninfo} dbname='{quoted}'");
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let authority = before_query.split('/').next().unwrap_or(before_query);
    let kept: Vec<&str> = query
        .map(|q| q.split('&').filter(|p| !p.starts_with("dbname=")).collect())
        .unwrap_or_default();
    let mut out = format!(
        "{scheme}://{authority}/{}",
        utf8_percent_encode(database, NON_ALPHANUMERIC)
    );
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    out
}

/// A libpq environment of the given variables only, for tests of what the environment completes.
#[cfg(test)]
pub(crate) fn env_of(
    pairs: &'static [(&'static str, &'static str)],
) -> impl Fn(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

/// The libpq environment of this process.
pub(super) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Takes the TLS parameters out of `url` (ignoring errors) so that the rest parses: for redaction.
pub(crate) fn without_tls_parameters(url: &str) -> String {
    split_tls_parameters(url).map_or_else(|_| url.to_owned(), |(rest, _)| rest)
}

/// `config` with only its `i`-th host (and that host's `hostaddr` and port).
pub(super) fn single_host(config: &tokio_postgres::Config, i: usize) -> tokio_postgres::Config {
    use tokio_postgres::config::Host;
    let mut one = tokio_postgres::Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    one.ssl_mode(config.get_ssl_mode());
    one.ssl_negotiation(config.get_ssl_negotiation());
    match &config.get_hosts()[i] {
        Host::Tcp(name) => one.host(name),
        #[cfg(unix)]
        Host::Unix(path) => one.host_path(path),
    };
    if let Some(addr) = config.get_hostaddrs().get(i) {
        one.hostaddr(*addr);
    }
    // libpq: one port for every host, or one per host.
    let ports = config.get_ports();
    if let Some(port) = if ports.len() == 1 {
        ports.first()
    } else {
        ports.get(i)
    } {
        one.port(*port);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    one.keepalives(config.get_keepalives());
    one.keepalives_idle(config.get_keepalives_idle());
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.target_session_attrs(config.get_target_session_attrs());
    one.channel_binding(config.get_channel_binding());
    one
}

/// Shows a connection string as `user@host:port/database`: never a password.
pub fn redact(url: &str) -> String {
    match tokio_postgres::Config::from_str(&without_tls_parameters(url)) {
        Ok(config) => describe(&config),
        Err(_) => "<unparsable connection string>".to_owned(),
    }
}

/// The endpoint a configuration names, as a holder reports it with its beliefs: every host with its port, then
/// the database (`db1:5432,db2:5432/control`), without user, password or any other parameter.
pub(crate) fn endpoint(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            // One port for all hosts, or one per host (tokio-postgres's rule).
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "localhost:5432".to_owned()
    } else {
        hosts.join(",")
    };
    let db = config.get_dbname().or(config.get_user()).unwrap_or("?");
    format!("{hosts}/{db}")
}

/// The database a configuration names first, as `user@host:port/database` (no credentials).
pub(crate) fn describe(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".to_owned());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("?");
    let db = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{db}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_tls_parameters_are_taken_out_and_the_rest_kept_verbatim() {
        let (rest, given) = split_tls_parameters(
            "postgres://app:p%3Fw@db.example.com:6432/control?sslmode=verify-full&application_name=x&\
             sslrootcert=%2Fetc%2Fssl%2Fca%20bundle.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://app:p%3Fw@db.example.com:6432/control?application_name=x&connect_timeout=3"
        );
        assert_eq!(given.mode.as_deref(), Some("verify-full"));
        assert_eq!(given.root_cert.as_deref(), Some("/etc/ssl/ca bundle.pem"));
        let (rest, _) =
            split_tls_parameters("postgresql://u@h/db?sslcert=/c.pem&sslkey=/k.pem").unwrap();
        assert_eq!(rest, "postgresql://u@h/db");
        // A `?` inside the credentials is not the query.
        let (rest, given) = split_tls_parameters("postgres://u:a?b@h/db").unwrap();
        assert_eq!(rest, "postgres://u:a?b@h/db");
        assert_eq!(given, Given::default());
    }

    #[test]
    fn keyword_tls_parameters_are_taken_out_and_the_rest_kept_verbatim() {
        let (rest, given) = split_tls_parameters(
            "host=db  password='it''s' sslmode = verify-ca user=app sslrootcert='/etc/my ca.pem' \
             dbname=x\\ y",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // `''` is not an escape in this grammar: the quoted value ends at the second quote; it stays unparsable
        // for tokio-postgres to report, unchanged.
        assert!(rest.contains("password='it''s'"), "{rest}");
        assert_eq!(given.mode, None);

        let (rest, given) = split_tls_parameters(
            "host=db password='it\\'s' sslmode = verify-ca user=app sslrootcert='/etc/my ca.pem' dbname=x\\ y",
        )
        .unwrap();
        assert_eq!(rest, "host=db password='it\\'s' user=app dbname=x\\ y");
        assert_eq!(given.mode.as_deref(), Some("verify-ca"));
        assert_eq!(given.root_cert.as_deref(), Some("/etc/my ca.pem"));
        let config: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_password(), Some(&b"it's"[..]));
        assert_eq!(config.get_dbname(), Some("x y"));
    }
}
