//! One hook for everything that watches a forward pass: the layer profile, the router trace and
//! a caller's route collector are `Observer`s that the model calls at fixed points of each layer
//! (`Event`). The math carries none of it: no clocks, no device syncs, no trace buffers; an
//! observer that times the GPU synchronises the tensors it is shown. With no observer attached a
//! pass makes one empty call per event.

use std::sync::{Arc, Mutex};

use candle::Tensor;

use crate::moe::Route;

/// A point in a forward pass (each layer: `LayerReady`, `AttentionIn`, `Attention`, `FfnIn`,
/// `Routes` on MoE layers, `Ffn`, `LayerDone`).
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A pass over `tokens` positions starting at position `first_pos` begins.
    PassStart {
        /// Position of the first token.
        first_pos: usize,
        /// Positions in the pass.
        tokens: usize,
    },
    /// The layer's dense weights are in hand.
    LayerReady {
        /// The attention's kind, as the model labels it (K3: `kda`/`mla`).
        attn: &'static str,
        /// The feed-forward's kind (`dense`/`moe`).
        ffn: &'static str,
    },
    /// AttnRes mixing and the input norm are done; attention starts.
    AttentionIn,
    /// Attention's output `[T, H]` (possibly still queued on a GPU).
    Attention(&'a Tensor),
    /// AttnRes mixing and the post-attention norm are done; the MLP or MoE starts.
    FfnIn,
    /// The routes of every position of a MoE layer.
    Routes(&'a [Route]),
    /// The MLP or MoE output `[T, H]`.
    Ffn(&'a Tensor),
    /// The layer's new hidden state `[T, H]` (the residual stream after the layer), as the
    /// model holds it. A drafter that reads the target's hidden states taps these.
    LayerDone(Rows<'a>),
    /// The pass is over (the tail runs next).
    PassEnd,
    /// A prefill (a `run` over more than one position) finished a layer.
    Prefill(PrefillStep),
    /// A verify pass (speculative decoding) kept its first `rows` positions; the others were
    /// rejected drafts and are no longer in the sequence.
    Kept {
        /// Positions kept.
        rows: usize,
    },
}

/// A layer's hidden rows `[T, H]`, where the model keeps them: a tensor (possibly on a GPU)
/// or host rows. In a batched pass the rows of every sequence follow each other.
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    /// A `[T, H]` tensor.
    Tensor(&'a Tensor),
    /// `T * width` values, row-major.
    Host {
        /// The rows.
        data: &'a [f32],
        /// Values per row (the hidden size).
        width: usize,
    },
}

impl Rows<'_> {
    /// Values per row.
    pub fn width(&self) -> usize {
        match self {
            Rows::Tensor(t) => t.dims().last().copied().unwrap_or(0),
            Rows::Host { width, .. } => *width,
        }
    }

    /// The rows as host `f32`s, row-major (copies; syncs a GPU tensor).
    pub fn to_f32(&self) -> crate::Result<Vec<f32>> {
        match self {
            Rows::Tensor(t) => Ok(t
                .to_dtype(candle::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?),
            Rows::Host { data, .. } => Ok(data.to_vec()),
        }
    }
}

/// Where a prefill stands after one layer of one of its layer-major passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillStep {
    /// The layer just finished.
    pub layer: usize,
    /// Layers per pass.
    pub layers: usize,
    /// This pass (0-based) and the call's passes.
    pub pass: usize,
    /// Passes of the call.
    pub passes: usize,
    /// Positions before this pass (of this call).
    pub pass_first: usize,
    /// Positions in this pass.
    pub pass_tokens: usize,
    /// Positions of the whole call.
    pub positions: usize,
    /// Bytes the model had read from storage (streamed spine layers, experts) when the call
    /// began, and now.
    pub read_before: u64,
    /// See `read_before`.
    pub read_now: u64,
}

impl PrefillStep {
    /// Tells `obs` that layer `layer` of this step's pass is done, `read_now` bytes read.
    pub fn report(self, obs: &dyn Observer, layer: usize, read_now: u64) {
        let step = PrefillStep {
            layer,
            read_now,
            ..self
        };
        obs.on(layer, &Event::Prefill(step));
    }

    /// Share of the call's layer steps done, in (0, 1].
    pub fn fraction(&self) -> f64 {
        let total = (self.passes * self.layers).max(1);
        (self.pass * self.layers + self.layer + 1) as f64 / total as f64
    }
}

/// Something that watches forward passes. `layer` is the layer an event belongs to (0 for
/// `PassStart` and `PassEnd`).
pub trait Observer: Send + Sync {
    /// Called at each event of each pass.
    fn on(&self, layer: usize, event: &Event<'_>);
}

/// The observers attached to a model, called in order.
#[derive(Default, Clone)]
pub struct Observers(Vec<Arc<dyn Observer>>);

impl Observers {
    /// Adds one.
    pub fn push(&mut self, o: Arc<dyn Observer>) {
        self.0.push(o);
    }

    /// Removes every observer.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Whether none is attached.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Observer for Observers {
    fn on(&self, layer: usize, event: &Event<'_>) {
        for o in &self.0 {
            o.on(layer, event);
        }
    }
}

/// Two observers as one (a model's own and a call's).
pub(crate) struct Both<'a>(pub &'a dyn Observer, pub &'a dyn Observer);

impl Observer for Both<'_> {
    fn on(&self, layer: usize, event: &Event<'_>) {
        self.0.on(layer, event);
        self.1.on(layer, event);
    }
}

/// Routes chosen during a forward call: `(layer, position-in-call routes)`.
pub type RouteTrace = Vec<(usize, Vec<Route>)>;

/// Collects every MoE layer's routes.
#[derive(Default)]
pub struct RouteCollector(Mutex<RouteTrace>);

impl RouteCollector {
    /// The routes collected so far, emptying the collector.
    pub fn take(&self) -> RouteTrace {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

impl Observer for RouteCollector {
    fn on(&self, layer: usize, event: &Event<'_>) {
        if let (Event::Routes(r), Ok(mut v)) = (event, self.0.lock()) {
            v.push((layer, r.to_vec()));
        }
    }
}
