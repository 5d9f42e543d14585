//! Routed-expert spans: where each expert's parts lie in the shards, and whether one read gets
//! them all. Knows no model: the layout (shapes, dtypes, order) and the tensor names come from
//! the caller, one tensor per expert (`derive`, K3, Qwen3-MoE; an expert may straddle two shards) or each layer's experts stacked
//! (`derive_stacked`, gpt-oss).

use super::header::Dtype;
use super::inventory::Inventory;
use crate::{Error, Result};

/// Shapes and dtypes of an expert's parts, in canonical order (the order of the bytes an
/// `ExpertProvider` hands over).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Shape of each part as one expert holds it (MXFP4 packed: `[rows, cols/2]`, scales:
    /// `[rows, cols/group]`, a bias: `[n]`). A tensor with the same leading dimension and
    /// element count also matches (gpt-oss stores packed codes as `[rows, cols/32, 16]`).
    pub part_shapes: Vec<Vec<usize>>,
    /// Dtype of each part.
    pub part_dtypes: Vec<Dtype>,
}

impl ExpertLayout {
    /// The layout of MXFP4 matrices `(rows, cols)` with the given group size (packed codes, then
    /// scales, for each matrix in turn).
    pub fn mxfp4(matrices: &[(usize, usize)], group: usize) -> Self {
        let mut part_shapes = Vec::new();
        for &(r, c) in matrices {
            part_shapes.push(vec![r, c / 2]);
            part_shapes.push(vec![r, c / group]);
        }
        let part_dtypes = vec![Dtype::U8; part_shapes.len()];
        ExpertLayout {
            part_shapes,
            part_dtypes,
        }
    }

    /// A layout from `(shape, dtype)` parts.
    pub fn from_parts(parts: Vec<(Vec<usize>, Dtype)>) -> Self {
        let (part_shapes, part_dtypes) = parts.into_iter().unzip();
        ExpertLayout {
            part_shapes,
            part_dtypes,
        }
    }

    /// Byte size of each part.
    pub fn part_sizes(&self) -> Vec<u64> {
        self.part_shapes
            .iter()
            .zip(&self.part_dtypes)
            .map(|(s, d)| (s.iter().product::<usize>() * d.bitsize() / 8) as u64)
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

    /// Whether a stored tensor of `shape` holds part `p` of one expert.
    fn matches(&self, p: usize, shape: &[usize]) -> bool {
        let want = &self.part_shapes[p];
        let numel = |s: &[usize]| s.iter().product::<usize>();
        shape == want.as_slice()
            || (shape.first() == want.first() && numel(shape) == numel(want) && want.len() > 1)
    }
}

/// Where one expert's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertSpan {
    /// Shard index (of every part, unless `part_shards` says otherwise).
    pub shard: usize,
    /// Absolute `(start, len)` of each part in canonical order.
    pub parts: Vec<(u64, u64)>,
    /// The shard of each part when they are not all in `shard` (empty otherwise): a checkpoint
    /// with one tensor per expert and part is cut into shards at tensor boundaries, so a shard
    /// boundary may fall inside an expert (Qwen3-MoE's hub files).
    pub part_shards: Vec<usize>,
}

impl ExpertSpan {
    /// True when the parts follow each other with no gap in one shard, so one read gets the
    /// whole expert.
    pub fn is_contiguous(&self) -> bool {
        !self.is_split() && self.parts.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0)
    }

    /// True when the parts lie in more than one shard.
    pub fn is_split(&self) -> bool {
        self.part_shards.iter().any(|&s| s != self.shard)
    }

    /// The shard part `p` lies in.
    pub fn part_shard(&self, p: usize) -> usize {
        self.part_shards.get(p).copied().unwrap_or(self.shard)
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

impl ExpertIndex {
    /// Derives spans for a checkpoint with one tensor per expert and part:
    /// `name(layer, expert, part_index)`.
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
                let mut shards = Vec::with_capacity(layout.part_shapes.len());
                for p in 0..layout.part_shapes.len() {
                    let n = name(l, e, p);
                    let t = part_tensor(inv, &layout, &n, p, None, (l, e))?;
                    shards.push(t.shard);
                    parts.push((t.start, t.len()));
                }
                let shard = shards.first().copied().unwrap_or(0);
                if shards.iter().all(|&s| s == shard) {
                    shards.clear();
                }
                layer.push(ExpertSpan {
                    shard,
                    parts,
                    part_shards: shards,
                });
            }
            spans[l] = layer;
        }
        Ok(ExpertIndex { layout, spans })
    }

    /// Derives spans for a checkpoint that stacks each layer's experts in one tensor per part
    /// (`[experts, ..part shape]`, as gpt-oss stores `*_blocks`, `*_scales` and biases):
    /// `name(layer, part_index)`. Expert `e`'s part is the `e`-th slice, so its parts are not
    /// contiguous and a read takes one request per part.
    pub fn derive_stacked(
        inv: &Inventory,
        num_layers: usize,
        moe_layers: &[usize],
        num_experts: usize,
        layout: ExpertLayout,
        name: impl Fn(usize, usize) -> String,
    ) -> Result<Self> {
        let sizes = layout.part_sizes();
        let mut spans = vec![Vec::new(); num_layers];
        for &l in moe_layers {
            let mut starts = Vec::with_capacity(sizes.len());
            let mut shards = Vec::with_capacity(sizes.len());
            for p in 0..sizes.len() {
                let n = name(l, p);
                let t = part_tensor(inv, &layout, &n, p, Some(num_experts), (l, 0))?;
                shards.push(t.shard);
                starts.push(t.start);
            }
            let shard = shards.first().copied().unwrap_or(0);
            if shards.iter().all(|&s| s == shard) {
                shards.clear();
            }
            spans[l] = (0..num_experts as u64)
                .map(|e| ExpertSpan {
                    shard,
                    parts: starts
                        .iter()
                        .zip(&sizes)
                        .map(|(&s, &n)| (s + e * n, n))
                        .collect(),
                    part_shards: shards.clone(),
                })
                .collect();
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

    /// The MoE layers (those holding experts), in order.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.spans.len())
            .filter(|&l| !self.spans[l].is_empty())
            .collect()
    }

    /// Number of experts in total.
    pub fn count(&self) -> usize {
        self.spans.iter().map(|l| l.len()).sum()
    }
}

/// The stored tensor of part `p` (of `stacked` experts when given), checked against the layout.
fn part_tensor<'a>(
    inv: &'a Inventory,
    layout: &ExpertLayout,
    n: &str,
    p: usize,
    stacked: Option<usize>,
    (l, e): (usize, usize),
) -> Result<&'a super::inventory::TensorInfo> {
    let t = inv.get(n).ok_or_else(|| Error::Checkpoint {
        dir: inv.dir.clone(),
        msg: match stacked {
            Some(_) => format!("stacked expert part `{n}` is missing (layer {l})"),
            None => format!("expert part `{n}` is missing (layer {l}, expert {e})"),
        },
    })?;
    let (want, dtype) = (&layout.part_shapes[p], layout.part_dtypes[p]);
    let shape_ok = match stacked {
        Some(k) => t.shape.first() == Some(&k) && layout.matches(p, &t.shape[1..]),
        None => layout.matches(p, &t.shape),
    };
    if t.dtype != dtype || !shape_ok {
        let want = match stacked {
            Some(k) => format!("{dtype} [{k}, {}]", join(want)),
            None => format!("{dtype} {want:?}"),
        };
        return Err(Error::Tensor {
            name: n.to_string(),
            msg: format!(
                "expected {want} from the config, found {} {:?}",
                t.dtype, t.shape
            ),
        });
    }
    Ok(t)
}

fn join(s: &[usize]) -> String {
    s.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
