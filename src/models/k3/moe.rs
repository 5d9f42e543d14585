//! K3's latent MoE block (the router, the latent down/up projections and norm, the shared
//! experts) on the model-agnostic executor (`crate::moe`), and the dense SiTU MLP.

use candle::Tensor;

use super::ops::{rms_norm, situ};
use super::options::ModelOptions;
use super::weights::LayerWeights;
use crate::compute::dense;
use crate::experts::ExpertProvider;
use crate::moe::Route;
use crate::moe::{ExecOptions, Gating, RoutedExperts};
use crate::spine::layer::LayerData;
use crate::spine::slot::Slot;
use crate::Result;

/// A dense SiTU MLP: `down · SiTU(gate·x, up·x)` over the layer's matrices `{prefix}.*_proj`.
#[derive(Debug)]
pub struct Mlp {
    gate: Slot,
    up: Slot,
    down: Slot,
    beta: f64,
    linear_beta: f64,
}

impl Mlp {
    /// An MLP over `{prefix}.gate_proj/up_proj/down_proj` with intermediate width `inter`.
    pub fn load(w: &LayerWeights, prefix: &str, inter: usize) -> Result<Self> {
        let c = w.cfg.text();
        let h = c.hidden_size;
        Ok(Mlp {
            gate: w.slot(&format!("{prefix}.gate_proj.weight"), inter, h)?,
            up: w.slot(&format!("{prefix}.up_proj.weight"), inter, h)?,
            down: w.slot(&format!("{prefix}.down_proj.weight"), h, inter)?,
            beta: c.activation_situ_beta,
            linear_beta: c.activation_situ_linear_beta,
        })
    }

    /// `[T, H]` → `[T, H]`.
    pub fn forward(&self, x: &Tensor, ld: &LayerData) -> Result<Tensor> {
        let g = dense(x, &ld.matrix_at(&self.gate)?)?; // [T, inter]
        let u = dense(x, &ld.matrix_at(&self.up)?)?;
        let a = situ(&g, &u, self.beta, self.linear_beta)?;
        dense(&a, &ld.matrix_at(&self.down)?)
    }
}

/// K3's exact router: sigmoid scores, `+ e_score_correction_bias` for selection only, top-k,
/// weights from the raw scores renormalised with `+1e-20` (`Gating::SigmoidBias`).
pub fn route(logits: &[f32], bias: &[f32], k: usize, renormalize: bool) -> Route {
    Gating::SigmoidBias { renormalize }.route(logits, bias, k)
}

/// One latent MoE block.
#[derive(Debug)]
pub struct Moe {
    layer: usize,
    bias: Vec<f32>,
    norm: Option<Tensor>,
    shared: Mlp,
    gating: Gating,
    routed: RoutedExperts,
    eps: f64,
    /// The router, and the routed experts' shared down and up projections.
    gate: Slot,
    down: Slot,
    up: Slot,
}

impl Moe {
    /// Loads the resident MoE tensors (`block_sparse_moe.*`); experts come from the provider.
    pub fn load(w: &LayerWeights) -> Result<Self> {
        let c = w.cfg.text();
        let (h, e, r) = (c.hidden_size, c.num_experts, c.routed_expert_hidden_size);
        let bias = w.values("block_sparse_moe.gate.e_score_correction_bias", &[e])?;
        Ok(Moe {
            layer: w.layer,
            bias,
            norm: if c.latent_moe_use_norm {
                Some(w.get("block_sparse_moe.routed_expert_norm.weight", &[r])?)
            } else {
                None
            },
            shared: Mlp::load(w, "block_sparse_moe.shared_experts", w.cfg.shared_width())?,
            gate: w.slot("block_sparse_moe.gate.weight", e, h)?,
            down: w.slot("block_sparse_moe.routed_expert_down_proj.weight", r, h)?,
            up: w.slot("block_sparse_moe.routed_expert_up_proj.weight", h, r)?,
            gating: Gating::SigmoidBias {
                renormalize: c.moe_renormalize,
            },
            routed: RoutedExperts {
                ffn: super::names::k3_expert_ffn(w.cfg),
                top_k: c.num_experts_per_token,
            },
            eps: c.rms_norm_eps,
        })
    }

    /// Routes every row of `x` `[T, H]`.
    pub fn routes(&self, x: &Tensor, ld: &LayerData) -> Result<Vec<Route>> {
        let gate = ld.matrix_at(&self.gate)?; // [experts, H]
        let logits = dense(x, &gate)?.to_vec2::<f32>()?;
        Ok(logits
            .iter()
            .map(|l| self.gating.route(l, &self.bias, self.routed.top_k))
            .collect())
    }

    /// The part of one chunk's MoE that needs no routed expert: its routes, its latent input
    /// `z` `[rows * latent]` and the shared experts' output `[rows, H]`.
    pub fn prepare(&self, x: &Tensor, ld: &LayerData) -> Result<MoeChunk> {
        let routes = self.routes(x, ld)?;
        let down = ld.matrix_at(&self.down)?; // [latent, H]
        let z = dense(x, &down)?.flatten_all()?.to_vec1::<f32>()?;
        let shared = self.shared.forward(x, ld)?;
        Ok(MoeChunk { routes, z, shared })
    }

    /// The block over a layer-major pass given as chunks `[rows, H]`: every chunk's routes and
    /// shared experts, then each distinct selected expert read once for all rows of the pass,
    /// then each chunk's output. Returns the outputs (one per chunk) and every row's route.
    pub fn forward_chunks(
        &self,
        xs: Vec<Tensor>,
        ld: &LayerData,
        experts: &dyn ExpertProvider,
        options: &ModelOptions,
    ) -> Result<(Vec<Tensor>, Vec<Route>)> {
        let device = match xs.first() {
            Some(x) => x.device().clone(),
            None => return Ok((Vec::new(), Vec::new())),
        };
        let (mut routes, mut z, mut parts) = (Vec::new(), Vec::new(), Vec::new());
        for x in xs {
            let c = self.prepare(&x, ld)?;
            parts.push((c.routes.len(), c.shared));
            routes.extend(c.routes);
            z.extend(c.z);
        }
        let exec = ExecOptions {
            kernel: options.kernel,
            expert_batch: options.expert_batch,
            // K3's experts are MXFP4: no dense expert matrix.
            ..ExecOptions::default()
        };
        let y = self
            .routed
            .run(self.layer, &routes, z, &device, experts, &exec)?; // [T * latent]
        let latent = self.routed.ffn.width;
        let up = ld.matrix_at(&self.up)?; // [H, latent]
        let (mut out, mut at) = (Vec::with_capacity(parts.len()), 0);
        for (n, shared) in parts {
            let yc = Tensor::from_slice(&y[at * latent..(at + n) * latent], (n, latent), &device)?;
            at += n;
            let yc = match &self.norm {
                Some(w) => rms_norm(&yc, w, self.eps)?,
                None => yc,
            };
            out.push((dense(&yc, &up)? + shared)?);
        }
        Ok((out, routes))
    }

    /// `[T, H]` → `[T, H]` and the routes of every row (one chunk: `forward_chunks`).
    pub fn forward(
        &self,
        x: &Tensor,
        ld: &LayerData,
        experts: &dyn ExpertProvider,
        options: &ModelOptions,
    ) -> Result<(Tensor, Vec<Route>)> {
        let (mut y, routes) = self.forward_chunks(vec![x.clone()], ld, experts, options)?;
        let y = y
            .pop()
            .ok_or_else(|| crate::Error::Msg("the MoE block got no rows".into()))?;
        Ok((y, routes))
    }
}

/// One chunk's MoE inputs before the routed experts run (`Moe::prepare`).
pub struct MoeChunk {
    /// Each row's route.
    pub routes: Vec<Route>,
    /// The latent input `[rows * latent]`.
    pub z: Vec<f32>,
    /// The shared experts' output `[rows, H]`.
    pub shared: Tensor,
}
