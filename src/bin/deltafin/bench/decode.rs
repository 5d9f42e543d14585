//! `bench forward --floor` on a family that maps its dense weights (every registered family but
//! those with a spine store, e.g. gpt-oss, Qwen3-MoE), opened through its family under the
//! memory plan (a cgroup's limit is the plan's: run it inside one to stream the experts under a
//! budget smaller than the model). Per decode token: ms against the same run's floors (the
//! bytes a token must touch, every dense layer, lm_head, one embedding row and its routed
//! experts, at the memory read rate measured right before the run; and the expert bytes it
//! read from storage at the raw parallel `O_DIRECT` rate of expert-sized reads of the shards,
//! with the store's reader count, measured right before it), and
//! the expert bytes read from storage against the distinct routed-expert bytes of that token.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use deltafin::checkpoint::{ExpertIndex, ExpertSpan, Inventory};
use deltafin::runtime::generate::argmax;
use deltafin::runtime::load::LoadOptions;
use deltafin::runtime::observe::{Event, Observer};
use deltafin::Result;

use deltafin::measure::disk::raw_read_jobs;
use deltafin::measure::memory::stream_read;
use deltafin::measure::Stats;

/// Counts the distinct experts each pass routes to, summed over layers.
#[derive(Default)]
struct Routed(AtomicU64);

impl Observer for Routed {
    fn on(&self, _layer: usize, e: &Event<'_>) {
        if let Event::Routes(routes) = e {
            let mut set: Vec<usize> = routes.iter().flat_map(|r| r.experts.clone()).collect();
            set.sort_unstable();
            set.dedup();
            self.0.fetch_add(set.len() as u64, Ordering::Relaxed);
        }
    }
}

/// Bytes of the dense tensors one token touches, found without the family's names: every
/// tensor that holds no routed expert, except that of the `[vocab, …]` tables (the embedding and
/// an untied lm_head) one is read whole (the output projection) and the others one row each.
fn dense_bytes(inv: &Inventory, index: &ExpertIndex, vocab: usize) -> u64 {
    let expert_starts: std::collections::HashSet<(usize, u64)> = index
        .spans
        .iter()
        .flatten()
        .flat_map(|s| (0..s.parts.len()).map(move |p| (s.part_shard(p), s.parts[p].0)))
        .collect();
    let dense = inv
        .iter()
        .map(|(_, t)| t)
        .filter(|t| !expert_starts.contains(&(t.shard, t.start)));
    let (mut total, mut tables) = (0u64, Vec::new());
    for t in dense {
        match t.shape.first() == Some(&vocab) && t.shape.len() == 2 {
            true => tables.push(t.len()),
            false => total += t.len(),
        }
    }
    // The largest table is read whole; each other is one row.
    tables.sort_unstable();
    if let Some(head) = tables.pop() {
        total += head + tables.iter().map(|b| b / vocab as u64).sum::<u64>();
    }
    total
}

/// Raw parallel `O_DIRECT` read rate (bytes/s) of 48 experts' spans picked by `run` (each
/// part from its own file), with as many readers as the store uses: the storage floor's rate
/// for the same request shape.
fn disk_rate(inv: &Inventory, index: &ExpertIndex, readers: usize, run: usize) -> Result<f64> {
    let all: Vec<&ExpertSpan> = index.spans.iter().flatten().collect();
    if all.is_empty() {
        return Ok(f64::INFINITY);
    }
    let mut jobs = Vec::new();
    let mut total = 0u64;
    for k in 0..48usize {
        let span = all[(k * 7919 + run * 104_729) % all.len()];
        for (p, &(start, len)) in span.parts.iter().enumerate() {
            jobs.push((span.part_shard(p), vec![(start, len)]));
            total += len;
        }
    }
    let paths: Vec<_> = (0..inv.shards.len()).map(|i| inv.shard_path(i)).collect();
    let t0 = Instant::now();
    raw_read_jobs(&paths, &jobs, readers)?;
    Ok(total as f64 / t0.elapsed().as_secs_f64())
}

/// Runs the bench; `emit` gets one JSON line per run and a summary.
pub fn decode_floor(
    root: &Path,
    expert_ram: Option<u64>,
    prompt_len: usize,
    decode: usize,
    runs: usize,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let family = deltafin::models::family(root)?;
    let load = LoadOptions {
        max_batch: None,
        expert_ram,
        ..Default::default()
    };
    let mut report = |p: &deltafin::runtime::memory::MemoryPlan| eprintln!("{p}");
    let mut model = family.open(root, &candle::Device::Cpu, &load, &mut report)?;
    let routed = Arc::new(Routed::default());
    model.observe(routed.clone());
    let inv = Inventory::from_dir(root)?;
    let index = family.expert_index(root, &inv)?;
    let expert = index.layout.span_bytes();
    let dense = dense_bytes(&inv, &index, model.vocab_size());
    let vocab = model.vocab_size().min(4096) as u32;
    let prompt: Vec<u32> = (0..prompt_len.max(1) as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let words: Vec<u64> = (0..(1usize << 30) / 8).map(|i| i as u64).collect();
    let read = |m: &dyn deltafin::Model| m.expert_stats().unwrap_or_default().bytes_read();
    let n = decode.max(1);
    let mut rows: Vec<[f64; 5]> = Vec::new();
    for run in 0..runs.max(1) + 1 {
        let t0 = Instant::now();
        std::hint::black_box(stream_read(std::hint::black_box(&words)));
        let bw = (words.len() * 8) as f64 / t0.elapsed().as_secs_f64();
        let disk = disk_rate(&inv, &index, load.store.readers, run)?;
        let mut state = model.new_state();
        let mut logits = model.forward(&prompt, &mut state)?.to_vec1::<f32>()?;
        let (read0, routed0) = (read(model.as_ref()), routed.0.load(Ordering::Relaxed));
        let t1 = Instant::now();
        for _ in 0..n {
            let next = argmax(&logits);
            logits = model.forward(&[next], &mut state)?.to_vec1::<f32>()?;
        }
        let ms = t1.elapsed().as_secs_f64() * 1e3 / n as f64;
        let storage = (read(model.as_ref()) - read0) as f64 / n as f64;
        let distinct =
            (routed.0.load(Ordering::Relaxed) - routed0) as f64 * expert as f64 / n as f64;
        let floor_ms = ((dense as f64 + distinct) / bw + storage / disk) * 1e3;
        emit(
            serde_json::json!({"figure": "mapped_decode_run", "family": family.name(),
            "run": run, "warmup": run == 0, "ms_per_token": ms, "floor_ms": floor_ms,
            "memory_read_gbps": bw / 1e9, "disk_read_gbps": disk / 1e9,
            "expert_bytes_read_per_token": storage, "routed_expert_bytes_per_token": distinct}),
        );
        // The first run warms the page cache and the RAM tier; it is not counted.
        if run > 0 {
            rows.push([ms, ms / floor_ms, storage, distinct, storage / distinct]);
        }
    }
    let col = |k: usize| Stats::of(rows.iter().map(|r| r[k]).collect());
    let s = |k: usize| {
        let v = col(k);
        serde_json::json!({"median": v.median, "min": v.min, "max": v.max})
    };
    let plan = model.plan().map(|p| (p.limit, p.expert_ram));
    emit(
        serde_json::json!({"figure": "mapped_decode_floor", "family": family.name(),
        "layers": index.spans.len(), "prompt_len": prompt.len(), "decode": decode, "runs": runs,
        "dense_bytes_per_token": dense, "expert_bytes": expert,
        "memory_limit": plan.map(|p| p.0), "expert_ram": plan.map(|p| p.1),
        "ms_per_token": s(0), "wall_over_floor": s(1), "expert_bytes_read_per_token": s(2),
        "routed_expert_bytes_per_token": s(3), "read_over_routed": s(4)}),
    );
    Ok(())
}
