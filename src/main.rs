//! The `pgfence` command line: see `pgfence --help` and the README's CLI reference.
#![forbid(unsafe_code)]

mod cli;

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PGFENCE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    cli::main()
}
