//! Lossless speculative decoding: verify passes equal single steps bit for bit, rollback keeps
//! any prefix exactly, and greedy decoding with speculation emits exactly what plain decoding
//! emits on K3-nano, K3-tiny and the K3-slice.

mod common;

use candle::Device;
use common::spec::{generate, same_state, scripted, NGRAM};
use deltafin::models::k3::K3Model;
use deltafin::runtime::generate::Speculation;
use deltafin::runtime::state::SeqState;

fn step(m: &K3Model, id: u32, st: &mut SeqState) -> Vec<f32> {
    m.forward(&[id], st).unwrap().to_vec1::<f32>().unwrap()
}

/// For k = 1..=8: a verify pass of k+1 tokens vs k+1 single steps (logits bit for bit), then
/// for every `keep` (or the first, middle and last with `all_keeps` false) the kept state equals
/// the stepped one and the next step agrees.
fn verify_equals_steps(m: &K3Model, context: &[u32], tokens: &[u32], all_keeps: bool) {
    let mut base = m.new_state();
    m.forward(context, &mut base).unwrap();
    for k in 1..=8usize {
        let ids = &tokens[..k + 1];
        let mut stepped = vec![base.clone()];
        let mut singles = Vec::new();
        for &id in ids {
            let mut s = stepped.last().unwrap().clone();
            singles.push(step(m, id, &mut s));
            stepped.push(s);
        }
        let mut v = base.clone();
        let (logits, rb) = m.verify(ids, &mut v, None).unwrap();
        let rows = logits.to_vec2::<f32>().unwrap();
        for (i, (a, b)) in rows.iter().zip(&singles).enumerate() {
            assert!(a == b, "k {k}: row {i} differs from a single step");
        }
        drop(rb);
        for (keep, want) in stepped.iter().enumerate().skip(1) {
            if !all_keeps && ![1, k / 2 + 1, k + 1].contains(&keep) {
                continue;
            }
            let mut v = base.clone();
            let (_, rb) = m.verify(ids, &mut v, None).unwrap();
            rb.keep(&mut v, keep).unwrap();
            same_state(&v, want, &format!("k {k} keep {keep}"));
            let next = tokens[k + 1];
            let mut w = want.clone();
            assert!(
                step(m, next, &mut v) == step(m, next, &mut w),
                "k {k} keep {keep}: the next step differs"
            );
        }
    }
}

#[test]
fn verify_pass_equals_single_steps_on_nano() {
    let m = K3Model::from_dir(&common::nano(), &Device::Cpu).unwrap();
    let tokens: Vec<u32> = (0..10).map(|i| (i * 53 + 7) % 400).collect();
    // A short context, and one whose verified rows cross 1,024 positions (the MLA attention's
    // span boundary).
    for n in [3usize, 1020] {
        let context: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % 400).collect();
        verify_equals_steps(&m, &context, &tokens, true);
    }
}

#[test]
fn verify_pass_equals_single_steps_on_the_slice() {
    let d = tempfile::tempdir().unwrap();
    deltafin::models::k3::fixture::write_slice(d.path(), 4, 16, 3).unwrap();
    let m = K3Model::from_dir(d.path(), &Device::Cpu).unwrap();
    let tokens: Vec<u32> = (0..10).map(|i| (i * 53 + 7) % 500).collect();
    verify_equals_steps(&m, &[5, 9, 14], &tokens, false);
}

/// Greedy ids with speculation (n-gram at depth 8, and auto) equal plain decoding; returns
/// (drafted, accepted) summed over the prompts.
fn greedy_identical(
    m: &K3Model,
    prompts: &[Vec<u32>],
    max_new: usize,
    scripts: &[usize],
) -> (usize, usize) {
    let (mut drafted, mut accepted) = (0, 0);
    for (i, p) in prompts.iter().enumerate() {
        let off = generate(m, p, max_new, Speculation::OFF, None);
        for spec in [NGRAM, Speculation::default()] {
            let on = generate(m, p, max_new, spec, None);
            assert_eq!(on.generated_ids, off.generated_ids, "prompt {i}, {spec:?}");
            if spec == NGRAM {
                drafted += on.spec.drafted;
                accepted += on.spec.accepted;
            }
        }
        for &every in scripts {
            let on = scripted(m, p, &off, every);
            assert_eq!(
                on.generated_ids, off.generated_ids,
                "prompt {i}, scripted 1/{every}"
            );
            assert!(on.spec.accepted > 0, "prompt {i}: scripted drafts accepted");
        }
        assert_eq!(off.spec.drafted, 0);
    }
    (drafted, accepted)
}

#[test]
fn greedy_speculation_is_identical_on_nano() {
    let m = K3Model::from_dir(&common::nano(), &Device::Cpu).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|s| match s % 2 {
            0 => (0..12).map(|i| [5, 17, 33][i % 3] + s).collect(),
            _ => (0..12).map(|i| (i as u32 * 41 + 7 * s) % 400).collect(),
        })
        .collect();
    greedy_identical(&m, &prompts, 96, &[2, 5, 1000]);
}

#[test]
fn greedy_speculation_is_identical_on_k3_tiny() {
    let dir = deltafin::assets::k3_tiny().unwrap();
    let engine = deltafin::Engine::open(&dir, &Default::default()).unwrap();
    let k3 = K3Model::open(&dir, &candle::Device::Cpu, &Default::default()).unwrap();
    let tok = engine.tokenizer();
    let texts = [
        "It is a truth universally acknowledged, that a single man",
        "And God said, Let there be light: and there was light.",
        "To be, or not to be, that is the question:",
        "the the the the the the the the",
        "one two three, one two three, one two three, one two",
        "Elizabeth",
        "Mr. Darcy said",
        "In the beginning",
        "KING LEAR.",
        "Chapter 1",
        "abc abc abc abc abc",
        "She was",
        "Thou shalt not",
        "O Romeo, Romeo! wherefore art thou",
        "It was a dark",
        "The Lord is my shepherd;",
        "Emma Woodhouse, handsome, clever, and rich,",
        "1 2 3 4 5 6 7 8",
        "yes no yes no yes no yes no",
        "Captain Wentworth",
    ];
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode_ordinary(t)).collect();
    let (drafted, accepted) = greedy_identical(&k3, &prompts, 256, &[3]);
    eprintln!("K3-tiny, n-gram depth 8: {accepted} of {drafted} drafts accepted");
    assert!(accepted > 100, "{accepted} of {drafted} drafts");
}

#[test]
fn greedy_speculation_is_identical_on_the_slice() {
    let d = tempfile::tempdir().unwrap();
    deltafin::models::k3::fixture::write_slice(d.path(), 2, 16, 5).unwrap();
    let m = K3Model::from_dir(d.path(), &Device::Cpu).unwrap();
    let prompts = vec![vec![3u32, 9, 3, 9, 3, 9], vec![11u32, 40, 77, 123, 301]];
    greedy_identical(&m, &prompts, 20, &[2]);
}
