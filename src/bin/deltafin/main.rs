//! The `deltafin` binary: CLI and server over the library.

use clap::Parser;

mod bench;
mod cli;

// Counts live bytes so `bench forward --context` can report what one step allocates.
#[global_allocator]
static ALLOC: deltafin::alloc_count::CountingAlloc = deltafin::alloc_count::CountingAlloc;

fn main() -> anyhow::Result<()> {
    deltafin::init();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    cli::run(cli::Cli::parse())
}
