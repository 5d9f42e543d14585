//! The RAM tier: a byte-bounded map of expert bytes with selection-frequency aware eviction.
//! Every selection (hit or miss) adds 1 to an expert's score, and scores decay by a factor per
//! token; the victim is the resident expert with the lowest decayed score (least recently used
//! first on ties), and a new expert is admitted only if it scores at least as high as the victims.

use std::collections::HashMap;

use super::ExpertBytes;

/// `(layer, expert)`.
pub type ExpertKey = (usize, usize);

#[derive(Debug, Clone, Copy)]
struct Score {
    value: f64,
    tick: u64,
}

#[derive(Debug)]
struct Entry {
    bytes: ExpertBytes,
    last_use: u64,
}

/// The RAM tier.
#[derive(Debug)]
pub struct RamTier {
    budget: usize,
    used: usize,
    decay: f64,
    tick: u64,
    entries: HashMap<ExpertKey, Entry>,
    scores: HashMap<ExpertKey, Score>,
}

impl RamTier {
    /// A tier holding at most `budget` bytes; scores are multiplied by `decay` (0..=1) per token.
    pub fn new(budget: usize, decay: f64) -> Self {
        RamTier {
            budget,
            used: 0,
            decay: decay.clamp(0.0, 1.0),
            tick: 0,
            entries: HashMap::new(),
            scores: HashMap::new(),
        }
    }

    /// Advances the token clock (scores decay once per token).
    pub fn next_token(&mut self) {
        self.tick += 1;
    }

    fn score(&self, k: &ExpertKey) -> f64 {
        self.scores
            .get(k)
            .map(|s| s.value * self.decay.powf((self.tick - s.tick) as f64))
            .unwrap_or(0.0)
    }

    /// Counts one selection of `k` (hit or miss).
    pub fn record(&mut self, k: ExpertKey) {
        let v = self.score(&k) + 1.0;
        self.scores.insert(
            k,
            Score {
                value: v,
                tick: self.tick,
            },
        );
    }

    /// The bytes of `k` if resident (marks it used).
    pub fn get(&mut self, k: &ExpertKey) -> Option<ExpertBytes> {
        let tick = self.tick;
        self.entries.get_mut(k).map(|e| {
            e.last_use = tick;
            e.bytes.clone()
        })
    }

    /// Whether `k` is resident.
    pub fn contains(&self, k: &ExpertKey) -> bool {
        self.entries.contains_key(k)
    }

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Number of resident experts.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is resident.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Offers `bytes` for `k`; returns whether it was admitted.
    pub fn insert(&mut self, k: ExpertKey, bytes: ExpertBytes) -> bool {
        let n = bytes.len();
        if n > self.budget || self.entries.contains_key(&k) {
            return self.entries.contains_key(&k);
        }
        let mine = self.score(&k);
        // Choose victims until it fits; refuse if any victim outscores the newcomer.
        let mut victims = Vec::new();
        let mut freed = 0usize;
        if self.used + n > self.budget {
            let mut order: Vec<(f64, u64, ExpertKey, usize)> = self
                .entries
                .iter()
                .map(|(key, e)| (self.score(key), e.last_use, *key, e.bytes.len()))
                .collect();
            order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            for (s, _, key, len) in order {
                if self.used - freed + n <= self.budget {
                    break;
                }
                if s > mine {
                    return false;
                }
                victims.push(key);
                freed += len;
            }
        }
        for v in victims {
            if let Some(e) = self.entries.remove(&v) {
                self.used -= e.bytes.len();
            }
        }
        self.used += n;
        self.entries.insert(
            k,
            Entry {
                bytes,
                last_use: self.tick,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(n: usize) -> ExpertBytes {
        std::sync::Arc::new(crate::fsio::PooledBuf::owned(vec![0u8; n]))
    }

    #[test]
    fn respects_budget_and_evicts_least_frequent() {
        let mut t = RamTier::new(300, 0.9);
        for (e, times) in [(0usize, 3), (1, 1), (2, 2)] {
            for _ in 0..times {
                t.record((1, e));
            }
            assert!(t.insert((1, e), b(100)));
        }
        assert_eq!(t.used(), 300);
        // Expert 3 selected twice: evicts expert 1 (score 1), not 2 (score 2) or 0 (score 3).
        t.record((1, 3));
        t.record((1, 3));
        assert!(t.insert((1, 3), b(100)));
        assert!(!t.contains(&(1, 1)));
        assert!(t.contains(&(1, 0)) && t.contains(&(1, 2)) && t.contains(&(1, 3)));
        assert!(t.used() <= 300);
    }

    #[test]
    fn refuses_a_colder_newcomer() {
        let mut t = RamTier::new(200, 1.0);
        for e in 0..2 {
            t.record((0, e));
            t.record((0, e));
            t.insert((0, e), b(100));
        }
        t.record((0, 9));
        assert!(!t.insert((0, 9), b(100)));
        assert!(t.get(&(0, 9)).is_none());
        assert!(!t.insert((0, 8), b(500)), "larger than the whole budget");
    }

    #[test]
    fn lru_breaks_ties_and_scores_decay() {
        let mut t = RamTier::new(200, 0.5);
        t.record((0, 0));
        t.insert((0, 0), b(100));
        t.record((0, 1));
        t.insert((0, 1), b(100));
        t.next_token();
        t.get(&(0, 0)); // 0 used more recently than 1
        t.record((0, 2));
        // Decayed: experts 0 and 1 score 0.5, the newcomer 1.0; the tie between 0 and 1 goes to LRU.
        assert!(t.insert((0, 2), b(100)));
        assert!(t.contains(&(0, 0)));
        assert!(!t.contains(&(0, 1)));
    }
}
