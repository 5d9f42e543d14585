//! The latent MoE block (spec §3.6) with its exact router, and the dense SiTU MLP (§3.7).

use std::collections::BTreeMap;

use candle::Tensor;

use super::ops::{rms_norm, situ};
use super::options::ModelOptions;
use super::weights::LayerWeights;
use crate::compute::dense;
use crate::experts::ExpertProvider;
use crate::mxfp4::Kernel;
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

/// The routing decision for one position.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Selected experts, highest `sigmoid + bias` first (ties: lower id first).
    pub experts: Vec<usize>,
    /// Their weights: raw sigmoid scores renormalised to sum 1.
    pub weights: Vec<f32>,
}

/// The exact router: sigmoid scores, `+ e_score_correction_bias` for selection only, top-k,
/// weights from the raw scores renormalised with `+1e-20`.
pub fn route(logits: &[f32], bias: &[f32], k: usize, renormalize: bool) -> Route {
    let s: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
    let choice: Vec<f32> = s.iter().zip(bias).map(|(a, b)| a + b).collect();
    let mut idx: Vec<usize> = (0..s.len()).collect();
    idx.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    idx.truncate(k);
    let mut w: Vec<f32> = idx.iter().map(|&i| s[i]).collect();
    if renormalize {
        let sum = w.iter().fold(0f32, |a, b| a + b) + 1e-20;
        w.iter_mut().for_each(|x| *x /= sum);
    }
    Route {
        experts: idx,
        weights: w,
    }
}

/// One latent MoE block.
#[derive(Debug)]
pub struct Moe {
    layer: usize,
    bias: Vec<f32>,
    norm: Option<Tensor>,
    shared: Mlp,
    top_k: usize,
    renormalize: bool,
    inter: usize,
    latent: usize,
    beta: f32,
    linear_beta: f32,
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
            top_k: c.num_experts_per_token,
            renormalize: c.moe_renormalize,
            inter: c.moe_intermediate_size,
            latent: r,
            beta: c.activation_situ_beta as f32,
            linear_beta: c.activation_situ_linear_beta as f32,
            eps: c.rms_norm_eps,
        })
    }

    /// Routes every row of `x` `[T, H]`.
    pub fn routes(&self, x: &Tensor, ld: &LayerData) -> Result<Vec<Route>> {
        let gate = ld.matrix_at(&self.gate)?; // [experts, H]
        let logits = dense(x, &gate)?.to_vec2::<f32>()?;
        Ok(logits
            .iter()
            .map(|l| route(l, &self.bias, self.top_k, self.renormalize))
            .collect())
    }

    /// Runs one group of fetched experts over their rows, into `ys` `[T, k, latent]` at each
    /// row's slot.
    #[allow(clippy::too_many_arguments)]
    fn run_group(
        &self,
        ids: &[usize],
        bytes: &[crate::experts::ExpertBytes],
        rows: &BTreeMap<usize, Vec<(usize, usize)>>,
        z: &[f32],
        device: &candle::Device,
        kernel: Kernel,
        ys: &mut [f32],
    ) -> Result<()> {
        let (r, k) = (self.latent, self.top_k);
        let pairs: Vec<(usize, usize)> = ids
            .iter()
            .enumerate()
            .flat_map(|(g, e)| rows[e].iter().map(move |&(ti, _)| (g, ti)))
            .collect();
        let slots = ids
            .iter()
            .flat_map(|e| rows[e].iter().map(|&(ti, s)| ti * k + s));
        let y = crate::compute::run_experts(
            device,
            kernel,
            bytes,
            &pairs,
            z,
            (self.inter, r),
            (self.beta, self.linear_beta),
        )?;
        for (yp, at) in y.chunks_exact(r.max(1)).zip(slots) {
            ys[at * r..(at + 1) * r].copy_from_slice(yp);
        }
        Ok(())
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
        if let Some(last) = routes.last() {
            experts.note_routes(self.layer, &last.experts);
        }
        let rows = rows_by_expert(&routes);
        let ys = self.run_selected(&rows, routes.len(), &z, &device, experts, options)?;
        drop(z);
        let y = combine(&routes, &ys, self.top_k, self.latent); // [T * latent]
        drop(ys);
        let up = ld.matrix_at(&self.up)?; // [H, latent]
        let (mut out, mut at) = (Vec::with_capacity(parts.len()), 0);
        for (n, shared) in parts {
            let yc = Tensor::from_slice(
                &y[at * self.latent..(at + n) * self.latent],
                (n, self.latent),
                &device,
            )?;
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

    /// Every selected expert on its rows of `z`: `[T, k, latent]`, each at its row's slot. A
    /// pass can select every expert of a layer, so at most `options.expert_batch` are held at
    /// once (the memory plan charges that many); the store reads each once, in id order (its
    /// offset order within a shard).
    fn run_selected(
        &self,
        rows: &BTreeMap<usize, Vec<(usize, usize)>>,
        t: usize,
        z: &[f32],
        device: &candle::Device,
        experts: &dyn ExpertProvider,
        options: &ModelOptions,
    ) -> Result<Vec<f32>> {
        let all: Vec<usize> = rows.keys().copied().collect();
        let mut ys = vec![0f32; t * self.top_k * self.latent];
        for ids in all.chunks(options.expert_batch.max(1)) {
            // Each batch runs as soon as its bytes are in, while later reads are in flight.
            experts.fetch_each(self.layer, ids, &mut |got| {
                let (gi, gb): (Vec<usize>, Vec<_>) =
                    got.iter().map(|(i, b)| (ids[*i], b.clone())).unzip();
                self.run_group(&gi, &gb, rows, z, device, options.kernel, &mut ys)
            })?;
        }
        Ok(ys)
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

/// `(row, slot)` pairs each selected expert runs on, in expert-id order (`slot`: the expert's
/// place in the row's top-k).
fn rows_by_expert(routes: &[Route]) -> BTreeMap<usize, Vec<(usize, usize)>> {
    let mut rows: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
    for (ti, rt) in routes.iter().enumerate() {
        for (s, &e) in rt.experts.iter().enumerate() {
            rows.entry(e).or_default().push((ti, s));
        }
    }
    rows
}

/// The weighted sum of each row's experts `ys` `[T, k, latent]`, accumulated in the row's own
/// top-k order, so the result depends neither on arrival order nor on the other rows:
/// `[T * latent]`.
fn combine(routes: &[Route], ys: &[f32], k: usize, latent: usize) -> Vec<f32> {
    let mut acc = vec![0f32; routes.len() * latent];
    for (ti, (rt, a)) in routes.iter().zip(acc.chunks_mut(latent.max(1))).enumerate() {
        for (s, w) in rt.weights.iter().enumerate().take(k) {
            let y = &ys[(ti * k + s) * latent..(ti * k + s + 1) * latent];
            for (ai, yi) in a.iter_mut().zip(y) {
                *ai += w * yi;
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_uses_bias_for_selection_only() {
        let logits = [0.0f32, 1.0, -1.0, 2.0];
        let bias = [0.0f32, 0.0, 10.0, 0.0];
        let r = route(&logits, &bias, 2, true);
        assert_eq!(r.experts, vec![2, 3]);
        let s = |l: f32| 1.0 / (1.0 + (-l).exp());
        let sum = s(-1.0) + s(2.0) + 1e-20;
        assert_eq!(r.weights, vec![s(-1.0) / sum, s(2.0) / sum]);
    }

    #[test]
    fn router_ties_pick_lower_index() {
        let r = route(&[0.5, 0.5, 0.5], &[0.0; 3], 2, false);
        assert_eq!(r.experts, vec![0, 1]);
    }
}
