//! Test and benchmark checkpoints a family writes (`deltafin fixture NAME DIR [--option value]`):
//! each family lists its own (`ModelFamily::fixtures`: a name, what it is, its options and the
//! function that writes it), and the binary finds them by name, so no front end names a family.
//! Options are `--name value`, `--name=value` or a bare `--flag`, parsed here against the
//! fixture's list (an unknown one is an error naming the known ones). Owns the parsing; the
//! checkpoints are the families'.

use std::collections::HashMap;
use std::path::Path;

use crate::{Error, Result};

/// One option of a fixture.
#[derive(Debug, Clone, Copy)]
pub struct FixtureOption {
    /// The option's name without dashes (`seed`).
    pub name: &'static str,
    /// What its value is (`N`, `tiny|30b-a3b`), or `None` for a flag.
    pub value: Option<&'static str>,
    /// What it does, with its default.
    pub help: &'static str,
}

/// A checkpoint a family can write.
#[derive(Debug, Clone, Copy)]
pub struct Fixture {
    /// The name `deltafin fixture` takes (`nano`, `gpt-oss-tiny`).
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// Its options.
    pub options: &'static [FixtureOption],
    /// Writes it into the directory; returns a line for people (what was written).
    pub write: fn(&Path, &FixtureArgs) -> Result<String>,
}

/// A fixture's options as given.
#[derive(Debug, Default)]
pub struct FixtureArgs {
    values: HashMap<&'static str, Option<String>>,
}

impl FixtureArgs {
    /// Parses `args` against `options`.
    pub fn parse(args: &[String], options: &[FixtureOption]) -> Result<Self> {
        let known = || {
            options
                .iter()
                .map(|o| format!("--{}", o.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut values = HashMap::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let body = a.strip_prefix("--").ok_or_else(|| {
                Error::Msg(format!("`{a}` is not an option (known: {})", known()))
            })?;
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let Some(o) = options.iter().find(|o| o.name == name) else {
                return Err(Error::Msg(format!(
                    "unknown option `--{name}` (known: {})",
                    known()
                )));
            };
            let v = match (o.value, inline) {
                (None, None) => None,
                (None, Some(_)) => {
                    return Err(Error::Msg(format!("`--{name}` takes no value")));
                }
                (Some(_), Some(v)) => Some(v),
                (Some(what), None) => Some(
                    it.next()
                        .cloned()
                        .ok_or_else(|| Error::Msg(format!("`--{name}` needs a value ({what})")))?,
                ),
            };
            values.insert(o.name, v);
        }
        Ok(FixtureArgs { values })
    }

    /// Whether flag `name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// The value of `name`, if given.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.values.get(name).and_then(|v| v.as_deref())
    }

    /// `name` as a number, else `default`.
    pub fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.text(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| Error::Msg(format!("--{name} {v}: not a number"))),
        }
    }

    /// `name` as a number, if given.
    pub fn maybe<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>> {
        self.text(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| Error::Msg(format!("--{name} {v}: not a number")))
            })
            .transpose()
    }

    /// `name` as comma-separated numbers (empty when not given).
    pub fn numbers(&self, name: &str) -> Result<Vec<usize>> {
        match self.text(name) {
            None | Some("") => Ok(Vec::new()),
            Some(v) => v
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse()
                        .map_err(|_| Error::Msg(format!("--{name} {v}: not a list of numbers")))
                })
                .collect(),
        }
    }
}

/// Every fixture of `families`, with its family's name.
pub fn all(families: &[&'static dyn super::family::ModelFamily]) -> Vec<(&'static str, Fixture)> {
    families
        .iter()
        .flat_map(|f| f.fixtures().iter().map(move |x| (f.name(), *x)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTS: &[FixtureOption] = &[
        FixtureOption {
            name: "seed",
            value: Some("N"),
            help: "seed (0)",
        },
        FixtureOption {
            name: "tied",
            value: None,
            help: "tie",
        },
    ];

    fn args(a: &[&str]) -> Result<FixtureArgs> {
        let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        FixtureArgs::parse(&a, OPTS)
    }

    #[test]
    fn values_flags_and_errors() {
        let a = args(&["--seed", "7", "--tied"]).unwrap();
        assert_eq!(a.number("seed", 0u64).unwrap(), 7);
        assert!(a.flag("tied"));
        assert_eq!(
            args(&["--seed=3"]).unwrap().number("seed", 0u64).unwrap(),
            3
        );
        assert_eq!(args(&[]).unwrap().number("seed", 9u64).unwrap(), 9);
        for bad in [&["--seed"][..], &["--nope"], &["--tied=1"], &["seed"]] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
        assert!(args(&["--seed", "x"])
            .unwrap()
            .number("seed", 0u64)
            .is_err());
    }
}
