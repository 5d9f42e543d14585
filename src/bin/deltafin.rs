//! The `deltafin` binary: CLI and server over the library.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    deltafin::init_threads();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    deltafin::cli::run(deltafin::cli::Cli::parse())
}
