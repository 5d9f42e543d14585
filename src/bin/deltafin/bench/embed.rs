//! `bench spine`'s embedding figure: the rows of a prompt read from `embed.bin` by a positioned
//! read per row (what the spine did before) and by copying from a read-only mapping (what it
//! does now), cold (page cache dropped) and warm, interleaved run by run, with the resident set
//! each leaves behind. The spine keeps the mapping because of these figures (README).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use super::Stats;
use deltafin::checkpoint::rng::Rng;
use deltafin::checkpoint::{Dtype, DtypeExt};
use deltafin::experts::drop_from_page_cache_all;
use deltafin::spine::layer::parse_header;
use deltafin::{Error, Result};

/// Rows per timed read (a long prompt's worth).
const ROWS: usize = 2048;

/// Times `ROWS` random rows of the embedding in `store/embed.bin` both ways, `runs` times.
pub fn embed_bench(
    store: &Path,
    runs: usize,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let path = store.join("embed.bin");
    let f = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
    let len = f.metadata().map_err(|e| Error::io(&path, e))?.len() as usize;
    let mut head = vec![0u8; 4096.min(len)];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(&path, e))?;
    let e = parse_header(&head, len, &path)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Msg(format!("{}: no embedding tensor", path.display())))?;
    let dtype = Dtype::parse(&e.dtype).ok_or_else(|| Error::Msg("embedding dtype".into()))?;
    let (rows, rb) = (e.shape[0], e.shape[1] * dtype.bytes() as usize);
    let mut rng = Rng::new(11);
    let ids: Vec<usize> = (0..ROWS).map(|_| rng.below(rows as u64) as usize).collect();
    // SAFETY: a read-only mapping of a file this benchmark does not write.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|err| Error::io(&path, err))?;
    let mut out = vec![0u8; ROWS * rb];
    let by_read = |out: &mut [u8]| -> Result<()> {
        for (o, &id) in out.chunks_mut(rb).zip(&ids) {
            f.read_exact_at(o, (e.offset + id * rb) as u64)
                .map_err(|err| Error::io(&path, err))?;
        }
        Ok(())
    };
    let by_map = |out: &mut [u8]| {
        for (o, &id) in out.chunks_mut(rb).zip(&ids) {
            let at = e.offset + id * rb;
            o.copy_from_slice(&map[at..at + rb]);
        }
    };
    let (mut cold_read, mut cold_map, mut warm_read, mut warm_map) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    for _ in 0..runs.max(1) {
        drop_from_page_cache_all(&path)?;
        let t = Instant::now();
        by_read(&mut out)?;
        cold_read.push(ms(t));
        let t = Instant::now();
        by_read(&mut out)?;
        warm_read.push(ms(t));
        drop_from_page_cache_all(&path)?;
        let t = Instant::now();
        by_map(&mut out);
        cold_map.push(ms(t));
        let t = Instant::now();
        by_map(&mut out);
        warm_map.push(ms(t));
    }
    let rss_mapped = deltafin::memory::rss().0;
    drop(map);
    let rss_unmapped = deltafin::memory::rss().0;
    let st = |v: Vec<f64>| {
        let s = Stats::of(v);
        serde_json::json!({"median": s.median, "min": s.min, "max": s.max})
    };
    emit(
        serde_json::json!({"figure": "embed_rows_ms", "rows": ROWS, "row_bytes": rb,
        "cold_pread": st(cold_read), "cold_mmap": st(cold_map),
        "warm_pread": st(warm_read), "warm_mmap": st(warm_map),
        "rss_of_mapped_rows_bytes": rss_mapped.saturating_sub(rss_unmapped)}),
    );
    Ok(())
}
