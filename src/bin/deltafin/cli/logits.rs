//! `deltafin logits`: the logits of every prompt position, each MoE layer's routes per
//! position and a greedy continuation, as one JSON document, so another implementation run on
//! the same checkpoint (`scripts/reference_check.sh` runs mlx-lm) can be compared with this one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use deltafin::runtime::observe::RouteCollector;
use deltafin::runtime::observers::HiddenTap;

use super::store::{load_engine, StoreArgs};

/// Arguments of `logits`.
#[derive(Debug, Args)]
pub struct LogitsArgs {
    /// Model directory (default: the built-in K3-tiny).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    /// Greedy tokens to generate after the prompt (their logits and routes are recorded too).
    #[arg(long, default_value_t = 16)]
    pub generate: usize,
    /// Also report the hidden rows after these decoder layers (0-based, comma-separated) for
    /// every prompt position, as `prompt_hidden` (`{layer: [[values] per position]}`).
    #[arg(long, value_delimiter = ',')]
    pub hidden_layers: Vec<usize>,
    /// Write the JSON here (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Expert store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The first maximal index (the reference's `argmax`).
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Routes of one call as `{layer: [[expert ids, ascending] per position]}` (a prefill of
/// several chunks reports each layer once per chunk, in position order).
fn routes_json(c: &RouteCollector) -> serde_json::Value {
    let mut m: BTreeMap<usize, Vec<Vec<usize>>> = BTreeMap::new();
    for (layer, routes) in c.take() {
        m.entry(layer).or_default().extend(routes.iter().map(|r| {
            let mut e = r.experts.clone();
            e.sort_unstable();
            e
        }));
    }
    let m = m
        .into_iter()
        .map(|(l, rows)| (l.to_string(), serde_json::json!(rows)));
    serde_json::Value::Object(m.collect())
}

/// Runs `deltafin logits`.
pub fn run(a: &LogitsArgs) -> anyhow::Result<()> {
    let root = super::default_root(a.model_root.as_deref())?;
    let mut engine = load_engine(&root, &a.store, 0)?;
    let routes = Arc::new(RouteCollector::default());
    engine.model_mut().observe(routes.clone());
    let tap = Arc::new(HiddenTap::new(&a.hidden_layers));
    if !a.hidden_layers.is_empty() {
        engine.model_mut().observe(tap.clone());
    }
    let model = engine.model();
    let mut state = model.new_state();
    // Prompt: every position's logits `[T, V]`.
    let all = model.forward_all(&a.prompt_ids, &mut state)?;
    let prompt_logits: Vec<Vec<f32>> = all.to_vec2()?;
    let prompt_routes = routes_json(&routes);
    let hidden: serde_json::Map<String, serde_json::Value> = tap
        .take()
        .into_iter()
        .map(|t| {
            let rows: Vec<&[f32]> = t.rows.chunks(t.width.max(1)).collect();
            (t.layer.to_string(), serde_json::json!(rows))
        })
        .collect();
    let mut next = argmax(prompt_logits.last().context("empty prompt")?);
    let (mut greedy, mut gen_logits, mut gen_routes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..a.generate {
        greedy.push(next);
        let l: Vec<f32> = model.forward(&[next], &mut state)?.to_vec1()?;
        gen_routes.push(routes_json(&routes));
        next = argmax(&l);
        gen_logits.push(l);
    }
    let mut doc = serde_json::json!({
        "model_root": root.display().to_string(),
        "prompt_ids": a.prompt_ids,
        "prompt_logits": prompt_logits,
        "prompt_routes": prompt_routes,
        "greedy": greedy,
        "greedy_logits": gen_logits,
        "greedy_routes": gen_routes,
    });
    if !a.hidden_layers.is_empty() {
        doc["prompt_hidden"] = serde_json::Value::Object(hidden);
    }
    write_doc(a, &doc)
}

/// Writes the document `logits` prints.
fn write_doc(a: &LogitsArgs, doc: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string(doc)?;
    match &a.out {
        Some(p) => deltafin::fsio::atomic::write_atomic(p, text.as_bytes())
            .with_context(|| format!("writing {}", p.display()))?,
        None => println!("{text}"),
    }
    Ok(())
}
