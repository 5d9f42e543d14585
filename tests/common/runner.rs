//! Spawning the crate's binaries the way cargo runs the test itself: through the target's
//! configured runner (`CARGO_TARGET_<TRIPLE>_RUNNER`, e.g. `qemu-aarch64 -L /usr/aarch64-linux-gnu`
//! when `scripts/check_aarch64.sh` runs the tests under emulation), so a cross-built binary does
//! not fail with "exec format error".

use std::ffi::OsStr;
use std::process::Command;

/// The environment variable cargo reads this target's runner from.
fn runner_var() -> String {
    let arch = std::env::consts::ARCH.to_uppercase();
    match std::env::consts::OS {
        "macos" => format!("CARGO_TARGET_{arch}_APPLE_DARWIN_RUNNER"),
        os => {
            let env = if cfg!(target_env = "musl") {
                "MUSL"
            } else {
                "GNU"
            };
            format!(
                "CARGO_TARGET_{arch}_UNKNOWN_{}_{env}_RUNNER",
                os.to_uppercase()
            )
        }
    }
}

/// A command running `program` (a binary this crate built), through the runner when one is set.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let runner = std::env::var(runner_var()).unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(first) => {
            let mut c = Command::new(first);
            c.args(words).arg(program);
            c
        }
        None => Command::new(program),
    }
}
