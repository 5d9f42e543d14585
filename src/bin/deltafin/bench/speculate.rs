//! `bench forward --speculate`: ms per emitted token with speculative decoding on and off,
//! interleaved (off-on, then on-off, alternately), on a repetitive and a non-repetitive prompt (or on text
//! prompts with `--text`), with tokens per pass and acceptance. Every "on" run must emit the
//! same ids as the "off" run next to it, or the bench fails. With `--cold-spine` every pass
//! starts with the model's files dropped from the page cache, so the streamed spine is read
//! from the disk each pass, as on a machine smaller than the model. `--oracle-drafts` also
//! times the plain run's own continuation as drafts: the bound when every draft is right.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use deltafin::measure::disk::ColdFiles;
use deltafin::measure::Stats;

use deltafin::drafters::DraftHead;
use deltafin::runtime::generate::{Drafter, Generation, NgramDrafter, Speculation};
use deltafin::Model;
use deltafin::{Error, GenerateOptions, Generator, Result};

/// Settings of the speculation bench.
pub struct SpecBenchOptions {
    /// Tokens decoded per run.
    pub decode: usize,
    /// Timed pairs (off, on) per prompt.
    pub runs: usize,
    /// The speculation measured against off.
    pub spec: Speculation,
    /// Named prompts (ids).
    pub prompts: Vec<(String, Vec<u32>)>,
    /// Drop the model's files from the page cache at each pass.
    pub cold: bool,
    /// Also time the plain run's own continuation as drafts (every draft right): the bound.
    pub oracle: bool,
    /// Draft with this head (else the n-gram drafter).
    pub head: Option<DraftHead>,
}

/// The two synthetic prompts: a period-8 cycle of ids, and pseudo-random ids.
pub fn synthetic_prompts(vocab: u32, len: usize) -> Vec<(String, Vec<u32>)> {
    let cycle: Vec<u32> = (0..len as u32).map(|i| (i % 8) * 37 % vocab + 3).collect();
    let random: Vec<u32> = (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) % vocab)
        .collect();
    vec![
        ("repetitive".into(), cycle),
        ("non_repetitive".into(), random),
    ]
}

fn run_once(
    m: &dyn Model,
    prompt: &[u32],
    decode: usize,
    spec: Speculation,
    head: Option<&DraftHead>,
) -> Result<Generation> {
    let opts = GenerateOptions {
        max_new: decode,
        stop_ids: vec![],
        speculation: spec,
    };
    let mut drafter: Box<dyn Drafter> = match head {
        Some(h) => h.drafter(m.new_state().layers.len()),
        None => Box::new(NgramDrafter::default()),
    };
    decode_with(m, prompt, &opts, &mut *drafter)
}

/// Greedy decoding of `prompt` with `drafter`.
fn decode_with(
    m: &dyn Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    drafter: &mut dyn Drafter,
) -> Result<Generation> {
    let no = AtomicBool::new(false);
    let mut greedy = |l: &[f32]| deltafin::runtime::generate::argmax(l);
    Generator::new(m).generate_drafted(
        &mut m.new_state(),
        prompt,
        opts,
        &no,
        &mut greedy,
        drafter,
        |_| {},
    )
}

/// Proposes the plain run's own continuation: every draft right. Not a real drafter: it bounds
/// what the verify pass gives when drafts are accepted (the pass economics alone).
struct Oracle(Vec<u32>);

impl Drafter for Oracle {
    fn propose(&mut self, context: &[u32], k: usize) -> Vec<u32> {
        self.0.iter().skip(context.len()).take(k).copied().collect()
    }
}

fn run_oracle(m: &dyn Model, prompt: &[u32], off: &Generation, depth: usize) -> Result<Generation> {
    let opts = GenerateOptions {
        max_new: off.generated_ids.len(),
        stop_ids: vec![],
        speculation: Speculation {
            mode: deltafin::runtime::generate::SpecMode::Ngram,
            depth,
        },
    };
    let mut reference = prompt.to_vec();
    reference.extend(&off.generated_ids);
    decode_with(m, prompt, &opts, &mut Oracle(reference))
}

/// Runs the bench, one JSON line per run and one summary per prompt.
pub fn spec_bench(
    model: &mut dyn Model,
    root: &Path,
    o: &SpecBenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    if o.cold {
        ColdFiles::observe(model, root)?;
    }
    if !model.can_verify() {
        return Err(Error::Msg(
            "this model has no verify pass, so speculative decoding does not run on it".into(),
        ));
    }
    let r = model.spine_report();
    emit(serde_json::json!({"figure": "spec_setup",
        "spine_layers_streamed": r.as_ref().map_or(0, |r| r.layers_streamed),
        "spine_bytes_read_per_pass": r.as_ref().map_or(0, |r| r.bytes_read_per_token), "cold_spine": o.cold,
        "mode": o.spec.mode, "depth": o.spec.depth, "decode": o.decode,
        "drafter": o.head.as_ref().map_or("ngram", DraftHead::kind)}));
    for (name, prompt) in &o.prompts {
        run_once(model, prompt, o.decode.min(4), Speculation::OFF, None)?; // warm-up
        let (mut off_ms, mut on_ms, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let (mut oracle_ratios, mut oracle_tpp) = (Vec::<f64>::new(), 0.0);
        let (mut passes, mut emitted, mut drafted, mut accepted) = (0, 0, 0, 0);
        let mut verifies = 0;
        let mut rollback = 0;
        for run in 0..o.runs.max(1) {
            // ABBA order: odd runs measure "on" first, so neither side always runs second.
            let (off, on) = if run % 2 == 0 {
                let off = run_once(model, prompt, o.decode, Speculation::OFF, None)?;
                (
                    off,
                    run_once(model, prompt, o.decode, o.spec, o.head.as_ref())?,
                )
            } else {
                let on = run_once(model, prompt, o.decode, o.spec, o.head.as_ref())?;
                (
                    run_once(model, prompt, o.decode, Speculation::OFF, None)?,
                    on,
                )
            };
            if on.generated_ids != off.generated_ids {
                let at = on
                    .generated_ids
                    .iter()
                    .zip(&off.generated_ids)
                    .take_while(|(a, b)| a == b)
                    .count();
                return Err(Error::Msg(format!(
                    "prompt {name}, run {run}: speculation changed the output at token {at} \
                     (prompt {:?}; off {:?}, on {:?})",
                    prompt, off.generated_ids, on.generated_ids
                )));
            }
            let per = |g: &Generation| {
                g.decode_ms / g.generated_ids.len().saturating_sub(1).max(1) as f64
            };
            let (a, b) = (per(&off), per(&on));
            if o.oracle {
                let or = run_oracle(model, prompt, &off, o.spec.depth)?;
                if or.generated_ids != off.generated_ids {
                    return Err(Error::Msg(format!(
                        "prompt {name}: oracle drafts changed the output"
                    )));
                }
                emit(
                    serde_json::json!({"figure": "spec_oracle_run", "prompt": name, "run": run,
                    "off_ms_per_token": a, "oracle_ms_per_token": per(&or), "ratio": per(&or) / a,
                    "tokens_per_pass": or.spec.tokens_per_pass()}),
                );
                oracle_ratios.push(per(&or) / a);
                oracle_tpp = or.spec.tokens_per_pass();
            }
            emit(
                serde_json::json!({"figure": "spec_run", "prompt": name, "run": run,
                "off_ms_per_token": a, "on_ms_per_token": b, "ratio": b / a,
                "tokens_per_pass": on.spec.tokens_per_pass(), "drafted": on.spec.drafted,
                "accepted": on.spec.accepted, "identical": true}),
            );
            off_ms.push(a);
            on_ms.push(b);
            ratios.push(b / a);
            passes += on.spec.passes;
            emitted += on.spec.emitted;
            drafted += on.spec.drafted;
            accepted += on.spec.accepted;
            verifies += on.spec.verify_passes;
            rollback = rollback.max(on.spec.rollback_bytes);
        }
        let (f, n, q) = (Stats::of(off_ms), Stats::of(on_ms), Stats::of(ratios));
        emit(
            serde_json::json!({"figure": "spec_summary", "prompt": name, "runs": o.runs.max(1),
            "off_ms_per_token": {"median": f.median, "min": f.min, "max": f.max},
            "on_ms_per_token": {"median": n.median, "min": n.min, "max": n.max},
            "on_to_off_ratio": {"median": q.median, "min": q.min, "max": q.max},
            "tokens_per_pass": emitted as f64 / passes.max(1) as f64,
            "acceptance": accepted as f64 / drafted.max(1) as f64,
            "accepted_per_verify": accepted as f64 / verifies.max(1) as f64,
            "verify_passes": verifies,
            "drafted": drafted, "accepted": accepted, "rollback_bytes_max": rollback}),
        );
        if !oracle_ratios.is_empty() {
            let r = Stats::of(oracle_ratios);
            emit(
                serde_json::json!({"figure": "spec_oracle_summary", "prompt": name,
                "oracle_to_off_ratio": {"median": r.median, "min": r.min, "max": r.max},
                "tokens_per_pass": oracle_tpp}),
            );
        }
    }
    model.clear_observers();
    Ok(())
}
