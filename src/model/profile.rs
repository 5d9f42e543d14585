//! Per-layer phase timings of each forward pass (`deltafin run --layer-profile`): where a token's
//! time goes, layer by layer. Off unless a `LayerProfile` is attached to the model.

use std::sync::Mutex;
use std::time::Instant;

/// One layer of one forward pass.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerTiming {
    /// Layer index.
    pub layer: usize,
    /// `kda` or `mla`.
    pub attn: &'static str,
    /// `dense` or `moe`.
    pub ffn: &'static str,
    /// Positions in the pass.
    pub tokens: usize,
    /// Waiting for the layer's spine data (0 for a pinned layer; the read-ahead's shortfall
    /// for a streamed one).
    pub spine_wait_ms: f64,
    /// Attention (projections and the KDA/MLA core).
    pub attn_ms: f64,
    /// The MLP or MoE block, expert reads included.
    pub ffn_ms: f64,
    /// Of `ffn_ms`: waiting for expert bytes (from the expert store's counters).
    pub expert_wait_ms: f64,
    /// Norms and AttnRes mixing.
    pub other_ms: f64,
}

/// Collects `LayerTiming`s until taken.
#[derive(Debug, Default)]
pub struct LayerProfile(Mutex<Vec<LayerTiming>>);

impl LayerProfile {
    /// An empty profile.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn push(&self, t: LayerTiming) {
        if let Ok(mut v) = self.0.lock() {
            v.push(t);
        }
    }

    /// The timings recorded since the last call.
    pub fn take(&self) -> Vec<LayerTiming> {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// Milliseconds since `t`, restarting it.
pub(crate) fn lap(t: &mut Instant) -> f64 {
    let now = Instant::now();
    let ms = now.duration_since(*t).as_secs_f64() * 1e3;
    *t = now;
    ms
}

impl std::fmt::Display for LayerTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[layer {:>3} {} {:<5}] T={} spine-wait {:.2} ms, attn {:.2} ms, {} {:.2} ms (expert wait {:.2} ms), other {:.2} ms",
            self.layer,
            self.attn,
            self.ffn,
            self.tokens,
            self.spine_wait_ms,
            self.attn_ms,
            self.ffn,
            self.ffn_ms,
            self.expert_wait_ms,
            self.other_ms
        )
    }
}
