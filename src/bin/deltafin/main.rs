//! The `deltafin` binary: CLI and server over the library.

use clap::Parser;

mod bench;
mod cli;

// Counts live bytes so `bench forward --context` can report what one step allocates.
#[global_allocator]
static ALLOC: deltafin::alloc_count::CountingAlloc = deltafin::alloc_count::CountingAlloc;

fn main() -> anyhow::Result<()> {
    deltafin::init(std::env::var_os("RAYON_NUM_THREADS").is_some());
    // Test and comparison switches, read here so the library reads no environment.
    if let Some(v) = std::env::var("DELTAFIN_DISK_FREE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        deltafin::fsio::override_free_bytes(v);
    }
    if std::env::var_os("DELTAFIN_PORTABLE_DENSE").is_some() {
        deltafin::kernels::dense::use_portable_kernels();
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    cli::run(cli::Cli::parse())
}
