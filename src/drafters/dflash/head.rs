//! A DFlash block drafter over its mapped tensors (docs/drafters.md, "DFlash block drafting").
//! The target's tapped rows of every position before the anchor are fused once (`fc`, then
//! `hidden_norm`) and each draft layer projects them to its context keys and values
//! (`ContextCache`; the fused rows never pass through the layers). A block is the anchor token
//! followed by mask tokens at the next positions; its rows run through Qwen3-style layers whose
//! queries see every context row and every row of the block (non-causal within it), and the
//! final norm and `lm_head` give one draft per slot. fp32 arithmetic over BF16 or F32 weights
//! read in place. Owns the head's math; no target.

use std::path::Path;

use super::config::DFlashConfig;
use super::markov::MarkovHead;
use crate::checkpoint::Inventory;
use crate::drafters::parts::{read_d2t, target_id, Linear};
use crate::layers::attention::{attend, AttnShape};
use crate::layers::mapped::{matrix, Mapped, Stored};
use crate::layers::norm::rms_norm;
use crate::layers::rope::Rope;
use crate::{Error, Result};

/// Every draft layer's keys and values `[k | v]` for the target positions read so far.
#[derive(Debug, Clone, Default)]
pub struct ContextCache {
    /// The target position of the first row.
    start: usize,
    /// One `[len, 2·kv_heads·d]` block per draft layer.
    rows: Vec<Vec<f32>>,
    len: usize,
}

impl ContextCache {
    /// An empty cache whose first row will be target position `start`.
    pub fn starting_at(start: usize) -> Self {
        ContextCache {
            start,
            ..Default::default()
        }
    }

    /// The target position of the first row.
    pub fn start(&self) -> usize {
        self.start
    }

    /// The position after the last row held (the next anchor's position).
    pub fn end(&self) -> usize {
        self.start + self.len
    }

    /// Keeps the rows of positions before `pos`.
    pub fn truncate_to(&mut self, pos: usize) {
        let n = pos.saturating_sub(self.start);
        if n < self.len {
            for r in &mut self.rows {
                let w = r.len() / self.len.max(1);
                r.truncate(n * w);
            }
            self.len = n;
        }
    }
}

/// One draft layer's tensors.
struct Layer {
    in_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    qkvo: [Linear; 4],
    mlp: [Linear; 3],
}

/// A DFlash head opened from its directory.
pub struct DFlashHead {
    cfg: DFlashConfig,
    map: Mapped,
    fc: Linear,
    hidden_norm: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Linear,
    embed: Stored,
    d2t: Vec<i64>,
    rope: Rope,
    markov: Option<MarkovHead>,
}

/// One block's pass: each slot's final-norm row and its logits over the draft vocabulary
/// (before DSpark's sequential bias, which depends on the tokens drafted before it).
#[derive(Debug, Clone)]
pub struct Block {
    /// `[block_size, H]`.
    pub hidden: Vec<f32>,
    /// `[block_size, Vd]`.
    pub logits: Vec<f32>,
}

impl DFlashHead {
    /// Opens the head in `dir` (`config.json` and its safetensors), checking every tensor's
    /// shape against the config.
    pub fn open(dir: &Path) -> Result<Self> {
        let cfg = DFlashConfig::from_dir(dir)?;
        let inv = Inventory::from_dir(dir)?;
        let map = Mapped::open(&inv)?;
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let (qd, kvd) = (cfg.heads * hd, cfg.kv_heads * hd);
        let lin = |name: &str, rows: usize, cols: usize| Linear::open(&inv, &map, name, rows, cols);
        let vec = |name: &str, n: usize| map.vector(&inv, name, n);
        let borrowed = |what: &str| Error::Tensor {
            name: format!("{what}.weight"),
            msg: format!(
                "missing from {}: this head borrows its target's {what}; deltafin runs DFlash \
                 heads that carry their own (speculators' converter writes it from the target)",
                dir.display()
            ),
        };
        if inv.get("embed_tokens.weight").is_none() {
            return Err(borrowed("embed_tokens"));
        }
        if inv.get("lm_head.weight").is_none() {
            return Err(borrowed("lm_head"));
        }
        let layers = (0..cfg.layers)
            .map(|i| {
                let p = format!("layers.{i}.");
                Ok(Layer {
                    in_norm: vec(&format!("{p}input_layernorm.weight"), h)?,
                    post_norm: vec(&format!("{p}post_attention_layernorm.weight"), h)?,
                    q_norm: vec(&format!("{p}self_attn.q_norm.weight"), hd)?,
                    k_norm: vec(&format!("{p}self_attn.k_norm.weight"), hd)?,
                    qkvo: [
                        lin(&format!("{p}self_attn.q_proj"), qd, h)?,
                        lin(&format!("{p}self_attn.k_proj"), kvd, h)?,
                        lin(&format!("{p}self_attn.v_proj"), kvd, h)?,
                        lin(&format!("{p}self_attn.o_proj"), h, qd)?,
                    ],
                    mlp: [
                        lin(&format!("{p}mlp.gate_proj"), cfg.intermediate, h)?,
                        lin(&format!("{p}mlp.up_proj"), cfg.intermediate, h)?,
                        lin(&format!("{p}mlp.down_proj"), h, cfg.intermediate)?,
                    ],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DFlashHead {
            fc: lin("fc", h, cfg.tap_layers.len() * h)?,
            hidden_norm: vec("hidden_norm.weight", h)?,
            layers,
            norm: vec("norm.weight", h)?,
            lm_head: lin("lm_head", cfg.draft_vocab, h)?,
            embed: matrix(&inv, "embed_tokens.weight", cfg.vocab, h)?,
            d2t: read_d2t(&inv, &map, cfg.draft_vocab, cfg.vocab)?,
            rope: Rope::plain(cfg.rope_theta, hd),
            markov: match cfg.markov {
                Some(m) => Some(MarkovHead::open(
                    &inv,
                    &map,
                    m,
                    (cfg.vocab, cfg.draft_vocab, h),
                )?),
                None => None,
            },
            map,
            cfg,
        })
    }

    /// The head's config.
    pub fn config(&self) -> &DFlashConfig {
        &self.cfg
    }

    /// The target id of draft id `d`.
    pub fn target_id(&self, d: usize) -> u32 {
        target_id(&self.d2t, d)
    }

    fn embed(&self, ids: &[u32]) -> Result<Vec<f32>> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab) {
            return Err(Error::Msg(format!(
                "token id {bad} is past the vocabulary ({})",
                self.cfg.vocab
            )));
        }
        Ok(self.map.rows(&self.embed, ids))
    }

    fn attn_shape(&self) -> AttnShape {
        AttnShape {
            heads: self.cfg.heads,
            kv_heads: self.cfg.kv_heads,
            d: self.cfg.head_dim,
            window: usize::MAX,
        }
    }

    /// Normalised, rotated keys and values `[t, 2·kv_heads·d]` of `x` `[t, H]` at positions
    /// `first..first + t` through layer `l`.
    fn keys_values(&self, l: &Layer, x: &[f32], t: usize, first: usize) -> Result<Vec<f32>> {
        let (hd, kvd) = (self.cfg.head_dim, self.cfg.kv_heads * self.cfg.head_dim);
        let mut k = rms_norm(&l.qkvo[1].apply(&self.map, x, t)?, &l.k_norm, self.cfg.eps);
        let v = l.qkvo[2].apply(&self.map, x, t)?;
        let mut out = Vec::with_capacity(2 * t * kvd);
        for r in 0..t {
            self.rope.apply(&mut k[r * kvd..][..kvd], first + r, hd);
            out.extend_from_slice(&k[r * kvd..][..kvd]);
            out.extend_from_slice(&v[r * kvd..][..kvd]);
        }
        Ok(out)
    }

    /// Reads the target's tapped rows `[t, n·Ht]` (the `n` tapped layers concatenated,
    /// ascending) of the positions after those `cache` holds.
    pub fn extend(&self, taps: &[f32], cache: &mut ContextCache) -> Result<()> {
        let w = self.cfg.tap_layers.len() * self.cfg.hidden;
        if taps.is_empty() || !taps.len().is_multiple_of(w) {
            return Err(Error::Msg(format!("tapped rows of width {w} expected")));
        }
        let t = taps.len() / w;
        let fused = rms_norm(
            &self.fc.apply(&self.map, taps, t)?,
            &self.hidden_norm,
            self.cfg.eps,
        );
        cache.rows.resize(self.layers.len(), Vec::new());
        for (l, rows) in self.layers.iter().zip(&mut cache.rows) {
            rows.extend(self.keys_values(l, &fused, t, cache.start + cache.len)?);
        }
        cache.len += t;
        Ok(())
    }

    /// The block at the position after `cache`'s last row: `anchor` there and mask tokens
    /// after it, over every context row. The block's own keys and values are appended to each
    /// layer's rows for its attention and cut off again (the context is never copied), so
    /// `cache` is as it was when this returns.
    pub fn block(&self, anchor: u32, cache: &mut ContextCache) -> Result<Block> {
        let c = &self.cfg;
        let (b, h, hd) = (c.block_size, c.hidden, c.head_dim);
        let qd = c.heads * hd;
        let ids: Vec<u32> = std::iter::once(anchor)
            .chain(std::iter::repeat_n(c.mask_token_id, b - 1))
            .collect();
        let mut x = self.embed(&ids)?;
        let (pos, shape) = (cache.end(), self.attn_shape());
        cache.rows.resize(self.layers.len(), Vec::new());
        for (l, rows) in self.layers.iter().zip(&mut cache.rows) {
            let n = rms_norm(&x, &l.in_norm, c.eps);
            let mut q = rms_norm(&l.qkvo[0].apply(&self.map, &n, b)?, &l.q_norm, c.eps);
            for r in 0..b {
                self.rope.apply(&mut q[r * qd..][..qd], pos + r, hd);
            }
            let own = self.keys_values(l, &n, b, pos)?;
            let held = rows.len();
            rows.extend(own);
            // Every query sees every row: attend as the last position over all of them.
            let last = rows.len() / shape.row_width() - 1;
            let mut a = Vec::with_capacity(b * qd);
            for r in 0..b {
                a.extend(attend(
                    &shape,
                    &q[r * qd..][..qd],
                    rows,
                    last,
                    None,
                    (hd as f32).powf(-0.5),
                ));
            }
            rows.truncate(held);
            let o = l.qkvo[3].apply(&self.map, &a, b)?;
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let m = rms_norm(&x, &l.post_norm, c.eps);
            let [gate, up, down] = &l.mlp;
            let (g, u) = (gate.apply(&self.map, &m, b)?, up.apply(&self.map, &m, b)?);
            let act: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = down.apply(&self.map, &act, b)?;
            x.iter_mut().zip(&d).for_each(|(x, d)| *x += d);
        }
        debug_assert_eq!(x.len(), b * h);
        let hidden = rms_norm(&x, &self.norm, c.eps);
        let logits = self.lm_head.apply(&self.map, &hidden, b)?;
        Ok(Block { hidden, logits })
    }

    /// Every slot's logits with DSpark's sequential bias added, and the greedy drafts. Slot `s`
    /// is biased by the token before its target: the anchor for the first drafting slot (and
    /// any before it), then the token the slot before drafted, or, with `forced` (the true
    /// tokens at the anchor's position and after, `[block_size]`), that true token.
    pub fn chain(
        &self,
        b: &Block,
        anchor: u32,
        forced: Option<&[u32]>,
    ) -> Result<(Vec<f32>, Vec<u32>)> {
        let c = &self.cfg;
        let (vd, h, first) = (c.draft_vocab, c.hidden, c.first_slot());
        let mut logits = b.logits.clone();
        let mut known = vec![anchor];
        let mut state = self
            .markov
            .as_ref()
            .map(MarkovHead::state)
            .unwrap_or_default();
        for s in 0..c.block_size {
            let row = &mut logits[s * vd..][..vd];
            if let Some(m) = &self.markov {
                let j = s.saturating_sub(first);
                let prev = match forced {
                    Some(f) => f.get(j).copied().unwrap_or(anchor),
                    None => known.get(j).copied().unwrap_or(anchor),
                };
                let bias = m.bias(&self.map, prev, &b.hidden[s * h..][..h], &mut state)?;
                row.iter_mut().zip(&bias).for_each(|(x, y)| *x += y);
            }
            if s >= first {
                known.push(self.target_id(crate::runtime::generate::argmax(row) as usize));
            }
        }
        known.remove(0);
        Ok((logits, known))
    }
}
