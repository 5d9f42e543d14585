//! `--layers` lists (`1-40,45`) of `fetch-experts` and `warm-cache`: parsed against the model's
//! layer count, so no input can ask for more entries than the model has layers per part.

use crate::{Error, Result};

/// Parses `1-40,45` into layer indices, each below `layers` (the model's layer count), so no
/// input can ask for more than `layers` entries per comma-separated part.
pub fn parse_layers(s: &str, layers: usize) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    let check = |l: usize| -> Result<usize> {
        if l >= layers {
            return Err(Error::Msg(format!(
                "layer {l} is past the model's last layer ({})",
                layers.saturating_sub(1)
            )));
        }
        Ok(l)
    };
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if b < a {
                    return Err(Error::Msg(format!("layer range {part} is backwards")));
                }
                out.extend(check(a)?..=check(b)?);
            }
            None => out.push(check(number(part)?)?),
        }
    }
    Ok(out)
}

/// One layer number of a `--layers` list.
fn number(s: &str) -> Result<usize> {
    s.trim()
        .parse()
        .map_err(|e| Error::Msg(format!("--layers: {s:?} is not a layer number ({e})")))
}

#[cfg(test)]
mod tests {
    use super::parse_layers;

    /// 20,000 random and mutated range strings: never a panic, never more entries than the
    /// layers times the parts.
    #[test]
    fn layer_ranges_fuzz() {
        assert_eq!(parse_layers("1-3,5", 93).unwrap(), vec![1, 2, 3, 5]);
        assert!(parse_layers("0-18446744073709551615", 93).is_err());
        assert!(parse_layers("7-2", 93).is_err());
        assert!(parse_layers("93", 93).is_err());
        let mut rng = crate::checkpoint::rng::Rng::new(4);
        let alphabet = b"0123456789-, 9999999999999999999999";
        for _ in 0..20_000 {
            let n = rng.below(24) as usize;
            let s: String = (0..n)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize] as char)
                .collect();
            if let Ok(v) = parse_layers(&s, 93) {
                let parts = s.split(',').count();
                assert!(v.len() <= 93 * parts && v.iter().all(|&l| l < 93), "{s}");
            }
        }
    }
}
