//! The routed-expert executor every MoE model calls: group the rows by selected expert, fetch
//! each distinct expert once from an `ExpertProvider` (at most `expert_batch` held at once),
//! run each batch as soon as its bytes are in while later reads are in flight, and combine each
//! row's experts in its own top-k order, so the result depends neither on arrival order nor on
//! the other rows. Knows no model: the expert is an `ExpertFfn` value, the routes come from the
//! caller (`Gating`), and `device::run_experts` runs the experts on the device.

use std::collections::BTreeMap;

use candle::{Device, Tensor};

use super::ffn::ExpertFfn;
use super::gating::Route;
use crate::experts::{ExpertBytes, ExpertProvider};
use crate::kernels::dense::DenseKernel;
use crate::mxfp4::Kernel;
use crate::{Error, Result};

/// How the executor runs.
#[derive(Debug, Clone, Copy)]
pub struct ExecOptions {
    /// The MXFP4 kernel on the host.
    pub kernel: Kernel,
    /// The arithmetic of BF16 experts on the host (`LoadOptions::dense_kernel`).
    pub dense: DenseKernel,
    /// Most experts held at once (a pass can select every expert of a layer).
    pub expert_batch: usize,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            kernel: Kernel::best(),
            dense: DenseKernel::Exact,
            expert_batch: 32,
        }
    }
}

/// One layer's routed experts: what each expert computes, and how many each row selects.
#[derive(Debug, Clone)]
pub struct RoutedExperts {
    /// The expert network.
    pub ffn: ExpertFfn,
    /// Experts per row.
    pub top_k: usize,
}

impl RoutedExperts {
    /// The weighted sum of each row's selected experts: `z` `[T * width]` (row-major) →
    /// `[T * width]`. `routes[t]` is row `t`'s selection (at most `top_k`); the last row's
    /// selection is noted to the provider as the hint for the next position.
    pub fn run(
        &self,
        layer: usize,
        routes: &[Route],
        z: Vec<f32>,
        device: &Device,
        experts: &dyn ExpertProvider,
        opts: &ExecOptions,
    ) -> Result<Vec<f32>> {
        let width = self.ffn.width;
        if z.len() != routes.len() * width {
            return Err(Error::Msg(format!(
                "MoE input has {} values for {} rows of width {width}",
                z.len(),
                routes.len()
            )));
        }
        if let Some(rt) = routes.iter().find(|r| r.experts.len() > self.top_k) {
            return Err(Error::Msg(format!(
                "a route selects {} experts, more than top_k = {}",
                rt.experts.len(),
                self.top_k
            )));
        }
        if let Some(last) = routes.last() {
            experts.note_routes(layer, &last.experts);
        }
        let rows = rows_by_expert(routes);
        let ys = self.run_selected(layer, &rows, routes.len(), &z, device, experts, opts)?;
        drop(z);
        Ok(combine(routes, &ys, self.top_k, width))
    }

    /// `run` on a tensor `x` `[T, width]` → `[T, width]` (f32, on `x`'s device).
    pub fn forward(
        &self,
        layer: usize,
        x: &Tensor,
        routes: &[Route],
        experts: &dyn ExpertProvider,
        opts: &ExecOptions,
    ) -> Result<Tensor> {
        let z = x
            .to_dtype(candle::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let y = self.run(layer, routes, z, x.device(), experts, opts)?;
        Ok(Tensor::from_vec(
            y,
            (routes.len(), self.ffn.width),
            x.device(),
        )?)
    }

    /// Every selected expert on its rows of `z`: `[T, k, width]`, each at its row's slot. The
    /// store reads each expert once, in id order (its offset order within a shard).
    #[allow(clippy::too_many_arguments)]
    fn run_selected(
        &self,
        layer: usize,
        rows: &BTreeMap<usize, Vec<(usize, usize)>>,
        t: usize,
        z: &[f32],
        device: &Device,
        experts: &dyn ExpertProvider,
        opts: &ExecOptions,
    ) -> Result<Vec<f32>> {
        let all: Vec<usize> = rows.keys().copied().collect();
        let mut ys = vec![0f32; t * self.top_k * self.ffn.width];
        for ids in all.chunks(opts.expert_batch.max(1)) {
            experts.fetch_each(layer, ids, &mut |got| {
                let (gi, gb): (Vec<usize>, Vec<_>) =
                    got.iter().map(|(i, b)| (ids[*i], b.clone())).unzip();
                self.run_group(&gi, &gb, rows, z, device, opts, &mut ys)
            })?;
        }
        Ok(ys)
    }

    /// Runs one group of fetched experts over their rows, into `ys` `[T, k, width]` at each
    /// row's slot.
    #[allow(clippy::too_many_arguments)]
    fn run_group(
        &self,
        ids: &[usize],
        bytes: &[ExpertBytes],
        rows: &BTreeMap<usize, Vec<(usize, usize)>>,
        z: &[f32],
        device: &Device,
        opts: &ExecOptions,
        ys: &mut [f32],
    ) -> Result<()> {
        let (w, k) = (self.ffn.width, self.top_k);
        let pairs: Vec<(usize, usize)> = ids
            .iter()
            .enumerate()
            .flat_map(|(g, e)| rows[e].iter().map(move |&(ti, _)| (g, ti)))
            .collect();
        let slots = ids
            .iter()
            .flat_map(|e| rows[e].iter().map(|&(ti, s)| ti * k + s));
        let y = super::device::run_experts(device, opts, &self.ffn, bytes, &pairs, z)?;
        for (yp, at) in y.chunks_exact(w.max(1)).zip(slots) {
            ys[at * w..(at + 1) * w].copy_from_slice(yp);
        }
        Ok(())
    }
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

/// The weighted sum of each row's experts `ys` `[T, k, width]`, accumulated in the row's own
/// top-k order: `[T * width]`.
fn combine(routes: &[Route], ys: &[f32], k: usize, width: usize) -> Vec<f32> {
    let mut acc = vec![0f32; routes.len() * width];
    for (ti, (rt, a)) in routes.iter().zip(acc.chunks_mut(width.max(1))).enumerate() {
        for (s, w) in rt.weights.iter().enumerate().take(k) {
            let y = &ys[(ti * k + s) * width..(ti * k + s + 1) * width];
            for (ai, yi) in a.iter_mut().zip(y) {
                *ai += w * yi;
            }
        }
    }
    acc
}
