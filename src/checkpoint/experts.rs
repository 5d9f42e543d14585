//! Routed-expert spans: where each expert's six MXFP4 tensors lie, and whether one read gets
//! them all. The layout is generic so other MoE checkpoints can describe their own naming.

use super::header::Dtype;
use super::inventory::Inventory;
use crate::config::K3Config;
use crate::{Error, Result};

/// Names of the six parts in canonical (raw-v1) order.
pub const K3_EXPERT_PARTS: [&str; 6] = [
    "w1.weight_packed",
    "w1.weight_scale",
    "w2.weight_packed",
    "w2.weight_scale",
    "w3.weight_packed",
    "w3.weight_scale",
];

/// Shapes of an expert's parts (all U8), in canonical order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertLayout {
    /// `[rows, cols]` of each part as stored (packed: cols/2, scale: cols/group).
    pub part_shapes: Vec<[usize; 2]>,
}

impl ExpertLayout {
    /// The layout of three MXFP4 matrices `(rows, cols)` with the given group size.
    pub fn mxfp4(matrices: &[(usize, usize)], group: usize) -> Self {
        let mut part_shapes = Vec::new();
        for &(r, c) in matrices {
            part_shapes.push([r, c / 2]);
            part_shapes.push([r, c / group]);
        }
        ExpertLayout { part_shapes }
    }

    /// K3's layout from the config.
    pub fn k3(cfg: &K3Config) -> Self {
        Self::mxfp4(&cfg.expert_matrix_shapes(), cfg.group_size)
    }

    /// Byte size of each part.
    pub fn part_sizes(&self) -> Vec<u64> {
        self.part_shapes
            .iter()
            .map(|s| (s[0] * s[1]) as u64)
            .collect()
    }

    /// Offset of each part inside the canonical span, plus the total.
    pub fn offsets(&self) -> (Vec<u64>, u64) {
        let mut offs = Vec::new();
        let mut o = 0;
        for s in self.part_sizes() {
            offs.push(o);
            o += s;
        }
        (offs, o)
    }

    /// Bytes of one expert.
    pub fn span_bytes(&self) -> u64 {
        self.part_sizes().iter().sum()
    }
}

/// Where one expert's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertSpan {
    /// Shard index.
    pub shard: usize,
    /// Absolute `(start, len)` of each part in canonical order.
    pub parts: Vec<(u64, u64)>,
}

impl ExpertSpan {
    /// True when the parts follow each other with no gap, so one read gets the whole expert.
    pub fn is_contiguous(&self) -> bool {
        self.parts.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0)
    }

    /// Absolute start of the first part.
    pub fn start(&self) -> u64 {
        self.parts.first().map(|p| p.0).unwrap_or(0)
    }

    /// Total bytes.
    pub fn len(&self) -> u64 {
        self.parts.iter().map(|p| p.1).sum()
    }

    /// True for an expert with no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Spans of every routed expert of every MoE layer.
#[derive(Debug, Clone)]
pub struct ExpertIndex {
    /// The shared layout.
    pub layout: ExpertLayout,
    /// `spans[layer]` is empty for non-MoE layers, else one span per expert.
    pub spans: Vec<Vec<ExpertSpan>>,
}

/// K3's expert tensor name.
pub fn k3_expert_name(inv: &Inventory, layer: usize, expert: usize, part: &str) -> String {
    inv.layer_name(layer, &format!("block_sparse_moe.experts.{expert}.{part}"))
}

impl ExpertIndex {
    /// Derives K3's expert spans from the inventory, checking every part against the config.
    pub fn derive_k3(inv: &Inventory, cfg: &K3Config) -> Result<Self> {
        let layers: Vec<usize> = cfg.moe_layers().collect();
        Self::derive(
            inv,
            cfg.num_layers(),
            &layers,
            cfg.text().num_experts,
            ExpertLayout::k3(cfg),
            |l, e, p| k3_expert_name(inv, l, e, K3_EXPERT_PARTS[p]),
        )
    }

    /// Derives spans for any MoE naming: `name(layer, expert, part_index)`.
    pub fn derive(
        inv: &Inventory,
        num_layers: usize,
        moe_layers: &[usize],
        num_experts: usize,
        layout: ExpertLayout,
        name: impl Fn(usize, usize, usize) -> String,
    ) -> Result<Self> {
        let mut spans = vec![Vec::new(); num_layers];
        for &l in moe_layers {
            let mut layer = Vec::with_capacity(num_experts);
            for e in 0..num_experts {
                let mut parts = Vec::with_capacity(layout.part_shapes.len());
                let mut shard = None;
                for (p, shape) in layout.part_shapes.iter().enumerate() {
                    let n = name(l, e, p);
                    let t = inv.get(&n).ok_or_else(|| Error::Checkpoint {
                        dir: inv.dir.clone(),
                        msg: format!("expert part `{n}` is missing (layer {l}, expert {e})"),
                    })?;
                    if t.dtype != Dtype::U8 || t.shape != shape.as_slice() {
                        return Err(Error::Tensor {
                            name: n,
                            msg: format!(
                                "expected U8 {shape:?} from the config, found {} {:?}",
                                t.dtype, t.shape
                            ),
                        });
                    }
                    if *shard.get_or_insert(t.shard) != t.shard {
                        return Err(Error::Checkpoint {
                            dir: inv.dir.clone(),
                            msg: format!("expert {e} of layer {l} is split across shards"),
                        });
                    }
                    parts.push((t.start, t.len()));
                }
                layer.push(ExpertSpan {
                    shard: shard.unwrap_or(0),
                    parts,
                });
            }
            spans[l] = layer;
        }
        Ok(ExpertIndex { layout, spans })
    }

    /// The span of one expert.
    pub fn span(&self, layer: usize, expert: usize) -> Option<&ExpertSpan> {
        self.spans.get(layer)?.get(expert)
    }

    /// Number of experts whose six parts are one contiguous read.
    pub fn contiguous_count(&self) -> usize {
        self.spans
            .iter()
            .flatten()
            .filter(|s| s.is_contiguous())
            .count()
    }

    /// Number of experts in total.
    pub fn count(&self) -> usize {
        self.spans.iter().map(|l| l.len()).sum()
    }
}
