//! DSpark's sequential head over its mapped tensors (`markov_head.*`): a low-rank logit bias
//! for each block slot from the token before that slot's target (`markov_w1` `[V, r]` rows,
//! `markov_w2` `[Vd, r]`), plain, gated by the slot's hidden row, or through a recurrent state
//! over the block (docs/drafters.md, "DSpark"). fp32. Owns the bias; the block is `head`'s.

use crate::checkpoint::Inventory;
use crate::drafters::dflash::config::{Markov, MarkovKind};
use crate::drafters::parts::Linear;
use crate::layers::mapped::{matrix, Mapped, Stored};
use crate::Result;

/// The sequential head's tensors.
pub(crate) struct MarkovHead {
    cfg: Markov,
    w1: Stored,
    w2: Linear,
    /// `gate_proj` `[r, H + r]` (gated) or `joint_proj` `[3r, 2r + H]` (rnn).
    mix: Option<Linear>,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl MarkovHead {
    /// Opens `markov_head.*` for a target vocabulary `v`, draft vocabulary `vd`, width `h`.
    pub(crate) fn open(
        inv: &Inventory,
        map: &Mapped,
        cfg: Markov,
        (v, vd, h): (usize, usize, usize),
    ) -> Result<Self> {
        let r = cfg.rank;
        let mix = match cfg.kind {
            MarkovKind::Vanilla => None,
            MarkovKind::Gated => Some(Linear::open(inv, map, "markov_head.gate_proj", r, h + r)?),
            MarkovKind::Rnn => Some(Linear::open(
                inv,
                map,
                "markov_head.joint_proj",
                3 * r,
                2 * r + h,
            )?),
        };
        Ok(MarkovHead {
            cfg,
            w1: matrix(inv, "markov_head.markov_w1.weight", v, r)?,
            w2: Linear::open(inv, map, "markov_head.markov_w2", vd, r)?,
            mix,
        })
    }

    /// A fresh recurrent state for one block (zeros; unused but by `rnn`).
    pub(crate) fn state(&self) -> Vec<f32> {
        vec![0.0; self.cfg.rank]
    }

    /// The bias `[Vd]` of one slot whose target follows `prev`, from the slot's final-norm row
    /// `hidden` `[H]`; `state` carries the recurrent head from slot to slot.
    pub(crate) fn bias(
        &self,
        map: &Mapped,
        prev: u32,
        hidden: &[f32],
        state: &mut [f32],
    ) -> Result<Vec<f32>> {
        let r = self.cfg.rank;
        let e = map.rows(&self.w1, &[prev]);
        let x = match (&self.mix, self.cfg.kind) {
            (Some(gate), MarkovKind::Gated) => {
                let input: Vec<f32> = hidden.iter().chain(&e).copied().collect();
                let g = gate.apply(map, &input, 1)?;
                e.iter().zip(&g).map(|(e, g)| sigmoid(*g) * e).collect()
            }
            (Some(joint), MarkovKind::Rnn) => {
                let input: Vec<f32> = state.iter().chain(&e).chain(hidden).copied().collect();
                let z = joint.apply(map, &input, 1)?;
                let (g, rest) = z.split_at(r);
                let (c, o) = rest.split_at(r);
                for i in 0..r {
                    let gi = sigmoid(g[i]);
                    state[i] = gi * state[i] + (1.0 - gi) * c[i].tanh();
                }
                o.iter().map(|x| x.tanh()).collect()
            }
            _ => e,
        };
        self.w2.apply(map, &x, 1)
    }
}
