//! Each layer's dense tensor names (everything but the routed experts), found in one pass over a
//! checkpoint's names. Knows only K3's naming (`{prefix}model.layers.{N}.…`, `.experts.`).

use std::collections::HashMap;

/// Layer → its names that are not routed experts, sorted.
pub(super) fn by_layer<'a>(
    names: impl Iterator<Item = &'a String>,
    prefix: &str,
) -> HashMap<usize, Vec<String>> {
    let head = format!("{prefix}model.layers.");
    let mut m: HashMap<usize, Vec<String>> = HashMap::new();
    for n in names.filter(|n| !n.contains(".experts.")) {
        let Some((digits, _)) = n.strip_prefix(&head).and_then(|r| r.split_once('.')) else {
            continue;
        };
        // `Inventory::layer_name` writes no leading zeros: "01" is not layer 1.
        match digits.parse::<usize>() {
            Ok(l) if l.to_string() == digits => m.entry(l).or_default().push(n.clone()),
            _ => {}
        }
    }
    m.values_mut().for_each(|v| v.sort());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_prefix_scan_per_layer() {
        let names: Vec<String> = [
            "p.model.layers.1.z",
            "p.model.layers.1.a.weight",
            "p.model.layers.10.b",
            "p.model.layers.1.mlp.experts.3.w",
            "p.model.layers.01.c",
            "model.layers.1.x",
            "p.model.layers.2",
            "p.model.norm.weight",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let m = by_layer(names.iter(), "p.");
        for l in 0..12 {
            let p = format!("p.model.layers.{l}.");
            let mut want: Vec<String> = names
                .iter()
                .filter(|n| n.starts_with(&p) && !n.contains(".experts."))
                .cloned()
                .collect();
            want.sort();
            assert_eq!(m.get(&l).cloned().unwrap_or_default(), want, "layer {l}");
        }
        assert_eq!(m[&1], ["p.model.layers.1.a.weight", "p.model.layers.1.z"]);
    }
}
