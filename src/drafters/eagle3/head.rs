//! An EAGLE-3 head over its mapped tensors: one step over `T` positions (docs/drafters.md, "One
//! draft step"). The incoming rows are either the target's three tapped rows, fused by `fc`,
//! or the head's own rows from its previous step; the layer attends over its own key/value rows
//! (`DraftCache`), and the logits over the draft vocabulary map to target ids through `d2t`.
//! fp32 arithmetic over BF16 or F32 weights read in place, through the shared layer pieces
//! (`layers::{mapped, norm, rope, attention}`). Owns the head's math; no target.

use std::path::Path;

use super::config::Eagle3Config;
use crate::checkpoint::Inventory;
use crate::drafters::parts::{read_d2t, target_id, Linear};
use crate::layers::attention::{attend, AttnShape};
use crate::layers::mapped::{matrix, Mapped, Stored};
use crate::layers::norm::rms_norm;
use crate::layers::rope::Rope;
use crate::{Error, Result};

/// What a step reads besides the token embeddings.
#[derive(Debug, Clone, Copy)]
pub enum HeadInput<'a> {
    /// The target's tapped rows `[T, 3·Ht]` (its three layers concatenated, ascending).
    Taps(&'a [f32]),
    /// The head's own rows `[T, H]` from its previous step (`StepOutput::rows`).
    Rows(&'a [f32]),
}

/// The head's key/value rows, one per position it has consumed.
#[derive(Debug, Clone, Default)]
pub struct DraftCache {
    rows: Vec<f32>,
    len: usize,
}

impl DraftCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `n` positions (drafts a verify pass rejected are dropped).
    pub fn truncate(&mut self, n: usize) {
        if n < self.len {
            let w = self.rows.len() / self.len.max(1);
            self.rows.truncate(n * w);
            self.len = n;
        }
    }
}

/// One step's result.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// Logits over the draft vocabulary `[T, Vd]`.
    pub logits: Vec<f32>,
    /// The rows a next step takes as `HeadInput::Rows` `[T, H]`.
    pub rows: Vec<f32>,
}

/// An EAGLE-3 head opened from its directory.
pub struct Eagle3Head {
    cfg: Eagle3Config,
    map: Mapped,
    fc: Linear,
    fc_norms: Vec<Vec<f32>>,
    input_norm: Option<Vec<f32>>,
    norms: [Vec<f32>; 4],
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    qkvo: [Linear; 4],
    mlp: [Linear; 3],
    lm_head: Linear,
    embed: Option<Stored>,
    d2t: Vec<i64>,
    rope: Rope,
}

impl Eagle3Head {
    /// Opens the head in `dir` (`config.json` and its safetensors), checking every tensor's
    /// shape against the config.
    pub fn open(dir: &Path) -> Result<Self> {
        let cfg = Eagle3Config::from_dir(dir)?;
        let inv = Inventory::from_dir(dir)?;
        let map = Mapped::open(&inv)?;
        let p = cfg.layer_prefix();
        let (h, ht, hd) = (cfg.hidden, cfg.target_hidden, cfg.head_dim);
        let (qd, kvd) = (cfg.heads * hd, cfg.kv_heads * hd);
        let lin = |name: &str, rows: usize, cols: usize| Linear::open(&inv, &map, name, rows, cols);
        let vec = |name: &str, n: usize| map.vector(&inv, name, n);
        let fc_norms = match cfg.fc_norm {
            true => (0..3)
                .map(|i| vec(&format!("fc_norm.{i}.weight"), ht))
                .collect::<Result<_>>()?,
            false => Vec::new(),
        };
        let input_norm = match cfg.norm_before_fc {
            true => Some(vec("input_norm.weight", 3 * ht)?),
            false => None,
        };
        let qk_norm = match cfg.qk_norm {
            true => Some((
                vec(&format!("{p}self_attn.q_norm.weight"), hd)?,
                vec(&format!("{p}self_attn.k_norm.weight"), hd)?,
            )),
            false => None,
        };
        let embed = match inv.get("embed_tokens.weight") {
            Some(_) => Some(matrix(&inv, "embed_tokens.weight", cfg.vocab, h)?),
            None => None,
        };
        let d2t = read_d2t(&inv, &map, cfg.draft_vocab, cfg.vocab)?;
        Ok(Eagle3Head {
            fc: lin("fc", h, 3 * ht)?,
            fc_norms,
            input_norm,
            norms: [
                vec(&format!("{p}input_layernorm.weight"), h)?,
                vec(&format!("{p}hidden_norm.weight"), h)?,
                vec(&format!("{p}post_attention_layernorm.weight"), h)?,
                vec("norm.weight", h)?,
            ],
            qk_norm,
            qkvo: [
                lin(&format!("{p}self_attn.q_proj"), qd, 2 * h)?,
                lin(&format!("{p}self_attn.k_proj"), kvd, 2 * h)?,
                lin(&format!("{p}self_attn.v_proj"), kvd, 2 * h)?,
                lin(&format!("{p}self_attn.o_proj"), h, qd)?,
            ],
            mlp: [
                lin(&format!("{p}mlp.gate_proj"), cfg.intermediate, h)?,
                lin(&format!("{p}mlp.up_proj"), cfg.intermediate, h)?,
                lin(&format!("{p}mlp.down_proj"), h, cfg.intermediate)?,
            ],
            lm_head: lin("lm_head", cfg.draft_vocab, h)?,
            embed,
            d2t,
            rope: Rope::plain(cfg.rope_theta, hd),
            map,
            cfg,
        })
    }

    /// The head's config.
    pub fn config(&self) -> &Eagle3Config {
        &self.cfg
    }

    /// Whether the head ships its own embedding (else the target's rows are passed in).
    pub fn has_embedding(&self) -> bool {
        self.embed.is_some()
    }

    /// The head's own embedding rows `[T, H]` for `ids` (target ids).
    pub fn embed(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let table = self.embed.as_ref().ok_or_else(|| {
            Error::Msg("this EAGLE-3 head uses its target's embedding (no embed_tokens)".into())
        })?;
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab) {
            return Err(Error::Msg(format!(
                "token id {bad} is past the vocabulary ({})",
                self.cfg.vocab
            )));
        }
        Ok(self.map.rows(table, ids))
    }

    /// The target id of draft id `d` (`d + d2t[d]`).
    pub fn target_id(&self, d: usize) -> u32 {
        target_id(&self.d2t, d)
    }

    fn linear(&self, l: &Linear, x: &[f32], t: usize) -> Result<Vec<f32>> {
        l.apply(&self.map, x, t)
    }

    /// The incoming rows `[T, H]`: `fc` over the (normalised) taps, or the head's own rows.
    fn incoming(&self, input: HeadInput<'_>, t: usize) -> Result<Vec<f32>> {
        let (h, ht) = (self.cfg.hidden, self.cfg.target_hidden);
        match input {
            HeadInput::Rows(r) if r.len() == t * h => Ok(r.to_vec()),
            HeadInput::Taps(x) if x.len() == t * 3 * ht => {
                let x = match (&self.input_norm, self.fc_norms.is_empty()) {
                    (Some(w), _) => rms_norm(x, w, self.cfg.eps),
                    (None, false) => x
                        .chunks(ht)
                        .enumerate()
                        .flat_map(|(i, c)| rms_norm(c, &self.fc_norms[i % 3], self.cfg.eps))
                        .collect(),
                    (None, true) => x.to_vec(),
                };
                self.linear(&self.fc, &x, t)
            }
            _ => Err(Error::Msg(format!(
                "an EAGLE-3 step over {t} positions needs [{t}, {}] tapped rows or [{t}, {h}] rows",
                3 * ht
            ))),
        }
    }

    /// One step over `T` positions after those `cache` holds: `embeds` `[T, H]` are the
    /// embeddings of the tokens at these positions' next positions (docs/drafters.md,
    /// "Alignment").
    pub fn step(
        &self,
        embeds: &[f32],
        input: HeadInput<'_>,
        cache: &mut DraftCache,
    ) -> Result<StepOutput> {
        let c = &self.cfg;
        let (h, hd, eps) = (c.hidden, c.head_dim, c.eps);
        if embeds.is_empty() || !embeds.len().is_multiple_of(h) {
            return Err(Error::Msg(format!("embeddings of width {h} expected")));
        }
        let t = embeds.len() / h;
        let x = self.incoming(input, t)?;
        let e_n = rms_norm(embeds, &self.norms[0], eps);
        let h_n = rms_norm(&x, &self.norms[1], eps);
        let residual = if c.norm_before_residual { &h_n } else { &x };
        let cat: Vec<f32> = e_n
            .chunks(h)
            .zip(h_n.chunks(h))
            .flat_map(|(a, b)| a.iter().chain(b).copied())
            .collect();
        let [qp, kp, vp, op] = &self.qkvo;
        let (mut q, mut k) = (self.linear(qp, &cat, t)?, self.linear(kp, &cat, t)?);
        let v = self.linear(vp, &cat, t)?;
        if let Some((qn, kn)) = &self.qk_norm {
            q = rms_norm(&q, qn, eps);
            k = rms_norm(&k, kn, eps);
        }
        let (qd, kvd) = (c.heads * hd, c.kv_heads * hd);
        let first = cache.len;
        for r in 0..t {
            self.rope.apply(&mut q[r * qd..][..qd], first + r, hd);
            self.rope.apply(&mut k[r * kvd..][..kvd], first + r, hd);
            cache.rows.extend_from_slice(&k[r * kvd..][..kvd]);
            cache.rows.extend_from_slice(&v[r * kvd..][..kvd]);
        }
        cache.len += t;
        let shape = AttnShape {
            heads: c.heads,
            kv_heads: c.kv_heads,
            d: hd,
            window: usize::MAX,
        };
        let a = attend(&shape, &q, &cache.rows, first, None, (hd as f32).powf(-0.5));
        let o = self.linear(op, &a, t)?;
        let h1: Vec<f32> = residual.iter().zip(&o).map(|(a, b)| a + b).collect();
        let m_in = rms_norm(&h1, &self.norms[2], eps);
        let [gate, up, down] = &self.mlp;
        let (g, u) = (self.linear(gate, &m_in, t)?, self.linear(up, &m_in, t)?);
        let act: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let d = self.linear(down, &act, t)?;
        let out: Vec<f32> = h1.iter().zip(&d).map(|(a, b)| a + b).collect();
        let normed = rms_norm(&out, &self.norms[3], eps);
        let logits = self.linear(&self.lm_head, &normed, t)?;
        let rows = if c.feed_normed { normed } else { out };
        Ok(StepOutput { logits, rows })
    }
}
