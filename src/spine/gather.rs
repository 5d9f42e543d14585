//! Layers gathered from the checkpoint shards into one pooled buffer (a checkpoint used without a
//! spine store): the layout and the reads. Each tensor sits at the same offset modulo
//! `IO_ALIGN` as in its shard, so the aligned middle of a streamed layer's tensors goes straight
//! into place with parallel `O_DIRECT` requests (`fsio::direct`): on the full-shape fixture the
//! buffered gather of 98 GB per token spent a core in the kernel (page-cache copies) and read at
//! 4.2 GB/s. Must not know what the tensors mean.

use std::sync::Arc;

use super::layer::{Entry, LayerData};
use super::ShardSpine;
use crate::checkpoint::TensorInfo;
use crate::fsio::direct::{read_requests, Request, IO_ALIGN, REQUEST};
use crate::fsio::BufPool;
use crate::Result;

/// Placement of a tensor whose shard offset is not 8-byte aligned (read buffered), and of every
/// tensor off Linux.
const TENSOR_ALIGN: usize = 64;

/// One tensor to gather: its name in the layer, and where it lies in the shards.
pub(super) struct Piece<'a> {
    /// Layer-relative name.
    pub name: String,
    /// Where its bytes are.
    pub info: &'a TensorInfo,
}

/// Offset for a tensor at shard offset `start` placed at or after `end`: on Linux (where reads
/// can be direct), congruent to `start` modulo `IO_ALIGN` when `start` is 8-byte aligned (every
/// element type stays aligned; the CPU kernels load unaligned); else, and on other platforms
/// (Metal binds tensors at buffer offsets and loads vectors), the next 64-byte boundary.
fn place(end: usize, start: u64) -> usize {
    if cfg!(target_os = "linux") && start.is_multiple_of(8) {
        let want = (start % IO_ALIGN as u64) as usize;
        end + (want + IO_ALIGN - end % IO_ALIGN) % IO_ALIGN
    } else {
        end.div_ceil(TENSOR_ALIGN) * TENSOR_ALIGN
    }
}

/// The layout every gather of these tensors gives (what the model binds to), and its length.
pub(super) fn layout(pieces: &[Piece]) -> (Vec<Entry>, usize) {
    let mut end = 0;
    let entries = pieces
        .iter()
        .map(|p| {
            let offset = place(end, p.info.start);
            end = offset + p.info.len() as usize;
            Entry {
                name: p.name.clone(),
                dtype: p.info.dtype,
                shape: p.info.shape.clone(),
                offset,
                len: p.info.len() as usize,
                checksum: 0,
            }
        })
        .collect();
    (entries, end)
}

/// Reads `pieces` into one buffer from `pool` (at least `cap` bytes when a new one is made):
/// with `direct`, each tensor's aligned middle by parallel `O_DIRECT` requests and its unaligned
/// ends by positioned reads; otherwise (or where the filesystem refuses) one positioned read each.
pub(super) fn gather(
    s: &ShardSpine,
    pieces: &[Piece],
    pool: &Arc<BufPool>,
    cap: usize,
    direct: bool,
) -> Result<LayerData> {
    let (entries, end) = layout(pieces);
    let mut buf = pool.take_sized(end, cap)?;
    let base = buf.as_ptr() as usize;
    // Per piece: its shard's direct and plain handles (and path) when its middle is read directly.
    let mut handles = Vec::with_capacity(pieces.len());
    for (p, e) in pieces.iter().zip(&entries) {
        let aligned = (base + e.offset) % IO_ALIGN == (p.info.start % IO_ALIGN as u64) as usize;
        handles.push(match direct && aligned && middle(p.info).is_some() {
            true => s
                .direct_file(p.info.shard)?
                .map(|d| {
                    let path = s.shard_path(p.info.shard);
                    Ok::<_, crate::Error>((d, s.file(p.info.shard)?, path))
                })
                .transpose()?,
            false => None,
        });
    }
    let mut reqs = Vec::new();
    let dsts = split_at_entries(&mut buf, &entries);
    for ((p, dst), h) in pieces.iter().zip(dsts).zip(&handles) {
        let t = p.info;
        let (Some((direct, buffered, path)), Some((a, b))) = (h, middle(t)) else {
            s.read_into(t, dst)?;
            continue;
        };
        let (head, rest) = dst.split_at_mut((a - t.start) as usize);
        let (mid, tail) = rest.split_at_mut((b - a) as usize);
        s.read_at(t.shard, head, t.start)?;
        s.read_at(t.shard, tail, b)?;
        for (k, dst) in mid.chunks_mut(REQUEST).enumerate() {
            reqs.push(Request {
                direct,
                buffered,
                path,
                off: a + (k * REQUEST) as u64,
                want: dst.len(),
                dst,
            });
        }
    }
    read_requests(reqs)?;
    Ok(LayerData::from_gathered(buf, entries))
}

/// The `IO_ALIGN`-aligned middle `[a, b)` of a tensor's shard bytes, when there is one.
fn middle(t: &TensorInfo) -> Option<(u64, u64)> {
    let al = IO_ALIGN as u64;
    let (a, b) = (t.start.div_ceil(al) * al, t.end / al * al);
    (a < b).then_some((a, b))
}

/// One mutable slice per entry (entries are in offset order and do not overlap).
fn split_at_entries<'a>(buf: &'a mut [u8], entries: &[Entry]) -> Vec<&'a mut [u8]> {
    let mut out = Vec::with_capacity(entries.len());
    let mut rest = buf;
    let mut at = 0;
    for e in entries {
        let (_, r) = std::mem::take(&mut rest).split_at_mut(e.offset - at);
        let (mine, r) = r.split_at_mut(e.len);
        out.push(mine);
        rest = r;
        at = e.offset + e.len;
    }
    out
}

/// Pieces for the full names `names` (stripped of `strip` in the layer) that `keep` accepts.
pub(super) fn pieces<'a>(
    s: &'a ShardSpine,
    names: &[String],
    strip: &str,
    keep: impl Fn(&[usize]) -> bool,
) -> Result<Vec<Piece<'a>>> {
    let mut out = Vec::new();
    for full in names {
        let info = s.info(full)?;
        if keep(&info.shape) {
            out.push(Piece {
                name: full.strip_prefix(strip).unwrap_or(full).to_string(),
                info,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Inventory;

    /// A shard whose tensors start at awkward offsets: not 8-aligned, no aligned middle, and one
    /// spanning several direct requests from an offset that is neither page- nor 64-aligned.
    fn shard(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
        let lens = [
            ("odd", 4097usize),
            ("tiny", 6),
            ("big", 3 * REQUEST + 5000),
            ("edge", 8192),
        ];
        let mut json = String::from("{");
        let (mut at, mut out) = (0usize, Vec::new());
        for (k, (name, len)) in lens.iter().enumerate() {
            let sep = if k == 0 { "" } else { "," };
            json += &format!(
                "{sep}\"{name}\":{{\"dtype\":\"U8\",\"shape\":[{len}],\"data_offsets\":[{at},{}]}}",
                at + len
            );
            let bytes: Vec<u8> = (0..*len)
                .map(|i| (i * 7 + k * 13 + i / 4096) as u8)
                .collect();
            out.push((name.to_string(), bytes));
            at += len;
        }
        json += "}";
        // Pad so that "big" starts 8 bytes past a 64-byte boundary (8-aligned: read directly).
        let big_at = 8 + json.len() + lens[0].1 + lens[1].1;
        json += &" ".repeat((72 - big_at % 64) % 64);
        let mut file = (json.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(json.as_bytes());
        for (_, b) in &out {
            file.extend_from_slice(b);
        }
        std::fs::write(dir.join("model.safetensors"), file).unwrap();
        out
    }

    #[test]
    fn direct_and_buffered_gathers_give_the_same_layout_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let want = shard(dir.path());
        let inv = Arc::new(Inventory::from_dir(dir.path()).unwrap());
        let s = ShardSpine::new(inv);
        let names: Vec<String> = want.iter().map(|(n, _)| n.clone()).collect();
        let pieces = pieces(&s, &names, "", |_| true).unwrap();
        let pool = BufPool::new(2);
        for direct in [false, true] {
            let g = gather(&s, &pieces, &pool, 0, direct).unwrap();
            assert_eq!(g.layout(), &layout(&pieces).0[..], "direct {direct}");
            for (name, bytes) in &want {
                let (got, _, _) = g.raw_tensor(name).unwrap();
                assert!(got == *bytes, "{name}, direct {direct}");
            }
        }
        let (entries, _) = layout(&pieces);
        assert!(pieces
            .iter()
            .any(|p| p.info.start % 64 == 8 && middle(p.info).is_some()));
        for (p, e) in pieces.iter().zip(&entries) {
            if cfg!(target_os = "linux") && p.info.start.is_multiple_of(8) {
                assert_eq!(
                    e.offset % IO_ALIGN,
                    (p.info.start % IO_ALIGN as u64) as usize
                );
            }
        }
    }
}
