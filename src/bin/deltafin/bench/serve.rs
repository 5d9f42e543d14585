//! `bench serve`: B concurrent streams through the batch scheduler, for each B (1, 2, 4, 8 by
//! default), interleaved run by run: aggregate decode tokens/s, per-request ms per token
//! (median and p95 of the gaps between a request's tokens), and the spine and expert bytes
//! read per emitted token. Each B's throughput is given as a ratio to B = 1 in the same run,
//! beside the ratio the byte formula expects from B = 1's own figures: with S spine bytes per
//! pass and X expert bytes per token, one token costs S + X alone and (S + B·X)/B in a batch
//! of B, so the expected ratio is B·(S + X)/(S + B·X) (the union of experts grows about
//! linearly with B under flat routing). Also: the decode gaps of two running streams while a
//! new request's long prompt is prefilled beside them, against their gaps without it (what
//! interleaving the prefill costs the running decodes), and the prefill's own time.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use deltafin::engine::batch::{BatchOptions, Request, Scheduler, SeqEvent};
use deltafin::measure::disk::ColdFiles;
use deltafin::measure::Stats;
use deltafin::runtime::generate::Speculation;
use deltafin::{Engine, Error, GenerateOptions, Result};

/// Settings of the serve bench.
pub struct ServeBenchOptions {
    /// Concurrent streams to measure.
    pub batches: Vec<usize>,
    /// Prompt tokens per stream.
    pub prompt_len: usize,
    /// Tokens decoded per stream.
    pub decode: usize,
    /// Timed runs per batch size.
    pub runs: usize,
    /// Drop the model's files from the page cache at every pass.
    pub cold: bool,
    /// Prompt tokens of the newcomer in the interleave figure (0: skip it).
    pub interleave_prompt: usize,
    /// Prompt tokens per pass beside the decode rows.
    pub prefill_tokens: usize,
    /// Prompt ids are drawn below this (None: the vocabulary).
    pub id_max: Option<u32>,
}

/// One batch run's figures.
struct RunFig {
    tok_s: f64,
    gaps_ms: Vec<f64>,
    spine_per_token: f64,
    expert_per_token: f64,
    /// Decode tokens in the window.
    emitted: usize,
}

fn expert_bytes(e: &Engine) -> u64 {
    e.model().expert_stats().map_or(0, |s| {
        s.home_bytes + s.disk_bytes + s.shard_bytes + s.hub_bytes
    })
}

/// A prompt of `len` ids below `vocab`, different for each seed (a hash, not a pattern the
/// n-gram drafter or the router could share across streams).
fn prompt(vocab: u32, len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            let mut x = (i as u64) << 32 | seed as u64;
            x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 29;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            ((x >> 32) % vocab as u64) as u32
        })
        .collect()
}

fn vocab_of(e: &Engine, o: &ServeBenchOptions) -> u32 {
    let v = e.model().vocab_size() as u32;
    o.id_max.map_or(v, |m| m.clamp(1, v))
}

/// Token arrival times per stream.
type Arrivals = Arc<Mutex<Vec<Vec<Instant>>>>;
/// Spine and expert bytes read when the first token came.
type AtFirst = Arc<Mutex<Option<(u64, u64)>>>;

fn request(ids: Vec<u32>, max_new: usize, on_event: deltafin::engine::batch::Listener) -> Request {
    Request {
        ids,
        marks: Vec::new(),
        opts: GenerateOptions {
            max_new,
            stop_ids: Vec::new(),
            speculation: Speculation::OFF,
        },
        choose: Box::new(|l: &[f32]| deltafin::runtime::generate::argmax(l)),
        on_event,
        cancel: Arc::new(AtomicBool::new(false)),
        drafter: None,
        prompt_logits: None,
    }
}

/// One run of `b` streams submitted together: their prompts share the first pass (the
/// prefill budget holds them all), so every first token comes from that pass and the window
/// from then to the last token is decode only, with the bytes read in it.
fn run_batch(
    e: &Arc<Engine>,
    s: &Scheduler,
    b: usize,
    o: &ServeBenchOptions,
    seed: u32,
) -> Result<RunFig> {
    let vocab = vocab_of(e, o);
    let arrivals: Arrivals = Arc::new(Mutex::new(vec![Vec::new(); b]));
    let at_first: AtFirst = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::channel();
    let mut reqs = Vec::new();
    for i in 0..b {
        let (arr, first, tx, eng) = (arrivals.clone(), at_first.clone(), tx.clone(), e.clone());
        let on_event: deltafin::engine::batch::Listener = Box::new(move |ev| match ev {
            SeqEvent::Token(_) => {
                if let Ok(mut a) = arr.lock() {
                    a[i].push(Instant::now());
                }
                if let Ok(mut f) = first.lock() {
                    f.get_or_insert_with(|| (eng.model().dense_bytes_read(), expert_bytes(&eng)));
                }
            }
            SeqEvent::Done(_) => {
                let _ = tx.send(Ok(()));
            }
            SeqEvent::Failed(m) => {
                let _ = tx.send(Err(m));
            }
        });
        let p = prompt(vocab, o.prompt_len, seed * 31 + i as u32);
        reqs.push(request(p, o.decode, on_event));
    }
    s.submit_all(reqs).map_err(|e| Error::Msg(e.to_string()))?;
    for _ in 0..b {
        rx.recv()
            .map_err(|e| Error::Msg(e.to_string()))?
            .map_err(Error::Msg)?;
    }
    let (sp1, ex1) = (e.model().dense_bytes_read(), expert_bytes(e));
    let arr = arrivals
        .lock()
        .map_err(|_| Error::Msg("poisoned".into()))?
        .clone();
    let (sp0, ex0) = at_first
        .lock()
        .ok()
        .and_then(|f| *f)
        .ok_or_else(|| Error::Msg("no token came".into()))?;
    let firsts: Vec<Instant> = arr.iter().filter_map(|a| a.first().copied()).collect();
    let (Some(&start), Some(&earliest)) = (firsts.iter().max(), firsts.iter().min()) else {
        return Err(Error::Msg("a stream got no token".into()));
    };
    if (start - earliest).as_secs_f64() > 0.0 && arr.iter().any(|a| a.len() > 1 && a[1] <= start) {
        return Err(Error::Msg(
            "the streams' prompts did not share the first pass: raise --prefill-tokens".into(),
        ));
    }
    let end = arr
        .iter()
        .filter_map(|a| a.last().copied())
        .max()
        .unwrap_or(start);
    let emitted: usize = arr.iter().map(|a| a.len().saturating_sub(1)).sum();
    let gaps: Vec<f64> = arr
        .iter()
        .flat_map(|a| a.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3))
        .collect();
    let secs = (end - start).as_secs_f64().max(1e-9);
    let per = |x: u64| x as f64 / emitted.max(1) as f64;
    Ok(RunFig {
        tok_s: emitted as f64 / secs,
        gaps_ms: gaps,
        spine_per_token: per(sp1 - sp0),
        expert_per_token: per(ex1 - ex0),
        emitted,
    })
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs the bench, one JSON line per run and one summary per batch size.
pub fn serve_bench(
    mut engine: Engine,
    root: &Path,
    o: &ServeBenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    if o.cold {
        ColdFiles::observe(engine.model_mut(), root)?;
    }
    let e = Arc::new(engine);
    let most = o.batches.iter().copied().max().unwrap_or(1).max(2);
    // Every stream's prompt in the first pass (`run_batch`).
    let prefill_tokens = o.prefill_tokens.max(most * o.prompt_len);
    let s = Scheduler::new(
        e.clone(),
        BatchOptions {
            max_batch: most,
            queue: most,
            prefill_tokens,
        },
    );
    // K3 streams spine layers; another family (gpt-oss) maps its dense weights: none streamed.
    // A streamed spine re-reads layers each pass; mapped dense weights (gpt-oss) are not.
    let (streamed, per_pass) = e
        .model()
        .spine_report()
        .map_or((0, 0), |r| (r.layers_streamed, r.bytes_read_per_token));
    emit(
        serde_json::json!({"figure": "serve_setup", "spine_layers_streamed": streamed,
        "spine_bytes_read_per_pass": per_pass, "cold": o.cold,
        "prompt_len": o.prompt_len, "decode": o.decode, "batches": o.batches}),
    );
    let warm = ServeBenchOptions {
        batches: vec![1],
        decode: 2,
        ..*o
    };
    run_batch(&e, &s, 1, &warm, 999)?; // warm-up
    let mut figs: Vec<Vec<RunFig>> = o.batches.iter().map(|_| Vec::new()).collect();
    let mut ratios: Vec<Vec<f64>> = o.batches.iter().map(|_| Vec::new()).collect();
    for run in 0..o.runs.max(1) {
        let mut base = None;
        for (k, &b) in o.batches.iter().enumerate() {
            let f = run_batch(&e, &s, b, o, run as u32 * 100 + k as u32)?;
            if b == 1 {
                base = Some(f.tok_s);
            }
            let ratio = base.map(|x| f.tok_s / x);
            if let Some(x) = ratio {
                ratios[k].push(x);
            }
            emit(
                serde_json::json!({"figure": "serve_run", "run": run, "batch": b,
                "aggregate_tokens_per_s": f.tok_s, "emitted": f.emitted,
                "ms_per_token_median": percentile(f.gaps_ms.clone(), 0.5),
                "ms_per_token_p95": percentile(f.gaps_ms.clone(), 0.95),
                "spine_bytes_per_token": f.spine_per_token,
                "expert_bytes_per_token": f.expert_per_token, "ratio_to_b1": ratio}),
            );
            figs[k].push(f);
        }
    }
    summarise(o, &figs, &ratios, &mut emit);
    drop(s);
    if o.interleave_prompt > 0 {
        interleave(&e, o, &mut emit)?;
    }
    Ok(())
}

fn summarise(
    o: &ServeBenchOptions,
    figs: &[Vec<RunFig>],
    ratios: &[Vec<f64>],
    emit: &mut impl FnMut(serde_json::Value),
) {
    let b1 = o.batches.iter().position(|&b| b == 1);
    let med = |v: Vec<f64>| Stats::of(v).median;
    // The formula's inputs: B = 1's spine bytes per token (one pass each) and expert bytes.
    let (s1, x1) = match b1 {
        Some(k) => (
            med(figs[k].iter().map(|f| f.spine_per_token).collect()),
            med(figs[k].iter().map(|f| f.expert_per_token).collect()),
        ),
        None => (f64::NAN, f64::NAN),
    };
    for (k, &b) in o.batches.iter().enumerate() {
        let f = &figs[k];
        let t = Stats::of(f.iter().map(|x| x.tok_s).collect());
        let gaps: Vec<f64> = f.iter().flat_map(|x| x.gaps_ms.clone()).collect();
        let r = (!ratios[k].is_empty()).then(|| Stats::of(ratios[k].clone()));
        let bf = b as f64;
        let expected = bf * (s1 + x1) / (s1 + bf * x1);
        // What the bytes this batch size actually read per token predict (the union of
        // experts saturates on a model with few experts, so it can beat the formula).
        let (sb, xb) = (
            med(f.iter().map(|x| x.spine_per_token).collect()),
            med(f.iter().map(|x| x.expert_per_token).collect()),
        );
        let from_bytes = (s1 + x1) / (sb + xb);
        emit(
            serde_json::json!({"figure": "serve_summary", "batch": b, "runs": f.len(),
            "aggregate_tokens_per_s": {"median": t.median, "min": t.min, "max": t.max},
            "ms_per_token": {"median": percentile(gaps.clone(), 0.5), "p95": percentile(gaps, 0.95)},
            "spine_bytes_per_token": sb, "expert_bytes_per_token": xb,
            "ratio_to_b1": r.map(|r| serde_json::json!({"median": r.median, "min": r.min, "max": r.max})),
            "expected_ratio_byte_formula": expected, "expected_ratio_measured_bytes": from_bytes}),
        );
    }
}

/// Two streams decode; a request with a long prompt arrives: the streams' gaps while it is
/// prefilled beside them, against their gaps before it came.
fn interleave(
    e: &Arc<Engine>,
    o: &ServeBenchOptions,
    emit: &mut impl FnMut(serde_json::Value),
) -> Result<()> {
    let s = Scheduler::new(
        e.clone(),
        BatchOptions {
            max_batch: 3,
            queue: 3,
            prefill_tokens: o.prefill_tokens,
        },
    );
    let vocab = vocab_of(e, o);
    let decode = o.decode.max(4) * 4;
    let runners: Vec<Vec<u32>> = (0..2)
        .map(|i| prompt(vocab, o.prompt_len, 7000 + i))
        .collect();
    let arr_run: Arrivals = Arc::new(Mutex::new(vec![Vec::new(); 2]));
    let (tx, rx) = mpsc::channel();
    let arrivals_of =
        |arr: Arrivals, i: usize, tx: mpsc::Sender<()>| -> deltafin::engine::batch::Listener {
            Box::new(move |ev| match ev {
                SeqEvent::Token(_) => {
                    if let Ok(mut a) = arr.lock() {
                        a[i].push(Instant::now());
                    }
                }
                _ => {
                    let _ = tx.send(());
                }
            })
        };
    let req = request;
    for (i, p) in runners.iter().enumerate() {
        s.submit(req(
            p.clone(),
            decode,
            arrivals_of(arr_run.clone(), i, tx.clone()),
        ))
        .map_err(|e| Error::Msg(e.to_string()))?;
    }
    // Let both decode a while, then the newcomer arrives.
    let wait_tokens = |n: usize| loop {
        let done = arr_run
            .lock()
            .map(|a| a.iter().all(|x| x.len() >= n))
            .unwrap_or(true);
        if done {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    wait_tokens(decode / 4);
    let arr_new: Arrivals = Arc::new(Mutex::new(vec![Vec::new(); 1]));
    let t_new = Instant::now();
    let newcomer = prompt(vocab, o.interleave_prompt, 9000);
    s.submit(req(
        newcomer,
        2,
        arrivals_of(arr_new.clone(), 0, tx.clone()),
    ))
    .map_err(|e| Error::Msg(e.to_string()))?;
    for _ in 0..3 {
        rx.recv().map_err(|e| Error::Msg(e.to_string()))?;
    }
    let first_new = arr_new
        .lock()
        .ok()
        .and_then(|a| a[0].first().copied())
        .unwrap_or(t_new);
    let a = arr_run
        .lock()
        .map_err(|_| Error::Msg("poisoned".into()))?
        .clone();
    let (mut before, mut during) = (Vec::new(), Vec::new());
    for x in &a {
        for w in x.windows(2).skip(1) {
            let g = (w[1] - w[0]).as_secs_f64() * 1e3;
            if w[1] <= t_new {
                before.push(g);
            } else if w[0] >= t_new && w[1] <= first_new {
                during.push(g);
            }
        }
    }
    let prefill_s = (first_new - t_new).as_secs_f64();
    emit(
        serde_json::json!({"figure": "serve_interleave", "newcomer_prompt": o.interleave_prompt,
        "prefill_tokens_per_pass": o.prefill_tokens,
        "decode_gap_ms_before": {"median": percentile(before.clone(), 0.5), "max": before.iter().cloned().fold(0.0, f64::max)},
        "decode_gap_ms_during_prefill": {"median": percentile(during.clone(), 0.5), "max": during.iter().cloned().fold(0.0, f64::max), "count": during.len()},
        "newcomer_prefill_s": prefill_s}),
    );
    Ok(())
}
