//! TLS against real PostgreSQL: a throwaway server with `ssl = on` and a certificate from a CA this test
//! generates, and one without TLS.
//!
//! Invariants checked: a connection is never made to a server whose certificate the `sslmode` does not accept
//! (a typed `Error::Tls` naming the cause, exit 9 in the command line); every connection pgfence opens (pool,
//! migrations, LISTEN, cancel requests, the command line) is encrypted when the mode asks for it, as the server
//! itself reports in `pg_stat_ssl`; the connection string wins over the libpq environment, which wins over the
//! default `prefer`; credentials are never printed.
#![cfg(feature = "tls")]

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use diesel::sql_types::{Bool, Nullable, Text};
use pgfence::connection::Connector;
use pgfence::embedded::{EmbeddedOptions, EmbeddedServer};
use pgfence::leader::{Elector, PgElector};
use pgfence::{Error, ExpectedIdentity, SslMode, Store, StoreConfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::json;

const TTL: Duration = Duration::from_secs(10);

/// Certificates written for the clients: the server's CA, an unrelated CA, and a client certificate.
struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    other_ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

struct Servers {
    /// `ssl = on`: certificate for `localhost` and `127.0.0.1` signed by [`Pki::ca`]; asks for (but does not
    /// require) a client certificate from that CA.
    tls: EmbeddedServer,
    /// No TLS at all.
    plain: EmbeddedServer,
    pki: Pki,
}

static SERVERS: OnceLock<Servers> = OnceLock::new();
static NEXT_DB: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    (params, key, pem)
}

fn signed(
    names: &[&str],
    common_name: &str,
    usage: rcgen::ExtendedKeyUsagePurpose,
    issuer: &Issuer<'_, &KeyPair>,
) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn servers() -> &'static Servers {
    SERVERS.get_or_init(|| {
        let (ca_params, ca_key, ca_pem) = ca("pgfence test CA");
        let (_, _, other_ca_pem) = ca("some other CA");
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let (server_cert, server_key) = signed(
            &["localhost", "127.0.0.1"],
            "localhost",
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            &issuer,
        );
        let (client_cert, client_key) = signed(
            &[],
            "pgfence-client",
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            &issuer,
        );
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let pki = Pki {
            ca: write("ca.pem", &ca_pem),
            other_ca: write("other-ca.pem", &other_ca_pem),
            client_cert: write("client.crt", &client_cert),
            client_key: write("client.key", &client_key),
            _dir: dir,
        };
        let mut options = EmbeddedOptions::default();
        options.extra_settings = [
            ("ssl", "on"),
            ("ssl_cert_file", "server.crt"),
            ("ssl_key_file", "server.key"),
            ("ssl_ca_file", "ca.crt"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        options.data_files = vec![
            ("server.crt".to_owned(), server_cert.into_bytes()),
            ("server.key".to_owned(), server_key.into_bytes()),
            ("ca.crt".to_owned(), ca_pem.into_bytes()),
        ];
        let tls =
            EmbeddedServer::start_with(options).expect("start a PostgreSQL server with ssl = on");
        let plain = EmbeddedServer::start().expect("start a PostgreSQL server without TLS");
        Servers { tls, plain, pki }
    })
}

/// `server`'s URL for `database` with `host` as the host name (connecting to 127.0.0.1 through `hostaddr` when
/// the name does not resolve there) and the query parameters `params`.
fn url(server: &EmbeddedServer, host: &str, database: &str, params: &str) -> String {
    let base = server
        .url_for(database)
        .replacen("@127.0.0.1:", &format!("@{host}:"), 1);
    let mut params = vec![params];
    if host != "127.0.0.1" && host != "localhost" {
        params.push("hostaddr=127.0.0.1");
    }
    params.retain(|p| !p.is_empty());
    if params.is_empty() {
        base
    } else {
        format!("{base}?{}", params.join("&"))
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A fresh database on `server`, created over a plaintext admin connection.
async fn fresh_database(server: &EmbeddedServer) -> String {
    let name = format!(
        "tls_{}_{}",
        std::process::id(),
        NEXT_DB.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let admin = Connector::new(&url(server, "127.0.0.1", "postgres", "sslmode=disable")).unwrap();
    let (client, connection) = admin.connect().await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    name
}

/// Whether the server sees this store's (pooled) connection as TLS, and the client certificate's DN if any.
async fn ssl_of(store: &Store) -> (bool, Option<String>) {
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = Bool)]
        ssl: bool,
        #[diesel(sql_type = Nullable<Text>)]
        client_dn: Option<String>,
    }
    let mut conn = store.admin().conn().await.unwrap();
    let row: Row =
        diesel::sql_query("SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .get_result(&mut *conn)
            .await
            .unwrap();
    (row.ssl, row.client_dn)
}

async fn connect(url: &str) -> pgfence::Result<Store> {
    Store::connect(StoreConfig::new(url, "tls").connect_timeout(Duration::from_secs(5))).await
}

/// The cause of an `Error::Tls`, which never carries the password.
fn tls_cause(result: pgfence::Result<Store>) -> String {
    match result {
        Err(err @ Error::Tls { .. }) => {
            let text = err.to_string();
            for server in [&servers().tls, &servers().plain] {
                assert!(!text.contains(&server_password(&server.url())), "{text}");
            }
            match err {
                Error::Tls { cause, .. } => cause,
                _ => unreachable!(),
            }
        }
        other => panic!("expected Error::Tls, got {other:?}"),
    }
}

fn server_password(url: &str) -> String {
    let connector = Connector::new(url).unwrap();
    String::from_utf8_lossy(connector.config().get_password().unwrap()).into_owned()
}

/// verify-full accepts the server's certificate when it chains to sslrootcert and names the host connected to,
/// by DNS name and by IP address; the server sees the connection as TLS, without a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_connects_with_the_right_ca_and_host_name() {
    let s = servers();
    for host in ["localhost", "127.0.0.1"] {
        let url = url(
            &s.tls,
            host,
            "postgres",
            &format!("sslmode=verify-full&sslrootcert={}", path(&s.pki.ca)),
        );
        let store = connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert_eq!(ssl_of(&store).await, (true, None), "{host}");
        // The TLS parameters do not stop redaction (tokio-postgres alone cannot parse `verify-full`).
        assert_eq!(
            pgfence::connection::redact(&url),
            format!("postgres@{host}:{}/postgres", s.tls.port())
        );
    }
}

/// verify-full refuses a server whose certificate does not chain to sslrootcert: a typed TLS error that says
/// "unknown issuer", before anything is sent (no credentials leave the client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_from_another_ca() {
    let s = servers();
    let url = url(
        &s.tls,
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={}", path(&s.pki.other_ca)),
    );
    let cause = tls_cause(connect(&url).await);
    assert!(cause.contains("unknown issuer"), "{cause}");
}

/// verify-full refuses a certificate from the right CA that does not name the host connected to, and says
/// which name it expected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_for_another_host_name() {
    let s = servers();
    let url = url(
        &s.tls,
        "db.example.invalid",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={}", path(&s.pki.ca)),
    );
    let cause = tls_cause(connect(&url).await);
    assert!(
        cause.contains("not valid for name") && cause.contains("db.example.invalid"),
        "{cause}"
    );
}

/// verify-ca checks the chain only: the right CA under a wrong host name connects (over TLS), another CA does
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_checks_the_chain_but_not_the_host_name() {
    let s = servers();
    let right = url(
        &s.tls,
        "db.example.invalid",
        "postgres",
        &format!("sslmode=verify-ca&sslrootcert={}", path(&s.pki.ca)),
    );
    let store = connect(&right).await.unwrap();
    assert!(ssl_of(&store).await.0);
    let wrong = url(
        &s.tls,
        "localhost",
        "postgres",
        &format!("sslmode=verify-ca&sslrootcert={}", path(&s.pki.other_ca)),
    );
    assert!(tls_cause(connect(&wrong).await).contains("unknown issuer"));
}

/// require encrypts without verifying (any certificate, any name) — unless sslrootcert is given, then it
/// verifies the chain like verify-ca, as libpq does — and refuses a server that offers no TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_encrypts_and_refuses_a_server_without_tls() {
    let s = servers();
    let store = connect(&url(
        &s.tls,
        "db.example.invalid",
        "postgres",
        "sslmode=require",
    ))
    .await
    .unwrap();
    assert!(ssl_of(&store).await.0);

    let with_root = url(
        &s.tls,
        "localhost",
        "postgres",
        &format!("sslmode=require&sslrootcert={}", path(&s.pki.other_ca)),
    );
    assert!(tls_cause(connect(&with_root).await).contains("unknown issuer"));

    let cause =
        tls_cause(connect(&url(&s.plain, "127.0.0.1", "postgres", "sslmode=require")).await);
    assert!(cause.contains("server does not support TLS"), "{cause}");
}

/// A tracing writer into a buffer, to read pgfence's debug events.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// prefer (the default) uses TLS when the server offers it and falls back to plaintext when it does not, or
/// when the handshake fails (as libpq does), saying so at debug level.
#[tokio::test(flavor = "current_thread")]
async fn prefer_falls_back_to_plaintext_against_a_server_without_tls() {
    let s = servers();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // No sslmode anywhere: prefer.
    let plain = Connector::new(&url(&s.plain, "127.0.0.1", "postgres", "")).unwrap();
    assert_eq!(plain.ssl_mode(), SslMode::Prefer);
    let (client, connection) = plain.connect().await.unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0));
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("offers no TLS; sslmode=prefer continues in plaintext"),
        "{log}"
    );

    let tls = Connector::new(&url(&s.tls, "127.0.0.1", "postgres", "sslmode=prefer")).unwrap();
    let (client, connection) = tls.connect().await.unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));

    let failing = Connector::new(&url(
        &s.tls,
        "localhost",
        "postgres",
        &format!("sslmode=prefer&sslrootcert={}", path(&s.pki.other_ca)),
    ))
    .unwrap();
    let (client, connection) = failing.connect().await.unwrap();
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0));
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("TLS handshake failed; sslmode=prefer continues in plaintext")
            && log.contains("unknown issuer"),
        "{log}"
    );
}

/// sslcert/sslkey present a client certificate, which the server verifies against its CA and reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented() {
    let s = servers();
    let store = connect(&url(
        &s.tls,
        "localhost",
        "postgres",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            path(&s.pki.ca),
            path(&s.pki.client_cert),
            path(&s.pki.client_key)
        ),
    ))
    .await
    .unwrap();
    let (ssl, dn) = ssl_of(&store).await;
    assert!(ssl);
    assert!(
        dn.as_deref()
            .is_some_and(|dn| dn.contains("CN=pgfence-client")),
        "{dn:?}"
    );
    // A missing file is an error naming it, not a silent connection without the certificate.
    let missing = connect(&url(
        &s.tls,
        "localhost",
        "postgres",
        "sslmode=require&sslcert=/nonexistent/client.crt&sslkey=/nonexistent/client.key",
    ))
    .await;
    assert!(tls_cause(missing).contains("/nonexistent/client.crt"));
}

/// Waits until a backend of `database` runs `LISTEN pgfence_lease_free`, and returns whether it is TLS.
async fn listener_ssl(observer: &tokio_postgres::Client, database: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = observer
            .query(
                "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.datname = $1 AND a.query = 'LISTEN pgfence_lease_free'",
                &[&database],
            )
            .await
            .unwrap();
        if let Some(row) = rows.first() {
            return row.get(0);
        }
        assert!(Instant::now() < deadline, "no LISTEN connection appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every connection of a store opened over verify-full is TLS: migrations, the pool (a guarded write), and the
/// LISTEN connection, whose release notification wakes a waiter long before its fallback timeout.
async fn guarded_write_and_wakeup(store: Store, database: &str) {
    let s = servers();
    store.migrate().await.expect("migrate over TLS");
    let lease = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store
        .tasks()
        .create(&lease.fence(), "job-1", &json!({"over": "tls"}))
        .await
        .expect("a guarded write over TLS");

    let elector = PgElector::new(store.clone());
    let mut wakeups = elector.wakeups();
    let observer =
        Connector::new(&url(&s.tls, "127.0.0.1", "postgres", "sslmode=disable")).unwrap();
    let (observer, connection) = observer.connect().await.unwrap();
    tokio::spawn(connection);
    assert!(
        listener_ssl(&observer, database).await,
        "the LISTEN connection is not TLS"
    );
    let started = Instant::now();
    store.release(&lease).await.unwrap();
    wakeups
        .wait(&elector.qualify("sched"), Duration::from_secs(20))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken after {:?}: the notification did not arrive",
        started.elapsed()
    );
    // No connection to this database is in plaintext.
    let plaintext: i64 = observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = $1 AND NOT s.ssl",
            &[&database],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plaintext, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_write_and_a_listen_wakeup_work_over_tls() {
    let s = servers();
    let db = fresh_database(&s.tls).await;
    let store = connect(&url(
        &s.tls,
        "localhost",
        &db,
        &format!("sslmode=verify-full&sslrootcert={}", path(&s.pki.ca)),
    ))
    .await
    .unwrap();
    guarded_write_and_wakeup(store, &db).await;
}

/// The application's own rustls configuration (`StoreConfig::tls`) secures the store and decides verification;
/// without an sslmode it demands TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applications_rustls_configuration_secures_the_store() {
    use pgfence::reexports::rustls;
    let s = servers();
    let config_with = |ca: &Path| {
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
        )
    };
    let store = Store::connect(
        StoreConfig::new(url(&s.tls, "localhost", "postgres", ""), "tls")
            .tls(config_with(&s.pki.ca)),
    )
    .await
    .unwrap();
    assert!(ssl_of(&store).await.0);
    let refused = Store::connect(
        StoreConfig::new(url(&s.tls, "localhost", "postgres", ""), "tls")
            .tls(config_with(&s.pki.other_ca)),
    )
    .await;
    assert!(tls_cause(refused).contains("unknown issuer"));
    let mixed = Store::connect(
        StoreConfig::new(
            url(&s.tls, "localhost", "postgres", "sslrootcert=/etc/ca.pem"),
            "tls",
        )
        .tls(config_with(&s.pki.ca)),
    )
    .await;
    assert!(matches!(mixed, Err(Error::InvalidUrl { .. })), "{mixed:?}");
    let demanded = Store::connect(
        StoreConfig::new(url(&s.plain, "127.0.0.1", "postgres", ""), "tls")
            .tls(config_with(&s.pki.ca)),
    )
    .await;
    assert!(tls_cause(demanded).contains("server does not support TLS"));
}

/// A store wrapping the application's own TLS pool (`Store::from_pool`) migrates, writes and LISTENs through
/// connections the pool's manager opens: all of them TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_an_applications_tls_pool_migrates_and_listens() {
    use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
    use diesel_async::AsyncPgConnection;
    let s = servers();
    let db = fresh_database(&s.tls).await;
    let connector = Arc::new(
        Connector::new(&url(
            &s.tls,
            "localhost",
            &db,
            &format!("sslmode=verify-full&sslrootcert={}", path(&s.pki.ca)),
        ))
        .unwrap(),
    );
    let mut manager_config = ManagerConfig::default();
    manager_config.custom_setup = Box::new(move |_| {
        let connector = connector.clone();
        Box::pin(async move {
            let (client, connection) = connector
                .connect()
                .await
                .map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))?;
            AsyncPgConnection::try_from_client_and_connection(client, connection).await
        })
    });
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config("", manager_config);
    let pool = bb8::Pool::builder()
        .max_size(2)
        .build(manager)
        .await
        .unwrap();
    let store = Store::from_pool(pool, "app", ExpectedIdentity::default())
        .await
        .unwrap();
    guarded_write_and_wakeup(store, &db).await;
}

/// A statement abandoned mid-flight is cancelled on the server by a cancel request sent over TLS (the server
/// would otherwise keep it waiting for its lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_statement_is_cancelled_over_tls() {
    let s = servers();
    let db = fresh_database(&s.tls).await;
    let store = Store::connect(
        StoreConfig::new(
            url(
                &s.tls,
                "localhost",
                &db,
                &format!("sslmode=verify-full&sslrootcert={}", path(&s.pki.ca)),
            ),
            "c",
        )
        .pool_size(1),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    let first = store.acquire("sched", "pod-a", TTL).await.unwrap();
    store.release(&first).await.unwrap();

    let admin = Connector::new(&url(&s.tls, "127.0.0.1", &db, "sslmode=disable")).unwrap();
    let (blocker, connection) = admin.connect().await.unwrap();
    tokio::spawn(connection);
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .query_one(
            "SELECT 1 FROM pgfence.leases WHERE name = 'c/sched' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let (observer, connection) = admin.connect().await.unwrap();
    tokio::spawn(connection);
    let store2 = store.clone();
    let attempt = tokio::spawn(async move { store2.acquire("sched", "pod-b", TTL).await });
    let secs = Duration::from_secs;
    common::wait_for_lock_waiters(&observer, secs(10), |n| n > 0, "the acquire never waited").await;
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    // Well within the functions' own bound on lock waits (several seconds), which would end the wait too.
    common::wait_for_lock_waiters(
        &observer,
        secs(2),
        |n| n == 0,
        "the abandoned acquire is still waiting: the cancel request did not arrive",
    )
    .await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the `pgfence` binary with `DATABASE_URL=url` and `env`, in a clean libpq environment (no inherited
/// PGSSL* variables, a HOME without `~/.postgresql`). The password never appears in its output.
async fn pgfence(args: &[&str], url: &str, env: &[(&str, String)]) -> Run {
    let home = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(common::pgfence_bin());
    command
        .args(args)
        .env("DATABASE_URL", url)
        .env("HOME", home.path())
        .env_remove("PGFENCE_CLUSTER");
    for var in ["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"] {
        command.env_remove(var);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().await.expect("run pgfence");
    let run = Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    let password = server_password(url);
    assert!(
        !run.stdout.contains(&password) && !run.stderr.contains(&password),
        "the password leaked"
    );
    run
}

/// The command line reads PGSSLMODE and PGSSLROOTCERT from its environment; the URL's own sslmode wins over
/// them; a failed verification is exit 9 with the cause, a verifying mode without roots is exit 2 with the
/// parameter to set, and `require` against a server without TLS is exit 9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_honors_the_libpq_environment() {
    let s = servers();
    let plain_url = url(&s.tls, "localhost", "postgres", "");
    let env =
        |mode: &str, ca: &Path| vec![("PGSSLMODE", mode.to_owned()), ("PGSSLROOTCERT", path(ca))];

    let ok = pgfence(&["identity"], &plain_url, &env("verify-full", &s.pki.ca)).await;
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("primary"), "{}", ok.stdout);

    let wrong_ca = pgfence(
        &["identity"],
        &plain_url,
        &env("verify-full", &s.pki.other_ca),
    )
    .await;
    assert_eq!(wrong_ca.code, 9, "{}", wrong_ca.stderr);
    assert!(
        wrong_ca.stderr.contains("unknown issuer"),
        "{}",
        wrong_ca.stderr
    );

    let wrong_name = pgfence(
        &["identity"],
        &url(&s.tls, "db.example.invalid", "postgres", ""),
        &env("verify-full", &s.pki.ca),
    )
    .await;
    assert_eq!(wrong_name.code, 9, "{}", wrong_name.stderr);
    assert!(
        wrong_name.stderr.contains("not valid for name"),
        "{}",
        wrong_name.stderr
    );

    // The URL's sslmode wins over PGSSLMODE (the other CA would fail verification).
    let url_wins = pgfence(
        &["identity"],
        &url(&s.tls, "localhost", "postgres", "sslmode=require"),
        &[("PGSSLMODE", "verify-full".to_owned())],
    )
    .await;
    assert_eq!(url_wins.code, 0, "{}", url_wins.stderr);

    let no_roots = pgfence(
        &["identity"],
        &plain_url,
        &[("PGSSLMODE", "verify-full".to_owned())],
    )
    .await;
    assert_eq!(no_roots.code, 2, "{}", no_roots.stderr);
    assert!(
        no_roots.stderr.contains("sslrootcert"),
        "{}",
        no_roots.stderr
    );

    let no_tls = pgfence(
        &["identity"],
        &url(&s.plain, "127.0.0.1", "postgres", ""),
        &[("PGSSLMODE", "require".to_owned())],
    )
    .await;
    assert_eq!(no_tls.code, 9, "{}", no_tls.stderr);
    assert!(
        no_tls.stderr.contains("server does not support TLS"),
        "{}",
        no_tls.stderr
    );

    let help = pgfence(&["--help"], &plain_url, &[]).await;
    assert!(
        help.stdout.contains("sslmode=verify-full&sslrootcert="),
        "{}",
        help.stdout
    );
    assert!(help.stdout.contains("9 TLS"), "{}", help.stdout);
}
