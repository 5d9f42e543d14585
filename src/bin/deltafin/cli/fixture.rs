//! `deltafin fixture NAME DIR [--option value]...`: writes one of the test/benchmark checkpoints
//! the registered families list (`ModelFamily::fixtures`); with no name, lists them with their
//! options. Knows no family: the names, options and writers are the families'.

use std::path::PathBuf;

use deltafin::runtime::fixtures::{self, FixtureArgs};

/// Every fixture, with its options, for `deltafin fixture` without a name.
fn listing() -> String {
    let mut out = String::from("fixtures (deltafin fixture NAME DIR [--option value]...):\n");
    for (family, f) in fixtures::all(deltafin::models::FAMILIES) {
        out.push_str(&format!("\n  {} ({family}): {}\n", f.name, f.about));
        for o in f.options {
            let v = o.value.map_or(String::new(), |v| format!(" {v}"));
            out.push_str(&format!("      --{}{v}  {}\n", o.name, o.help));
        }
    }
    out
}

/// Writes fixture `name` into `dir` with `args`.
pub fn write(name: Option<String>, dir: Option<PathBuf>, args: &[String]) -> anyhow::Result<()> {
    let all = fixtures::all(deltafin::models::FAMILIES);
    let Some(name) = name else {
        print!("{}", listing());
        return Ok(());
    };
    let Some((_, f)) = all.iter().find(|(_, f)| f.name == name) else {
        let known: Vec<_> = all.iter().map(|(_, f)| f.name).collect();
        anyhow::bail!(
            "no fixture `{name}` (known: {}; `deltafin fixture` lists their options)",
            known.join(", ")
        );
    };
    let Some(dir) = dir else {
        anyhow::bail!("deltafin fixture {name} DIR: the output directory is missing");
    };
    let a = FixtureArgs::parse(args, f.options)?;
    eprintln!("{}", (f.write)(&dir, &a)?);
    Ok(())
}
