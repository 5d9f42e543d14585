//! The differentiable K3 network the trainer optimises: spec §3's forward over a batch of
//! sequences, written with Candle's autograd ops (the inference modules in `models/k3/` run on
//! spine bytes and streamed MXFP4 experts and have no gradients). Parameters are f32 `Var`s named
//! exactly as K3's tensors, except each MoE layer's routed experts, held stacked as
//! `…experts.w1|w2|w3` `[E, rows, cols]` (export splits and quantises them). KDA runs the
//! per-position recurrence (the spec's exactness reference); MoE runs each expert on the tokens
//! routed to it (gather, compute, scatter-add). It must not touch the inference path: the two meet only through the
//! exported checkpoint, and a test checks they compute the same logits.

use std::collections::BTreeMap;

use candle::{DType, Device, Tensor, Var, D};

use crate::models::k3::config::{AttnKind, FfnKind, K3Config};
use crate::models::k3::ops::{
    rms_norm, rms_normalize, sigmoid, situ, KDA_QK_L2_EPS, MLA_LATENT_NORM_EPS,
};
use crate::{Error, Result};

/// The trainer's model: config, trainable parameters, router biases.
pub struct Net {
    /// The K3 config the parameters follow.
    pub cfg: K3Config,
    /// Trainable parameters by K3 name (experts stacked, see the module header).
    pub vars: BTreeMap<String, Var>,
    /// `e_score_correction_bias` per MoE layer: updated by load (noaux_tc), not by gradients.
    pub biases: BTreeMap<usize, Tensor>,
}

/// One forward pass: logits and each MoE layer's token count per expert.
pub struct Pass {
    /// `[B·T, V]` logits.
    pub logits: Tensor,
    /// `(layer, tokens routed to each expert)`.
    pub loads: Vec<(usize, Vec<u32>)>,
}

/// `x · wᵀ` for `x [N, in]`, `w [out, in]`.
fn linear(x: &Tensor, w: &Tensor) -> candle::Result<Tensor> {
    x.matmul(&w.t()?)
}

/// Depth attention over `values` (each `[N, H]`), spec §3.3's AttnRes.
fn attn_res(values: &[Tensor], w_norm: &Tensor, w_proj: &Tensor, eps: f64) -> Result<Tensor> {
    let v = Tensor::stack(values, 1)?; // [N, n, H]
    let k = rms_normalize(&v, eps)?;
    let q = w_norm.mul(&w_proj.squeeze(0)?)?; // [H]
    let s = k.broadcast_mul(&q)?.sum(D::Minus1)?; // [N, n]
    let p = candle_nn::ops::softmax(&s, D::Minus1)?;
    Ok(p.unsqueeze(2)?.broadcast_mul(&v)?.sum(1)?)
}

/// `x / max(‖x‖₂, 1e-12)` over the last dimension.
/// KDA's q/k norm over the last dimension: `x · rsqrt(Σx² + ε)` (as `model::ops::l2_normalize_qk`).
fn l2norm(x: &Tensor) -> candle::Result<Tensor> {
    let n = (x.sqr()?.sum_keepdim(D::Minus1)? + KDA_QK_L2_EPS as f64)?.sqrt()?;
    x.broadcast_div(&n)
}

impl Net {
    /// The parameter `name`.
    pub fn p(&self, name: &str) -> Result<&Tensor> {
        self.vars
            .get(name)
            .map(|v| v.as_tensor())
            .ok_or_else(|| Error::Msg(format!("the trainer has no parameter `{name}`")))
    }

    fn lp(&self, l: usize, s: &str) -> Result<&Tensor> {
        self.p(&format!("language_model.model.layers.{l}.{s}"))
    }

    /// Logits for `ids` `[B, T]` (u32), every position.
    pub fn forward(&self, ids: &Tensor) -> Result<Pass> {
        let (b, t) = ids.dims2()?;
        let c = self.cfg.text();
        let eps = c.rms_norm_eps;
        let g = |s: &str| self.p(&format!("language_model.model.{s}"));
        let mut h = g("embed_tokens.weight")?.index_select(&ids.flatten_all()?, 0)?; // [N, H]
        let mut anchors: Vec<Tensor> = Vec::new();
        let mut loads = Vec::new();
        for (l, kind) in self.cfg.schedule.iter().enumerate() {
            let a_in = if anchors.is_empty() {
                h.clone()
            } else {
                let mut vals = anchors.clone();
                vals.push(h.clone());
                let (wn, wp) = (
                    self.lp(l, "self_attention_res_norm.weight")?,
                    self.lp(l, "self_attention_res_proj.weight")?,
                );
                attn_res(&vals, wn, wp, eps)?
            };
            let prefix = if l % c.attn_res_block_size == 0 {
                anchors.push(h.clone());
                None
            } else {
                Some(h.clone())
            };
            let x = rms_norm(&a_in, self.lp(l, "input_layernorm.weight")?, eps)?;
            let o = match kind.attn {
                AttnKind::Kda => self.kda(l, &x, b, t)?,
                AttnKind::Mla => self.mla(l, &x, b, t)?,
            };
            let p = match prefix {
                None => o,
                Some(pf) => (pf + o)?,
            };
            let mut vals = anchors.clone();
            vals.push(p.clone());
            let m_in = attn_res(
                &vals,
                self.lp(l, "mlp_res_norm.weight")?,
                self.lp(l, "mlp_res_proj.weight")?,
                eps,
            )?;
            let xm = rms_norm(&m_in, self.lp(l, "post_attention_layernorm.weight")?, eps)?;
            let om = match kind.ffn {
                FfnKind::Dense => self.mlp(l, "mlp", &xm)?,
                FfnKind::Moe => {
                    let (out, load) = self.moe(l, &xm)?;
                    loads.push((l, load));
                    out
                }
            };
            h = (p + om)?;
        }
        anchors.push(h);
        let f = attn_res(
            &anchors,
            g("output_attn_res_norm.weight")?,
            g("output_attn_res_proj.weight")?,
            eps,
        )?;
        let x = rms_norm(&f, g("norm.weight")?, eps)?;
        let logits = linear(&x, self.p("language_model.lm_head.weight")?)?;
        Ok(Pass { logits, loads })
    }

    /// A SiTU MLP whose tensors are `{l}.{base}.{gate,up,down}_proj`.
    fn mlp(&self, l: usize, base: &str, x: &Tensor) -> Result<Tensor> {
        let c = self.cfg.text();
        let gt = linear(x, self.lp(l, &format!("{base}.gate_proj.weight"))?)?;
        let up = linear(x, self.lp(l, &format!("{base}.up_proj.weight"))?)?;
        let a = situ(
            &gt,
            &up,
            c.activation_situ_beta,
            c.activation_situ_linear_beta,
        )?;
        Ok(linear(
            &a,
            self.lp(l, &format!("{base}.down_proj.weight"))?,
        )?)
    }

    /// KDA over `x [B·T, H]` from a zero state (spec §3.4), per-position recurrence.
    fn kda(&self, l: usize, x: &Tensor, b: usize, t: usize) -> Result<Tensor> {
        let c = self.cfg.text();
        let la = &c.linear_attn_config;
        let (nh, d) = (la.num_heads, la.head_dim);
        let kw = nh * d;
        let w = la.short_conv_kernel_size;
        let a = |s: &str| self.lp(l, &format!("self_attn.{s}"));
        let conv = |proj: &str, cw: &str| -> Result<Tensor> {
            let xp = linear(x, a(proj)?)?.reshape((b, t, kw))?;
            let cw = a(cw)?.reshape((kw, w))?;
            let pad = Tensor::zeros((b, w - 1, kw), DType::F32, x.device())?;
            let xpad = Tensor::cat(&[&pad, &xp], 1)?; // [B, T+w-1, kw]
            let mut y = xpad
                .narrow(1, 0, t)?
                .broadcast_mul(&cw.narrow(1, 0, 1)?.t()?)?;
            for j in 1..w {
                let term = xpad
                    .narrow(1, j, t)?
                    .broadcast_mul(&cw.narrow(1, j, 1)?.t()?)?;
                y = (y + term)?;
            }
            Ok(y.silu()?.reshape((b, t, nh, d))?)
        };
        let q = (l2norm(&conv("q_proj.weight", "q_conv1d.weight")?)? / (d as f64).sqrt())?;
        let k = l2norm(&conv("k_proj.weight", "k_conv1d.weight")?)?;
        let v = conv("v_proj.weight", "v_conv1d.weight")?;
        let beta = sigmoid(&linear(x, a("b_proj.weight")?)?)?.reshape((b, t, nh, 1))?;
        let graw = linear(&linear(x, a("f_a_proj.weight")?)?, a("f_b_proj.weight")?)?
            .reshape((b, t, nh, d))?;
        let dt = a("dt_bias")?.reshape((nh, d))?;
        // Per head: only the first `nh` entries of `A_log [d]` are read (the rest stay zero).
        let decay_rate = a("A_log")?.narrow(0, 0, nh)?.exp()?.reshape((nh, 1))?; // [nh, 1]
        let gate = (sigmoid(&graw.broadcast_add(&dt)?.broadcast_mul(&decay_rate)?)?
            * la.gate_lower_bound)?;
        // Time-major `[T, B·nh, rows, cols]` so each step is a contiguous slice.
        let tm = |x: &Tensor, rows: usize, cols: usize| -> Result<Tensor> {
            Ok(x.transpose(0, 1)?
                .contiguous()?
                .reshape((t, b * nh, rows, cols))?)
        };
        let decay = tm(&gate.exp()?, d, 1)?;
        let kb = tm(&k.broadcast_mul(&beta)?, d, 1)?;
        let (q, k, v) = (tm(&q, 1, d)?, tm(&k, 1, d)?, tm(&v, 1, d)?);
        let mut s = Tensor::zeros((b * nh, d, d), DType::F32, x.device())?;
        let mut outs = Vec::with_capacity(t);
        for i in 0..t {
            s = s.broadcast_mul(&decay.get(i)?)?;
            let pred = k.get(i)?.matmul(&s)?; // [B·nh, 1, d]
            let delta = (v.get(i)? - pred)?;
            s = (s + kb.get(i)?.matmul(&delta)?)?;
            outs.push(q.get(i)?.matmul(&s)?);
        }
        let o = Tensor::stack(&outs, 0)?
            .reshape((t, b, nh, d))?
            .transpose(0, 1)?; // [B,T,nh,d]
        let o = rms_norm(&o.contiguous()?, a("o_norm.weight")?, c.rms_norm_eps)?;
        let gout = linear(x, a("g_proj.weight")?)?.reshape((b, t, nh, d))?;
        let o = o.mul(&sigmoid(&gout)?)?.reshape((b * t, kw))?;
        Ok(linear(&o, a("o_proj.weight")?)?)
    }

    /// Gated NoPE MLA over `x [B·T, H]`, causal within each sequence (spec §3.5).
    fn mla(&self, l: usize, x: &Tensor, b: usize, t: usize) -> Result<Tensor> {
        let c = self.cfg.text();
        let eps = MLA_LATENT_NORM_EPS;
        let a = |s: &str| self.lp(l, &format!("self_attn.{s}"));
        let nh = c.num_attention_heads;
        let (nope, rope, vd) = (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
        let dq = nope + rope;
        let qa = rms_norm(
            &linear(x, a("q_a_proj.weight")?)?,
            a("q_a_layernorm.weight")?,
            eps,
        )?;
        let q = linear(&qa, a("q_b_proj.weight")?)?
            .reshape((b, t, nh, dq))?
            .transpose(1, 2)?
            .contiguous()?; // [B, nh, T, dq]
        let ckv = linear(x, a("kv_a_proj_with_mqa.weight")?)?;
        let cn = rms_norm(
            &ckv.narrow(1, 0, c.kv_lora_rank)?,
            a("kv_a_layernorm.weight")?,
            eps,
        )?;
        let kpe = ckv
            .narrow(1, c.kv_lora_rank, rope)?
            .reshape((b, t, 1, rope))?
            .broadcast_as((b, t, nh, rope))?;
        let kv = linear(&cn, a("kv_b_proj.weight")?)?.reshape((b, t, nh, nope + vd))?;
        let k = Tensor::cat(&[&kv.narrow(3, 0, nope)?, &kpe], 3)?
            .transpose(1, 2)?
            .contiguous()?; // [B, nh, T, dq]
        let v = kv.narrow(3, nope, vd)?.transpose(1, 2)?.contiguous()?;
        let scores = (q.matmul(&k.t()?)? * (dq as f64).powf(-0.5))?;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| if i % t > i / t { -1e30 } else { 0.0 })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), x.device())?;
        let p = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
        let o = p
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * t, nh * vd))?;
        let o = o.mul(&sigmoid(&linear(x, a("g_proj.weight")?)?)?)?;
        Ok(linear(&o, a("o_proj.weight")?)?)
    }

    /// Latent MoE with shared experts over `x [N, H]` (spec §3.6); also the per-expert load.
    fn moe(&self, l: usize, x: &Tensor) -> Result<(Tensor, Vec<u32>)> {
        let c = self.cfg.text();
        let (e, k) = (c.num_experts, c.num_experts_per_token);
        let m = |s: &str| self.lp(l, &format!("block_sparse_moe.{s}"));
        let s = sigmoid(&linear(x, m("gate.weight")?)?)?; // [N, E]
        let bias = self
            .biases
            .get(&l)
            .ok_or_else(|| Error::Msg(format!("no router bias for layer {l}")))?;
        let choice: Vec<Vec<f32>> = s.detach().broadcast_add(bias)?.to_vec2()?;
        let mut load = vec![0u32; e];
        let mut mask = Vec::with_capacity(choice.len() * e);
        // Tokens routed to each expert.
        let mut routed: Vec<Vec<u32>> = vec![Vec::new(); e];
        for (n, row) in choice.iter().enumerate() {
            let mut idx: Vec<usize> = (0..e).collect();
            // Highest first, lowest index on ties (as the inference router).
            idx.sort_by(|&i, &j| row[j].total_cmp(&row[i]).then(i.cmp(&j)));
            let mut r = vec![0f32; e];
            for &i in &idx[..k] {
                r[i] = 1.0;
                load[i] += 1;
                routed[i].push(n as u32);
            }
            mask.extend(r);
        }
        let mask = Tensor::from_vec(mask, (choice.len(), e), x.device())?;
        let sm = s.mul(&mask)?;
        let w = sm.broadcast_div(&(sm.sum_keepdim(1)? + 1e-20)?)?; // [N, E]
        let z = linear(x, m("routed_expert_down_proj.weight")?)?; // [N, lat]
        let (w1, w2, w3) = (m("experts.w1")?, m("experts.w2")?, m("experts.w3")?); // [E, ·, ·]
                                                                                   // Each expert on its own tokens only, added back in place: the sum over the selected
                                                                                   // experts, with a quarter of the work of running every expert (top-2 of 8).
        let mut y = z.zeros_like()?;
        for (ex, toks) in routed.iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let idx = Tensor::new(toks.as_slice(), x.device())?;
            let ze = z.index_select(&idx, 0)?; // [n_e, lat]
            let a = situ(
                &linear(&ze, &w1.get(ex)?)?,
                &linear(&ze, &w3.get(ex)?)?,
                c.activation_situ_beta,
                c.activation_situ_linear_beta,
            )?;
            let we = w.index_select(&idx, 0)?.narrow(1, ex, 1)?; // [n_e, 1]
            let ye = linear(&a, &w2.get(ex)?)?.broadcast_mul(&we)?;
            y = y.index_add(&idx, &ye, 0)?;
        }
        let r = linear(
            &rms_norm(&y, m("routed_expert_norm.weight")?, c.rms_norm_eps)?,
            m("routed_expert_up_proj.weight")?,
        )?;
        let shared = self.mlp(l, "block_sparse_moe.shared_experts", x)?;
        Ok(((r + shared)?, load))
    }

    /// Every trainable variable, in name order.
    pub fn all_vars(&self) -> Vec<Var> {
        self.vars.values().cloned().collect()
    }

    /// The device the parameters live on.
    pub fn device(&self) -> Device {
        self.vars
            .values()
            .next()
            .map(|v| v.device().clone())
            .unwrap_or(Device::Cpu)
    }
}
