//! Ties an expert disk cache to the source its bytes came from: `source.json` in the cache
//! directory maps each source unit (for K3, a shard file) to its identity
//! (`checkpoint::source`). When a unit's identity changes (a re-upload, `setup` at another
//! revision), the experts read from it are removed, so they are fetched again instead of being
//! served from the old bytes; a cache that records no source is of unknown origin and is
//! emptied. Also the strict parser of cache file names. Never reads or writes expert bytes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::DiskCache;
use crate::Result;

/// The record's file name inside the cache directory.
pub const SOURCE_FILE: &str = "source.json";

/// What a cache file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheFile {
    /// `L{layer}-E{expert}.bin`: an expert's bytes.
    Bytes(usize, usize),
    /// `L{layer}-E{expert}.sum`: its checksum.
    Sum(usize, usize),
}

/// Parses a cache file name (`L{layer}-E{expert}.bin|.sum`, decimal digits only, no sign, no
/// leading zeros); anything else is `None`.
pub fn parse_cache_name(name: &str) -> Option<CacheFile> {
    let num = |s: &str| -> Option<usize> {
        let ok = !s.is_empty()
            && s.len() <= 12
            && s.bytes().all(|c| c.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        ok.then(|| s.parse().ok()).flatten()
    };
    let (stem, kind) = if let Some(s) = name.strip_suffix(".bin") {
        (s, true)
    } else {
        (name.strip_suffix(".sum")?, false)
    };
    let (l, e) = stem.strip_prefix('L')?.split_once("-E")?;
    let (l, e) = (num(l)?, num(e)?);
    Some(if kind {
        CacheFile::Bytes(l, e)
    } else {
        CacheFile::Sum(l, e)
    })
}

impl DiskCache {
    fn source_path(&self) -> PathBuf {
        self.dir().join(SOURCE_FILE)
    }

    /// The source identities the cache records (`None`: none, or an unreadable record).
    pub fn recorded_source(&self) -> Option<BTreeMap<String, String>> {
        match crate::checkpoint::source::read_ids(&self.source_path()) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("{e}: treating the expert cache as of unknown origin");
                None
            }
        }
    }

    /// The units of `ids` whose recorded identity differs (every unit when nothing is
    /// recorded).
    pub fn changed_units(&self, ids: &BTreeMap<String, String>) -> Vec<String> {
        let rec = self.recorded_source();
        ids.iter()
            .filter(|(u, id)| rec.as_ref().and_then(|r| r.get(*u)) != Some(*id))
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// The `(layer, expert)` of every expert file in the cache.
    pub fn cached_experts(&self) -> Vec<(usize, usize)> {
        let Ok(rd) = std::fs::read_dir(self.dir()) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(
                |e| match parse_cache_name(&e.file_name().to_string_lossy()) {
                    Some(CacheFile::Bytes(l, x)) => Some((l, x)),
                    _ => None,
                },
            )
            .collect()
    }

    /// Adopts the source `ids`: the cached experts of changed units (`experts_of(unit)`; all of
    /// them when the cache records no source) are removed, then `ids` is recorded. Returns how
    /// many experts were removed.
    pub fn adopt_source(
        &self,
        ids: &BTreeMap<String, String>,
        experts_of: impl Fn(&str) -> Vec<(usize, usize)>,
    ) -> Result<usize> {
        let rec = self.recorded_source();
        if rec.as_ref() == Some(ids) {
            return Ok(0);
        }
        let stale: Vec<(usize, usize)> = match &rec {
            Some(_) => self
                .changed_units(ids)
                .iter()
                .flat_map(|u| experts_of(u))
                .collect(),
            None => self.cached_experts(),
        };
        let mut removed = 0;
        for (l, e) in stale {
            // The checksum goes last, so a `.bin` never outlives it.
            if std::fs::remove_file(self.path(l, e)).is_ok() {
                removed += 1;
            }
            let _ = std::fs::remove_file(self.sum_path(l, e));
        }
        if removed > 0 {
            tracing::warn!(
                "removed {removed} cached expert(s) in {} read from another source; they are fetched again when used",
                self.dir().display()
            );
        }
        let json = serde_json::to_vec_pretty(ids).map_err(|e| crate::Error::Msg(e.to_string()))?;
        crate::fsio::atomic::write_atomic(&self.source_path(), &json)?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_names_parse_strictly() {
        assert_eq!(
            parse_cache_name("L3-E17.bin"),
            Some(CacheFile::Bytes(3, 17))
        );
        assert_eq!(parse_cache_name("L0-E0.sum"), Some(CacheFile::Sum(0, 0)));
        for bad in [
            "L3-E17.bin.tmp",
            ".L3-E17.bin.1.2.tmp",
            "L-E1.bin",
            "L1-E.bin",
            "L+1-E1.bin",
            "L01-E1.bin",
            "L1-E1",
            "L99999999999999999999-E1.bin",
            "L1-E1-E2.bin",
            "source.json",
            "",
        ] {
            assert_eq!(parse_cache_name(bad), None, "{bad}");
        }
    }

    /// 20,000 random and mutated names: no panic, and whatever parses prints back to itself.
    #[test]
    fn fuzzed_cache_names_never_panic_and_round_trip() {
        let mut rng = crate::checkpoint::rng::Rng::new(7);
        let alphabet = b"LE-.0123456789binsumtmp+ \xff";
        for i in 0..20_000 {
            let name: String = if i % 2 == 0 {
                let n = (rng.next_u64() % 24) as usize;
                (0..n)
                    .map(|_| alphabet[(rng.next_u64() % alphabet.len() as u64) as usize] as char)
                    .collect()
            } else {
                let mut s = format!("L{}-E{}.bin", rng.next_u64() % 100, rng.next_u64() % 1000)
                    .into_bytes();
                let at = (rng.next_u64() % s.len() as u64) as usize;
                s[at] = alphabet[(rng.next_u64() % alphabet.len() as u64) as usize];
                String::from_utf8_lossy(&s).into_owned()
            };
            match parse_cache_name(&name) {
                Some(CacheFile::Bytes(l, e)) => assert_eq!(name, format!("L{l}-E{e}.bin")),
                Some(CacheFile::Sum(l, e)) => assert_eq!(name, format!("L{l}-E{e}.sum")),
                None => {}
            }
        }
    }

    #[test]
    fn a_changed_unit_removes_only_its_experts() {
        let d = tempfile::tempdir().unwrap();
        let c = DiskCache::new(d.path(), super::super::CacheAdvice::Off).unwrap();
        for (l, e) in [(1, 0), (1, 1), (2, 0)] {
            c.publish(l, e, &[l as u8, e as u8]).unwrap();
        }
        let of = |u: &str| match u {
            "a" => vec![(1, 0), (1, 1)],
            _ => vec![(2, 0)],
        };
        let ids = |a: &str, b: &str| -> BTreeMap<String, String> {
            [("a".into(), a.into()), ("b".into(), b.into())].into()
        };
        // No record: unknown origin, everything goes.
        assert_eq!(c.adopt_source(&ids("1", "1"), of).unwrap(), 3);
        c.publish(1, 0, &[9]).unwrap();
        c.publish(2, 0, &[9]).unwrap();
        assert_eq!(c.adopt_source(&ids("1", "1"), of).unwrap(), 0);
        assert_eq!(c.changed_units(&ids("1", "2")), vec!["b".to_string()]);
        assert_eq!(c.adopt_source(&ids("1", "2"), of).unwrap(), 1);
        assert_eq!(c.cached_experts(), vec![(1, 0)]);
        assert!(!c.sum_path(2, 0).exists());
        assert_eq!(c.recorded_source(), Some(ids("1", "2")));
    }
}
