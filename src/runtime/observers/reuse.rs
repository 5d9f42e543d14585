//! Consecutive-token expert reuse per MoE layer: the share of a token's k experts that the
//! previous token also used at the same layer. Prefetching the previous position's experts, the
//! RAM tier and the warm-cache ranking all bet on it (real K3: about 31%). An `Observer` of
//! `Event::Routes`; it keeps only the previous token's experts per layer.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::runtime::observe::{Event, Observer};

#[derive(Default)]
struct Layer {
    last: Vec<usize>,
    overlap: u64,
    slots: u64,
}

/// Counts expert reuse between consecutive positions, per layer.
#[derive(Default)]
pub struct ExpertReuse(Mutex<BTreeMap<usize, Layer>>);

impl ExpertReuse {
    /// `(layer, reused share, consecutive pairs counted)` for each MoE layer seen.
    pub fn per_layer(&self) -> Vec<(usize, f64, u64)> {
        let Ok(m) = self.0.lock() else {
            return Vec::new();
        };
        m.iter()
            .map(|(&l, s)| {
                let k = s.last.len().max(1) as u64;
                (l, s.overlap as f64 / s.slots.max(1) as f64, s.slots / k)
            })
            .collect()
    }

    /// The reused share over every layer.
    pub fn overall(&self) -> f64 {
        let Ok(m) = self.0.lock() else {
            return 0.0;
        };
        let (o, s) = m
            .values()
            .fold((0u64, 0u64), |(o, s), l| (o + l.overlap, s + l.slots));
        o as f64 / s.max(1) as f64
    }
}

impl Observer for ExpertReuse {
    fn on(&self, layer: usize, event: &Event<'_>) {
        let (Event::Routes(routes), Ok(mut m)) = (event, self.0.lock()) else {
            return;
        };
        let l = m.entry(layer).or_default();
        for r in routes.iter() {
            if !l.last.is_empty() {
                l.overlap += r.experts.iter().filter(|e| l.last.contains(e)).count() as u64;
                l.slots += r.experts.len() as u64;
            }
            l.last.clone_from(&r.experts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::Route;

    #[test]
    fn reuse_counts_shared_experts_of_consecutive_positions() {
        let r = ExpertReuse::default();
        let route = |e: &[usize]| Route {
            experts: e.to_vec(),
            weights: vec![0.5; e.len()],
        };
        r.on(1, &Event::Routes(&[route(&[0, 1]), route(&[1, 2])]));
        r.on(1, &Event::Routes(&[route(&[2, 1])]));
        // Pairs: {0,1}->{1,2} shares 1 of 2; {1,2}->{2,1} shares 2 of 2.
        assert_eq!(r.per_layer(), vec![(1, 0.75, 2)]);
        assert_eq!(r.overall(), 0.75);
    }
}
