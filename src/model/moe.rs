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

    /// Runs one group of fetched experts over their rows, into `ys[(expert, row)]`.
    #[allow(clippy::too_many_arguments)]
    fn run_group(
        &self,
        ids: &[usize],
        bytes: &[crate::experts::ExpertBytes],
        rows: &BTreeMap<usize, Vec<usize>>,
        z: &[f32],
        device: &candle::Device,
        kernel: Kernel,
        ys: &mut BTreeMap<(usize, usize), Vec<f32>>,
    ) -> Result<()> {
        let r = self.latent;
        let pairs: Vec<(usize, usize)> = ids
            .iter()
            .enumerate()
            .flat_map(|(k, e)| rows[e].iter().map(move |&ti| (k, ti)))
            .collect();
        let y = crate::compute::run_experts(
            device,
            kernel,
            bytes,
            &pairs,
            z,
            (self.inter, r),
            (self.beta, self.linear_beta),
        )?;
        for (p, &(k, ti)) in pairs.iter().enumerate() {
            ys.insert((ids[k], ti), y[p * r..(p + 1) * r].to_vec());
        }
        Ok(())
    }

    /// `[T, H]` → `[T, H]` and the routes of every row; each selected expert is fetched and run
    /// once for all its rows.
    pub fn forward(
        &self,
        x: &Tensor,
        ld: &LayerData,
        experts: &dyn ExpertProvider,
        options: &ModelOptions,
    ) -> Result<(Tensor, Vec<Route>)> {
        let routes = self.routes(x, ld)?;
        if let Some(last) = routes.last() {
            experts.note_routes(self.layer, &last.experts);
        }
        let down = ld.matrix_at(&self.down)?; // [latent, H]
        let z = dense(x, &down)?.flatten_all()?.to_vec1::<f32>()?; // [T * latent]
        let rows = rows_by_expert(&routes);
        let ys = self.run_selected(&rows, &z, x.device(), experts, options)?;
        let y = combine(&routes, &ys, self.latent); // [T * latent]
        let y = Tensor::from_vec(y, (routes.len(), self.latent), x.device())?;
        let y = match &self.norm {
            Some(n) => rms_norm(&y, n, self.eps)?,
            None => y,
        };
        let up = ld.matrix_at(&self.up)?; // [H, latent]
        let routed = dense(&y, &up)?;
        Ok(((routed + self.shared.forward(x, ld)?)?, routes))
    }

    /// Every selected expert on its rows of `z`: `y[(expert, row)]`. A long prefill chunk can
    /// select most of a layer's experts, so at most `options.expert_batch` are held at once (the
    /// memory plan charges that many).
    fn run_selected(
        &self,
        rows: &BTreeMap<usize, Vec<usize>>,
        z: &[f32],
        device: &candle::Device,
        experts: &dyn ExpertProvider,
        options: &ModelOptions,
    ) -> Result<BTreeMap<(usize, usize), Vec<f32>>> {
        let all: Vec<usize> = rows.keys().copied().collect();
        let mut ys = BTreeMap::new();
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

/// The rows each selected expert runs on, in expert-id order.
fn rows_by_expert(routes: &[Route]) -> BTreeMap<usize, Vec<usize>> {
    let mut rows: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (ti, rt) in routes.iter().enumerate() {
        for &e in &rt.experts {
            rows.entry(e).or_default().push(ti);
        }
    }
    rows
}

/// The weighted sum of each row's experts, accumulated in the row's own top-k order, so T rows
/// equal T single calls: `[T * latent]`.
fn combine(routes: &[Route], ys: &BTreeMap<(usize, usize), Vec<f32>>, latent: usize) -> Vec<f32> {
    let mut acc = vec![0f32; routes.len() * latent];
    for (ti, (rt, a)) in routes.iter().zip(acc.chunks_mut(latent.max(1))).enumerate() {
        for (e, w) in rt.experts.iter().zip(&rt.weights) {
            if let Some(y) = ys.get(&(*e, ti)) {
                for (ai, yi) in a.iter_mut().zip(y) {
                    *ai += w * yi;
                }
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
