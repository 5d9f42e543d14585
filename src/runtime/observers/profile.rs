//! Per-layer phase timings of each forward pass (`deltafin run --layer-profile`, `bench
//! forward`): where a token's time goes, layer by layer. An `Observer`: off unless attached to the
//! model (`Model::observe`). It synchronises the device at each phase end, so GPU time is
//! timed as work, not submission, and reads the expert store's wait counter around the FFN.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::experts::ExpertProvider;
use crate::runtime::observe::{Event, Observer};

/// One layer of one forward pass.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LayerTiming {
    /// Layer index.
    pub layer: usize,
    /// The attention's kind, as the model labels it (K3: `kda` or `mla`).
    pub attn: &'static str,
    /// The feed-forward's kind (`dense` or `moe`).
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
pub struct LayerProfile {
    experts: Arc<dyn ExpertProvider>,
    state: Mutex<Clock>,
}

/// The layer being timed.
struct Clock {
    t: Instant,
    cur: LayerTiming,
    /// The expert store's read wait when the FFN started (seconds).
    wait_at_ffn: f64,
    done: Vec<LayerTiming>,
}

impl LayerProfile {
    /// An empty profile reading expert waits from `experts` (`Model::experts`).
    pub fn new(experts: Arc<dyn ExpertProvider>) -> Self {
        LayerProfile {
            experts,
            state: Mutex::new(Clock {
                t: Instant::now(),
                cur: LayerTiming::default(),
                wait_at_ffn: 0.0,
                done: Vec::new(),
            }),
        }
    }

    /// The timings recorded since the last call.
    pub fn take(&self) -> Vec<LayerTiming> {
        self.state
            .lock()
            .map(|mut c| std::mem::take(&mut c.done))
            .unwrap_or_default()
    }

    fn read_wait_s(&self) -> f64 {
        self.experts.stats().map(|s| s.read_wait_s).unwrap_or(0.0)
    }
}

/// Waits for the work queued on `t`'s device (a no-op on the CPU).
fn sync(t: &candle::Tensor) {
    if let Err(e) = t.device().synchronize() {
        tracing::warn!("layer profile: device sync failed: {e}");
    }
}

impl Observer for LayerProfile {
    fn on(&self, layer: usize, event: &Event<'_>) {
        let Ok(mut c) = self.state.lock() else {
            return;
        };
        match *event {
            Event::PassStart { tokens, .. } => {
                c.t = Instant::now();
                c.cur = LayerTiming {
                    tokens,
                    ..Default::default()
                };
            }
            Event::LayerReady { attn, ffn } => {
                let tokens = c.cur.tokens;
                c.cur = LayerTiming {
                    layer,
                    attn,
                    ffn,
                    tokens,
                    spine_wait_ms: lap(&mut c.t),
                    ..Default::default()
                };
            }
            Event::AttentionIn => c.cur.other_ms += lap(&mut c.t),
            Event::Attention(o) => {
                sync(o);
                c.cur.attn_ms = lap(&mut c.t);
            }
            Event::FfnIn => {
                c.cur.other_ms += lap(&mut c.t);
                c.wait_at_ffn = self.read_wait_s();
            }
            Event::Ffn(om) => {
                sync(om);
                c.cur.ffn_ms = lap(&mut c.t);
                c.cur.expert_wait_ms = (self.read_wait_s() - c.wait_at_ffn) * 1e3;
            }
            Event::LayerDone(h) => {
                if let crate::runtime::observe::Rows::Tensor(h) = h {
                    sync(h);
                }
                c.cur.other_ms += lap(&mut c.t);
                let t = c.cur.clone();
                c.done.push(t);
            }
            Event::Routes(_) | Event::PassEnd | Event::Kept { .. } | Event::Prefill(_) => {}
        }
    }
}

/// Milliseconds since `t`, restarting it.
pub fn lap(t: &mut Instant) -> f64 {
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
