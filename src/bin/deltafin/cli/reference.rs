//! The command-line reference as Markdown, generated from clap's own definitions (the hidden
//! `cli-reference` command of both binaries), so `docs/cli.md` cannot drift from the parser:
//! `tests/cli_reference.rs` regenerates it and fails on any difference. Shared by `deltafin-k3`
//! through a `#[path]` include; it knows no command of either binary.

use std::fmt::Write;

/// The reference of `cmd` and every visible subcommand below it, depth first: one section per
/// command holding its `--help` text.
pub fn markdown(mut cmd: clap::Command) -> String {
    cmd.build();
    let name = cmd.get_name().to_string();
    let mut out = format!(
        "# `{name}` command reference\n\n\
         Generated from the command line's definitions by `{name} cli-reference > \
         docs/{}`; a test fails when this page and the binary differ. Each section is the \
         command's `--help`.\n",
        file_name(&name)
    );
    section(&cmd, &name, &mut out);
    out
}

/// The page `markdown` writes for binary `name` under `docs/`.
pub fn file_name(name: &str) -> String {
    match name.strip_prefix("deltafin-") {
        Some(rest) => format!("cli-{rest}.md"),
        None => "cli.md".to_string(),
    }
}

fn section(cmd: &clap::Command, path: &str, out: &mut String) {
    let help = cmd.clone().render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    let _ = write!(
        out,
        "\n## `{path}`\n\n```text\n{}\n```\n",
        help.join("\n").trim_end()
    );
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        section(sub, &format!("{path} {}", sub.get_name()), out);
    }
}
