//! Gated MLA without RoPE (spec §3.5), with the compact latent cache (`c_n`, `k_pe`, grown in
//! place: `mla_cache.rs`) and `kv_b` absorbed into the query and output; the expanded form is
//! kept as the reference.

use candle::{Device, Tensor, D};
use rayon::prelude::*;

use super::mla_cache::attend;
use super::ops::{rms_norm, sigmoid, MLA_LATENT_NORM_EPS};
use super::weights::LayerWeights;
use crate::compute::dense;
use crate::kernels::dense::{gemm, DenseMatrix};
use crate::kernels::dense_xtw::xt_w;
use crate::runtime::row_cache::RowCache;
use crate::spine::layer::LayerData;
use crate::spine::slot::Slot;
use crate::Result;

/// Which MLA evaluation to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlaMode {
    /// Latent cache, `kv_b` absorbed (the default).
    Compact,
    /// Keys and values expanded per head from the latent cache (the reference).
    Expanded,
}

/// One gated MLA block (small tensors; matrices come from the layer data at each pass).
#[derive(Debug)]
pub struct Mla {
    q_a_norm: Tensor,
    kv_a_norm: Tensor,
    heads: usize,
    nope: usize,
    rope: usize,
    v_dim: usize,
    kv_lora: usize,
    m: MlaMatrices,
}

/// The MLA projections, bound at load.
#[derive(Debug)]
struct MlaMatrices {
    q_a: Slot,
    q_b: Slot,
    kv_a: Slot,
    kv_b: Slot,
    g: Slot,
    o: Slot,
}

impl Mla {
    /// Loads the layer's small tensors (`self_attn.*layernorm`).
    pub fn load(w: &LayerWeights) -> Result<Self> {
        let c = w.cfg.text();
        let (h, nh) = (c.hidden_size, c.num_attention_heads);
        let (dq, vd) = (c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim);
        let m = MlaMatrices {
            q_a: w.slot("self_attn.q_a_proj.weight", c.q_lora_rank, h)?,
            q_b: w.slot("self_attn.q_b_proj.weight", nh * dq, c.q_lora_rank)?,
            kv_a: w.slot(
                "self_attn.kv_a_proj_with_mqa.weight",
                c.kv_lora_rank + c.qk_rope_head_dim,
                h,
            )?,
            kv_b: w.slot(
                "self_attn.kv_b_proj.weight",
                nh * (c.qk_nope_head_dim + vd),
                c.kv_lora_rank,
            )?,
            g: w.slot("self_attn.g_proj.weight", nh * vd, h)?,
            o: w.slot("self_attn.o_proj.weight", h, nh * vd)?,
        };
        Ok(Mla {
            q_a_norm: w.get("self_attn.q_a_layernorm.weight", &[c.q_lora_rank])?,
            kv_a_norm: w.get("self_attn.kv_a_layernorm.weight", &[c.kv_lora_rank])?,
            heads: c.num_attention_heads,
            nope: c.qk_nope_head_dim,
            rope: c.qk_rope_head_dim,
            v_dim: c.v_head_dim,
            kv_lora: c.kv_lora_rank,
            m,
        })
    }

    /// An empty per-sequence cache that may grow to `limit` positions: the runtime's row
    /// cache, `[c_n | k_pe]` of every past position (`[P, kv_lora + rope]`), shared
    /// copy-on-write, so a clone is a cheap snapshot.
    pub fn new_state(&self, limit: usize) -> RowCache {
        RowCache::new(self.kv_lora + self.rope, limit)
    }

    fn causal_mask(t: usize, past: usize, dev: &Device) -> Result<Tensor> {
        let total = past + t;
        let mut m = vec![0f32; t * total];
        for i in 0..t {
            for j in past + i + 1..total {
                m[i * total + j] = f32::NEG_INFINITY;
            }
        }
        Ok(Tensor::from_vec(m, (t, total), dev)?)
    }

    /// `q_lat[h, t] = q_nope[h, t] · W_k[h]` (`[nh, T, kv_lora]`), reading `kv_b` in place: head
    /// `h`'s key rows are `h·(nope+v) .. h·(nope+v)+nope`, one `xᵀW` per head in `kv_b`'s
    /// arithmetic.
    fn absorb_query(&self, q_nope: &Tensor, kv_b: &DenseMatrix) -> Result<Tensor> {
        let (nh, nope, vd, kl) = (self.heads, self.nope, self.v_dim, self.kv_lora);
        let t = q_nope.dim(1)?;
        let q = q_nope.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; nh * t * kl];
        out.par_chunks_mut(t * kl)
            .enumerate()
            .try_for_each(|(h, o)| {
                let qh = &q[h * t * nope..(h + 1) * t * nope];
                xt_w(kv_b, h * (nope + vd), nope, qh, t, o)
            })?;
        Ok(Tensor::from_vec(out, (nh, t, kl), q_nope.device())?)
    }

    /// `o[h, t, v] = W_v[h, v] · ctx[h, t]` (`[nh, T, v]`), reading `kv_b` in place: head `h`'s
    /// value rows follow its key rows, one matrix product per head in `kv_b`'s arithmetic.
    fn absorb_output(&self, ctx: &Tensor, kv_b: &DenseMatrix) -> Result<Tensor> {
        let (nh, nope, vd, kl) = (self.heads, self.nope, self.v_dim, self.kv_lora);
        let t = ctx.dim(1)?;
        let c = ctx.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; nh * t * vd];
        out.par_chunks_mut(t * vd)
            .enumerate()
            .try_for_each(|(h, o)| {
                let w_v = kv_b.row_range(h * (nope + vd) + nope, vd)?;
                gemm(&w_v, &c[h * t * kl..(h + 1) * t * kl], t, o)
            })?;
        Ok(Tensor::from_vec(out, (nh, t, vd), ctx.device())?)
    }

    /// `x` is the normalised layer input `[T, H]`; returns `[T, H]` and appends to the cache.
    pub fn forward(
        &self,
        x: &Tensor,
        cache: &mut RowCache,
        mode: MlaMode,
        ld: &LayerData,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (nh, nope, rope, vd, kl) = (self.heads, self.nope, self.rope, self.v_dim, self.kv_lora);
        let (m, w) = (|s: &Slot| ld.matrix_at(s), &self.m);
        let qa = rms_norm(
            &dense(x, &m(&w.q_a)?)?, // [T, q_lora]
            &self.q_a_norm,
            MLA_LATENT_NORM_EPS,
        )?;
        let q = dense(&qa, &m(&w.q_b)?)?; // [T, nh·dq]
        let q = q.reshape((t, nh, nope + rope))?.transpose(0, 1)?; // [nh, T, dq]
        let q_nope = q.narrow(D::Minus1, 0, nope)?.contiguous()?; // [nh, T, nope]
        let q_pe = q.narrow(D::Minus1, nope, rope)?.contiguous()?; // [nh, T, rope]
        let ckv = dense(x, &m(&w.kv_a)?)?; // [T, kv_lora + rope]
        let c_n = rms_norm(
            &ckv.narrow(1, 0, kl)?.contiguous()?,
            &self.kv_a_norm,
            MLA_LATENT_NORM_EPS,
        )?;
        let kpe = ckv.narrow(1, kl, rope)?.contiguous()?; // [T, rope]
        let past = cache.len();
        // Append this call's rows `[c_n | k_pe]` in place.
        let (cn, kp) = (c_n.to_vec2::<f32>()?, kpe.to_vec2::<f32>()?);
        let new_rows: Vec<f32> = cn
            .iter()
            .zip(&kp)
            .flat_map(|(a, b)| a.iter().chain(b).copied())
            .collect();
        cache.append(&new_rows);
        let scale = 1.0 / ((nope + rope) as f64).sqrt();
        let total = past + t;
        let kv_b = m(&w.kv_b)?;
        let o = match mode {
            MlaMode::Compact => {
                // q_lat = q_nope · W_k: [nh, T, kv_lora]; each query row is [q_lat | q_pe].
                let q_lat = self
                    .absorb_query(&q_nope, &kv_b)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let q_pe = q_pe.flatten_all()?.to_vec1::<f32>()?;
                let q: Vec<f32> = q_lat
                    .chunks_exact(kl)
                    .zip(q_pe.chunks_exact(rope.max(1)))
                    .flat_map(|(a, b)| a.iter().chain(&b[..rope]).copied())
                    .collect();
                // Row h·T + ti sees positions up to past + ti.
                let visible = move |r: usize| past + r % t + 1;
                let ctx = attend(cache, &q, kl, scale as f32, &visible);
                let ctx = Tensor::from_vec(ctx, (nh, t, kl), x.device())?;
                self.absorb_output(&ctx, &kv_b)? // [nh, T, v]
            }
            MlaMode::Expanded => {
                let rows = Tensor::from_slice(cache.rows(), (total, kl + rope), x.device())?;
                let c_all = rows.narrow(1, 0, kl)?.contiguous()?; // [P, kv_lora]
                let kpe_all = rows.narrow(1, kl, rope)?.contiguous()?; // [P, rope]
                let mask = Self::causal_mask(t, past, x.device())?;
                let pe_scores = q_pe.matmul(
                    &kpe_all
                        .t()?
                        .unsqueeze(0)?
                        .broadcast_as((nh, rope, total))?
                        .contiguous()?,
                )?;
                let kv = dense(&c_all, &kv_b)?
                    .reshape((total, nh, nope + vd))?
                    .transpose(0, 1)?; // [nh, P, nope+v]
                let k_nope = kv.narrow(D::Minus1, 0, nope)?.contiguous()?; // [nh, P, nope]
                let v = kv.narrow(D::Minus1, nope, vd)?.contiguous()?; // [nh, P, v]
                let scores =
                    ((q_nope.matmul(&k_nope.t()?)? + pe_scores)? * scale)?.broadcast_add(&mask)?;
                let p = candle_nn::ops::softmax_last_dim(&scores)?;
                p.matmul(&v)?
            }
        };
        let o = o.transpose(0, 1)?.reshape((t, nh * vd))?; // [nh, T, v] → [T, nh·v]
        let o = o.mul(&sigmoid(&dense(x, &m(&w.g)?)?)?)?;
        dense(&o, &m(&w.o)?)
    }
}
