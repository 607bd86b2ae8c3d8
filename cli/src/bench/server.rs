//! The server the benchmark runs on (a throwaway one, or the one of `--database-url`): the scratch databases it
//! creates and drops there, its cluster-wide counters, and the configuration of the connections to it.

use std::time::Duration;

use pgfence::embedded::{EmbeddedOptions, EmbeddedServer};
use pgfence::{ExpectedIdentity, StoreConfig};

use super::plan::Plan;
use super::workload::TAKEOVER_CONNECTIONS;
use super::{db_error, Failure, Global};

/// The server the benchmark runs on and the scratch databases it created there.
pub(super) struct Server {
    pub(super) embedded: Option<EmbeddedServer>,
    /// URL of the maintenance database (the one given, or the embedded server's `postgres`).
    pub(super) url: String,
    pub(super) admin: tokio_postgres::Client,
    created: Vec<String>,
    prefix: String,
}

pub(crate) async fn connect_admin(url: &str) -> Result<tokio_postgres::Client, Failure> {
    // TLS as for every pgfence connection: the URL's sslmode/sslrootcert/…, else PGSSLMODE/PGSSLROOTCERT/….
    let mut connector = pgfence::connection::Connector::new(url)?;
    let config = connector.config_mut();
    if config.get_application_name().is_none() {
        config.application_name("pgfence-bench");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    let (client, connection) = connector.connect().await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

impl Server {
    /// A throwaway server from the binaries in `bin` (else PG_BIN's, or the ones found on PATH).
    pub(super) async fn embedded(
        plan: &Plan,
        fsync: bool,
        bin: Option<std::path::PathBuf>,
    ) -> Result<Server, Failure> {
        let mut settings = vec![(
            "max_connections".to_owned(),
            plan.connections_needed().max(200).to_string(),
        )];
        // The server's library directory: lib/ next to bin/ (Debian's layout) or lib/postgresql/ (a packaged
        // installation's, e.g. .ci/pg-versions').
        let pgss = bin
            .clone()
            .or_else(|| pgfence::embedded::find_bin_dir().ok())
            .and_then(|bin| bin.parent().map(std::path::Path::to_path_buf))
            .is_some_and(|root| {
                ["lib", "lib/postgresql"]
                    .iter()
                    .any(|dir| root.join(dir).join("pg_stat_statements.so").is_file())
            });
        if pgss {
            settings.push((
                "shared_preload_libraries".to_owned(),
                "pg_stat_statements".to_owned(),
            ));
        }
        let mut options = EmbeddedOptions::default();
        options.fsync = fsync;
        options.extra_settings = settings;
        options.bin_dir = bin;
        let server = tokio::task::spawn_blocking(move || EmbeddedServer::start_with(options))
            .await
            .map_err(|e| Failure::new(1, e.to_string()))??;
        let url = server.url();
        let admin = connect_admin(&url).await?;
        Ok(Server {
            embedded: Some(server),
            url,
            admin,
            created: Vec::new(),
            prefix: "pgfence_bench".to_owned(),
        })
    }

    pub(super) async fn remote(url: &str, plan: &Plan) -> Result<Server, Failure> {
        let admin = connect_admin(url).await?;
        let row = admin
            .query_one(
                "SELECT current_setting('max_connections')::int - \
                        current_setting('superuser_reserved_connections')::int - \
                        (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int",
                &[],
            )
            .await
            .map_err(|e| db_error("reading max_connections", e))?;
        let free: i32 = row.get(0);
        if free < plan.connections_needed() as i32 {
            return Err(Failure::new(
                2,
                format!(
                    "the benchmark needs {} connections at once ({} writers), the server has {free} free: \
                     lower --concurrency or raise max_connections",
                    plan.connections_needed(),
                    plan.max_concurrency()
                ),
            ));
        }
        Ok(Server {
            embedded: None,
            url: url.to_owned(),
            admin,
            created: Vec::new(),
            prefix: format!(
                "pgfence_bench_{}",
                chrono::Utc::now().format("%Y%m%d%H%M%S")
            ),
        })
    }

    pub(super) fn url_for(&self, database: &str) -> String {
        match &self.embedded {
            Some(server) => server.url_for(database),
            None => pgfence::connection::with_database(&self.url, database),
        }
    }

    pub(super) async fn create_database(&mut self, suffix: &str) -> Result<String, Failure> {
        let name = format!("{}{suffix}", self.prefix);
        self.admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .map_err(|e| {
                db_error(
                    &format!("creating the scratch database {name} (the benchmark needs CREATEDB)"),
                    e,
                )
            })?;
        self.created.push(name.clone());
        Ok(name)
    }

    /// Drops the scratch databases of a server the benchmark did not start.
    pub(super) async fn cleanup(&mut self) {
        if self.embedded.is_some() {
            return;
        }
        for name in self.created.drain(..) {
            if let Err(e) = self
                .admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
            {
                eprintln!("pgfence bench: could not drop the scratch database {name}: {e}");
            }
        }
    }

    /// Cluster-wide counters: (next MultiXact id, next transaction id). `mxid_age` is measured against the
    /// current next MultiXact id, so this needs no checkpoint and no privilege.
    pub(super) async fn counters(&self) -> Result<(u64, u64), Failure> {
        let row = self
            .admin
            .query_one(
                "SELECT ((datminmxid::text::bigint + mxid_age(datminmxid)) % 4294967296)::bigint, \
                        pg_snapshot_xmax(pg_current_snapshot())::text::bigint \
                   FROM pg_database WHERE datname = current_database()",
                &[],
            )
            .await
            .map_err(|e| db_error("reading the MultiXact counter", e))?;
        Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
    }
}

pub(super) fn delta(before: (u64, u64), after: (u64, u64)) -> (u64, u64) {
    (
        after.0.wrapping_sub(before.0) % (1 << 32),
        after.1.saturating_sub(before.1),
    )
}

pub(super) fn store_config(url: &str, plan: &Plan, global: &Global) -> StoreConfig {
    StoreConfig::new(url, "bench")
        // The takeover measurement's busy writers, its zombie write and its acquisition each hold a connection
        // at once. The pool's check-out is not first come, first served (a returned connection goes to whoever
        // asks next), so with fewer connections than writers one writer can wait out the whole measurement.
        .pool_size(plan.max_concurrency().max(TAKEOVER_CONNECTIONS))
        .connect_timeout(global.connect_timeout)
        .checkout_timeout(Duration::from_secs(60))
        .application_name("pgfence-bench")
        .expect(ExpectedIdentity {
            system_identifier: global.expect_system_identifier.clone(),
            instance_id: None,
            database: None,
        })
}

pub(super) fn raw_config(url: &str) -> Result<pgfence::connection::Connector, Failure> {
    let mut connector = pgfence::connection::Connector::new(url)?;
    connector.config_mut().application_name("pgfence-bench-raw");
    Ok(connector)
}
