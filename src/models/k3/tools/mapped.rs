//! `bench spine`'s mapping figures. Pinned layers (`pinned_bench`): read into pooled buffers, as
//! the spine does, against mapped from the store, each then read once whole. The embedding
//! (`embed_bench`): the rows of a prompt read from `embed.bin` by a positioned
//! read per row (what the spine did before) and by copying from a read-only mapping (what it
//! does now), cold (page cache dropped) and warm, interleaved run by run, with the resident set
//! the mapped rows leave behind. A store whose embedding is under 1 GB (the K3-slice's is 8.5 MB
//! and sits inside the page cache's read-ahead) is measured on a stand-in of K3's embedding
//! shape instead: 163,840 rows of 7,168 BF16 values, 2.35 GB of random bytes (real blocks, not
//! holes) in the temp directory, removed afterwards.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use deltafin::checkpoint::rng::Rng;
use deltafin::checkpoint::DtypeExt;
use deltafin::experts::drop_from_page_cache_all;
use deltafin::measure::Stats;
use deltafin::spine::layer::parse_header;
use deltafin::{Error, Result};

/// Rows per timed read (a long prompt's worth).
const ROWS: usize = 2048;
/// K3's embedding: rows, and bytes per row (BF16).
const K3_ROWS: usize = 163_840;
const K3_ROW_BYTES: usize = 7168 * 2;

/// Times `ROWS` random rows of the embedding in `store/embed.bin` (or of a K3-size stand-in)
/// both ways, `runs` times.
pub fn embed_bench(store: &Path, runs: usize, emit: impl FnMut(serde_json::Value)) -> Result<()> {
    let path = store.join("embed.bin");
    let len = std::fs::metadata(&path)
        .map_err(|e| Error::io(&path, e))?
        .len();
    if len >= 1 << 30 {
        let (offset, rows, rb) = store_embedding(&path)?;
        return time_rows(&path, (offset, rows, rb), runs, "store", emit);
    }
    let tmp = std::env::temp_dir().join(format!("deltafin-embed-{}.bin", std::process::id()));
    let r = synthesise(&tmp)
        .and_then(|()| time_rows(&tmp, (0, K3_ROWS, K3_ROW_BYTES), runs, "k3_size", emit));
    std::fs::remove_file(&tmp).ok();
    r
}

/// A file of K3's embedding size filled with random bytes.
fn synthesise(path: &Path) -> Result<()> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut f = std::io::BufWriter::new(file);
    let mut rng = Rng::new(3);
    let mut row = vec![0u8; K3_ROW_BYTES];
    for _ in 0..K3_ROWS {
        for c in row.chunks_mut(8) {
            c.copy_from_slice(&rng.next_u64().to_le_bytes()[..c.len()]);
        }
        f.write_all(&row).map_err(|e| Error::io(path, e))?;
    }
    f.flush().map_err(|e| Error::io(path, e))?;
    f.get_ref().sync_all().map_err(|e| Error::io(path, e))
}

/// Where the embedding lies in a store's `embed.bin`: `(offset, rows, bytes per row)`.
fn store_embedding(path: &Path) -> Result<(usize, usize, usize)> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    let mut head = vec![0u8; 4096.min(len)];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(path, e))?;
    let e = parse_header(&head, len, path)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Msg(format!("{}: no embedding tensor", path.display())))?;
    Ok((e.offset, e.shape[0], e.shape[1] * e.dtype.bytes() as usize))
}

/// Times `ROWS` random rows (of `rows` rows of `rb` bytes at `offset`) read per row and copied
/// from a mapping, cold and warm, `runs` times.
fn time_rows(
    path: &Path,
    (offset, rows, rb): (usize, usize, usize),
    runs: usize,
    what: &str,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut rng = Rng::new(11);
    let ids: Vec<usize> = (0..ROWS).map(|_| rng.below(rows as u64) as usize).collect();
    // SAFETY: a read-only mapping of a file this benchmark does not write.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|err| Error::io(path, err))?;
    // As the spine maps it: random access, so a fault reads its own pages, not a read-ahead window.
    map.advise(memmap2::Advice::Random)
        .map_err(|err| Error::io(path, err))?;
    let mut out = vec![0u8; ROWS * rb];
    let by_read = |out: &mut [u8]| -> Result<()> {
        for (o, &id) in out.chunks_mut(rb).zip(&ids) {
            f.read_exact_at(o, (offset + id * rb) as u64)
                .map_err(|err| Error::io(path, err))?;
        }
        Ok(())
    };
    let by_map = |out: &mut [u8]| {
        // As the spine does: ask for every row first (the reads go out together), then copy.
        for &id in &ids {
            let _ = map.advise_range(memmap2::Advice::WillNeed, offset + id * rb, rb);
        }
        for (o, &id) in out.chunks_mut(rb).zip(&ids) {
            let at = offset + id * rb;
            o.copy_from_slice(&map[at..at + rb]);
        }
    };
    let (mut cold_read, mut cold_map, mut warm_read, mut warm_map) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let rss_before = deltafin::runtime::memory::rss().0;
    for _ in 0..runs.max(1) {
        drop_from_page_cache_all(path)?;
        let t = Instant::now();
        by_read(&mut out)?;
        cold_read.push(ms(t));
        let t = Instant::now();
        by_read(&mut out)?;
        warm_read.push(ms(t));
        drop_from_page_cache_all(path)?;
        let t = Instant::now();
        by_map(&mut out);
        cold_map.push(ms(t));
        let t = Instant::now();
        by_map(&mut out);
        warm_map.push(ms(t));
    }
    let rss_mapped = deltafin::runtime::memory::rss().0;
    drop(map);
    let st = |v: Vec<f64>| {
        let s = Stats::of(v);
        serde_json::json!({"median": s.median, "min": s.min, "max": s.max})
    };
    emit(
        serde_json::json!({"figure": "embed_rows_ms", "file": what, "file_rows": rows,
        "rows": ROWS, "row_bytes": rb,
        "cold_pread": st(cold_read), "cold_mmap": st(cold_map),
        "warm_pread": st(warm_read), "warm_mmap": st(warm_map),
        "rss_growth_with_mapping_bytes": rss_mapped.saturating_sub(rss_before)}),
    );
    Ok(())
}

/// Sums `bytes` as u64 words: a pass that reads every byte, as a layer's GEMVs do.
fn touch(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).fold(0u64, |a, w| {
        a.wrapping_add(u64::from_le_bytes([
            w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
        ]))
    })
}

/// Pinned layers: `n` store files `layer-NNN.bin` in `store` read into pooled buffers (what the
/// spine does) against mapped (`WillNeed`), each followed by one pass over every byte; cold and
/// warm (a second process on the same root finds the page cache warm), with the resident memory
/// each leaves.
pub fn pinned_bench(
    store: &Path,
    n: usize,
    runs: usize,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let paths: Vec<_> = (0..n)
        .map(|l| store.join(format!("layer-{l:03}.bin")))
        .collect();
    let pool = deltafin::fsio::BufPool::new(0);
    let by_read = || -> Result<(u64, Vec<deltafin::spine::layer::LayerData>)> {
        let mut held = Vec::new();
        let mut sum = 0u64;
        for p in &paths {
            let d = deltafin::spine::layer::read_file(p, &pool)?;
            sum = sum.wrapping_add(touch(d.raw()));
            held.push(d);
        }
        Ok((sum, held))
    };
    let by_map = || -> Result<(u64, Vec<deltafin::spine::layer::LayerData>)> {
        let mut held = Vec::new();
        let mut sum = 0u64;
        for p in &paths {
            // What the spine does for a pinned layer from a store.
            let d = deltafin::spine::layer::map_file(p)?;
            sum = sum.wrapping_add(touch(d.raw()));
            held.push(d);
        }
        Ok((sum, held))
    };
    let drop_all = || -> Result<()> {
        for p in &paths {
            drop_from_page_cache_all(p)?;
        }
        Ok(())
    };
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let (mut cr, mut cm, mut wr, mut wm, mut rss_r, mut rss_m) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for _ in 0..runs.max(1) {
        drop_all()?;
        let r0 = deltafin::runtime::memory::rss().0;
        let t = Instant::now();
        let (a, held) = by_read()?;
        cr.push(ms(t));
        rss_r.push(deltafin::runtime::memory::rss().0.saturating_sub(r0) as f64);
        drop(held);
        let t = Instant::now();
        std::hint::black_box(by_read()?);
        wr.push(ms(t));
        drop_all()?;
        let r0 = deltafin::runtime::memory::rss().0;
        let t = Instant::now();
        let (b, held) = by_map()?;
        cm.push(ms(t));
        rss_m.push(deltafin::runtime::memory::rss().0.saturating_sub(r0) as f64);
        drop(held);
        let t = Instant::now();
        std::hint::black_box(by_map()?);
        wm.push(ms(t));
        if a != b {
            return Err(Error::Msg(
                "pinned bench: mapped bytes differ from read bytes".into(),
            ));
        }
    }
    let bytes: u64 = paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let st = |v: Vec<f64>| {
        let s = Stats::of(v);
        serde_json::json!({"median": s.median, "min": s.min, "max": s.max})
    };
    emit(
        serde_json::json!({"figure": "pinned_layers_ms", "layers": n, "bytes": bytes,
        "cold_read": st(cr), "cold_mmap": st(cm), "warm_read": st(wr), "warm_mmap": st(wm),
        "rss_growth_read_bytes": st(rss_r), "rss_growth_mmap_bytes": st(rss_m)}),
    );
    Ok(())
}
