//! gpt-oss's batched pass (`Model::run_batch`, what the server's scheduler runs): one pass over
//! several sequences' rows (a prefill, decode steps, a verify pass) gives each sequence the
//! same logits, bit for bit, as running it alone, leaves each state as running alone would, and
//! reads each selected expert once for the batch (fewer expert bytes than the items alone).

use deltafin::experts::TieredOptions;
use deltafin::models::gpt_oss::fixture::{write_gpt_oss, GptOssShape};
use deltafin::models::gpt_oss::GptOssModel;
use deltafin::runtime::model::{BatchItem, Forward, Logits, Model};
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

#[test]
fn a_batched_pass_equals_each_sequence_alone_and_shares_expert_reads() {
    let d = tempfile::tempdir().unwrap();
    write_gpt_oss(d.path(), &GptOssShape::tiny(), 5, 2).unwrap();
    // Alone.
    let m = open(d.path());
    let (mut alone_states, next) = setup(&m);
    let before = m.bytes_read();
    let mut alone = Vec::new();
    for (s, (ids, logits, undo)) in alone_states.iter_mut().zip(&next) {
        let f = Forward {
            observer: None,
            cancel: None,
            logits: *logits,
            undo: *undo,
        };
        alone.push(Model::run(&m, ids, s, &f).unwrap().unwrap());
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
    let out = Model::run_batch(&m, &mut items, None).unwrap();
    let batch_bytes = m.bytes_read() - before;
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
    // Each distinct expert once per layer for the batch.
    assert!(
        batch_bytes < alone_bytes,
        "batch read {batch_bytes} expert bytes, alone {alone_bytes}"
    );
    println!("expert bytes: batch {batch_bytes}, alone {alone_bytes}");
}
