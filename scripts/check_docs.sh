#!/usr/bin/env bash
# The user guide's checks, run by .ci/run: the book builds (mdBook, installed once into
# ~/.cache/deltafin/tools from crates.io), every internal link of the README, the changelog and
# docs/ resolves to a file and a heading (scripts/check_links.py), and the shell blocks the
# README and the guide mark `<!-- check -->` run offline as a reader would paste them
# (scripts/doc_commands.py, about a minute). The CLI reference is checked by
# tests/cli_reference.rs, the README's Rust example by the doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="$HOME/.cache/deltafin/tools"
if [ ! -x "$tools/bin/mdbook" ]; then
  cargo install mdbook --locked --version 0.4.52 --no-default-features --features search \
    --root "$tools"
fi
rm -rf target/book
"$tools/bin/mdbook" build docs
test -f target/book/index.html
python3 scripts/check_links.py
cargo build --release --bins --examples
python3 scripts/doc_commands.py
