//! gpt-oss's batched pass (`Model::run_batch`, what the server's scheduler runs): one pass over
//! several sequences' rows (a prefill, decode steps, a verify pass) gives each sequence the
//! same logits, bit for bit, as running it alone, leaves each state as running alone would, and
//! reads each selected expert once for the batch: its expert bytes are exactly the distinct
//! experts its rows route to, layer by layer, where the items alone read each item's own. Two
//! checkpoint seeds (two routings, two shard splits).

use deltafin::experts::TieredOptions;
use deltafin::models::gpt_oss::fixture::{write_gpt_oss, GptOssShape};
use deltafin::models::gpt_oss::GptOssModel;
use deltafin::runtime::model::{BatchItem, Forward, Logits, Model};
use deltafin::runtime::observe::RouteCollector;
use deltafin::runtime::state::SeqState;

/// Every expert read counted: no RAM tier, no prefetch.
fn open(root: &std::path::Path) -> GptOssModel {
    let o = TieredOptions {
        ram_budget: 0,
        prefetch_previous: false,
        ..Default::default()
    };
    GptOssModel::open(root, &o).unwrap()
}

fn bits(t: &candle::Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Bit-identical, or a panic naming the first differing value.
fn same_bits(a: &candle::Tensor, b: &candle::Tensor, what: &str) {
    let (a, b) = (bits(a), bits(b));
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
        panic!(
            "{what}: value {i} of {} differs: {} vs {}",
            a.len(),
            f32::from_bits(a[i]),
            f32::from_bits(b[i])
        );
    }
}

fn ids(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 131 + seed * 53 + 7) % 500)
        .collect()
}

/// What a sequence feeds next: ids, which logits, whether it is a verify pass.
type Next = (Vec<u32>, Logits, bool);

/// Three sequences with different histories, and what each feeds next.
fn setup(m: &GptOssModel) -> (Vec<SeqState>, Vec<Next>) {
    let mut states = vec![m.new_state(), m.new_state(), m.new_state()];
    // Histories past the sliding window (8) for two of them.
    let f = Forward {
        observer: None,
        cancel: None,
        logits: Logits::Last,
        undo: false,
    };
    Model::run(m, &ids(11, 1), &mut states[1], &f).unwrap();
    Model::run(m, &ids(20, 2), &mut states[2], &f).unwrap();
    let next = vec![
        (ids(6, 3), Logits::All, false),  // a prefill
        (ids(1, 4), Logits::Last, false), // a decode step
        (ids(3, 5), Logits::Last, true),  // a verify pass (all rows, with its rollback)
    ];
    (states, next)
}

/// Distinct experts per layer in one call's routes, summed over the layers.
fn distinct_experts(routes: &RouteCollector) -> usize {
    let mut per_layer =
        std::collections::BTreeMap::<usize, std::collections::BTreeSet<usize>>::new();
    for (layer, rs) in routes.take() {
        per_layer
            .entry(layer)
            .or_default()
            .extend(rs.iter().flat_map(|r| r.experts.iter().copied()));
    }
    per_layer.values().map(|s| s.len()).sum()
}

#[test]
fn a_batched_pass_equals_each_sequence_alone_and_shares_expert_reads() {
    for (seed, shards) in [(5, 2), (11, 1)] {
        batched_equals_alone(seed, shards);
    }
}

fn batched_equals_alone(seed: u64, shards: usize) {
    let d = tempfile::tempdir().unwrap();
    write_gpt_oss(d.path(), &GptOssShape::tiny(), seed, shards).unwrap();
    let routes = RouteCollector::default();
    // Alone.
    let m = open(d.path());
    let (mut alone_states, next) = setup(&m);
    let before = m.bytes_read();
    let (mut alone, mut alone_distinct) = (Vec::new(), 0);
    for (s, (ids, logits, undo)) in alone_states.iter_mut().zip(&next) {
        let f = Forward {
            observer: Some(&routes),
            cancel: None,
            logits: *logits,
            undo: *undo,
        };
        alone.push(Model::run(&m, ids, s, &f).unwrap().unwrap());
        alone_distinct += distinct_experts(&routes);
    }
    let alone_bytes = m.bytes_read() - before;
    // Batched, on a fresh model with the same histories.
    let m = open(d.path());
    let (mut states, next) = setup(&m);
    let before = m.bytes_read();
    let mut items: Vec<BatchItem> = states
        .iter_mut()
        .zip(&next)
        .map(|(state, (ids, logits, undo))| BatchItem {
            ids,
            state,
            logits: *logits,
            undo: *undo,
        })
        .collect();
    let out = Model::run_batch(&m, &mut items, Some(&routes)).unwrap();
    let batch_bytes = m.bytes_read() - before;
    let batch_distinct = distinct_experts(&routes);
    assert_eq!(out.len(), 3);
    for (i, (a, b)) in alone.iter().zip(&out).enumerate() {
        assert_eq!(a.logits.dims(), b.logits.dims(), "item {i}");
        same_bits(&a.logits, &b.logits, &format!("item {i}"));
        assert_eq!(a.rollback.is_some(), b.rollback.is_some(), "item {i}");
    }
    for (i, (a, b)) in alone_states.iter().zip(&states).enumerate() {
        assert_eq!(a.pos, b.pos, "item {i}");
    }
    // The states continue alike: one more step on each, alone, from both.
    let f = Forward {
        observer: None,
        cancel: None,
        logits: Logits::Last,
        undo: false,
    };
    for (i, (a, b)) in alone_states.iter_mut().zip(states.iter_mut()).enumerate() {
        let la = Model::run(&m, &[9], a, &f).unwrap().unwrap();
        let lb = Model::run(&m, &[9], b, &f).unwrap().unwrap();
        same_bits(&la.logits, &lb.logits, &format!("item {i}, next step"));
    }
    // Each distinct expert once per layer for the batch: the bytes are the distinct experts
    // times one expert's bytes, the same expert size as alone's reads give.
    assert!(batch_distinct < alone_distinct, "seed {seed}");
    assert_eq!(alone_bytes % alone_distinct as u64, 0, "seed {seed}");
    let expert = alone_bytes / alone_distinct as u64;
    assert_eq!(
        batch_bytes,
        expert * batch_distinct as u64,
        "seed {seed}: batch read {batch_bytes} expert bytes for {batch_distinct} distinct \
         experts of {expert} bytes (alone {alone_bytes} for {alone_distinct})"
    );
    println!(
        "seed {seed}: expert bytes batch {batch_bytes} ({batch_distinct} distinct), alone \
         {alone_bytes} ({alone_distinct})"
    );
}
