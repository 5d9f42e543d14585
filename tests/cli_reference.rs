//! The CLI reference pages (`docs/cli.md`, `docs/cli-k3.md`) are what the binaries' parsers
//! say: each binary prints its reference (`cli-reference`, generated from clap) and it must
//! equal the committed page byte for byte. A flag added, renamed or re-documented without
//! regenerating the page fails here, with the command that regenerates it.

#[path = "common/runner.rs"]
mod runner;

use std::path::Path;

fn check(binary: &str, page: &str) {
    let out = runner::command(binary)
        .arg("cli-reference")
        .output()
        .expect("run the binary");
    assert!(
        out.status.success(),
        "{binary} cli-reference failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).expect("UTF-8 help");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(page);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if generated != committed {
        let first = generated
            .lines()
            .zip(committed.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(generated.lines().count().min(committed.lines().count()));
        panic!(
            "docs/{page} differs from the binary's parser (first at line {}): regenerate it with \
             `cargo run --release --bin {} -- cli-reference > docs/{page}`",
            first + 1,
            Path::new(binary).file_name().unwrap().to_string_lossy()
        );
    }
}

#[test]
fn the_deltafin_reference_matches_the_parser() {
    check(env!("CARGO_BIN_EXE_deltafin"), "cli.md");
}

#[test]
fn the_deltafin_k3_reference_matches_the_parser() {
    check(env!("CARGO_BIN_EXE_deltafin-k3"), "cli-k3.md");
}
