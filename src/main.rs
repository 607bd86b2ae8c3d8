//! The `pgfence` command: operator access to a pgfence database.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pgfence::{Error, Store, StoreConfig};

/// Fencing-token leases on PostgreSQL rows.
#[derive(Debug, Parser)]
#[command(name = "pgfence", version, about)]
struct Cli {
    /// PostgreSQL connection string (URL or key=value); credentials are never printed.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

    /// The cluster that qualifies lease names.
    #[arg(
        long,
        env = "PGFENCE_CLUSTER",
        default_value = "default",
        global = true
    )]
    cluster: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the pgfence schema (idempotent; concurrent runs take turns).
    Migrate,
    /// Print the database identity (system identifier, database, pgfence instance id, primary or standby) as JSON.
    Identity,
}

/// Exit codes: 0 success, 2 usage, 3 cannot connect, 4 wrong or standby database, 5 schema missing, 1 other.
fn exit_code(err: &Error) -> u8 {
    match err {
        Error::InvalidUrl { .. } | Error::InvalidInput { .. } => 2,
        Error::Connect { .. } | Error::PoolTimeout { .. } => 3,
        Error::NotPrimary { .. } | Error::WrongDatabase { .. } => 4,
        Error::SchemaMissing => 5,
        _ => 1,
    }
}

async fn run(cli: Cli) -> Result<(), Error> {
    let Some(url) = cli.database_url else {
        return Err(Error::InvalidUrl {
            reason: "this command needs --database-url or DATABASE_URL".to_owned(),
        });
    };
    let store = Store::connect(StoreConfig::new(url, cli.cluster).pool_size(2)).await?;
    match cli.command {
        Command::Migrate => {
            let applied = store.migrate().await?;
            if applied.is_empty() {
                println!("pgfence schema is up to date");
            } else {
                println!("applied migrations: {}", applied.join(", "));
            }
        }
        Command::Identity => {
            let identity = store.identity().await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&identity).expect("identity serializes")
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PGFENCE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pgfence: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("pgfence: {err}");
            ExitCode::from(exit_code(&err))
        }
    }
}
