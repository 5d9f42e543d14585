//! Lossless speculative decoding: verify passes equal single steps bit for bit, rollback keeps
//! any prefix exactly, and decoding with speculation emits exactly what plain decoding emits
//! (greedy and seeded sampling) on K3-nano, K3-tiny and the K3-slice.

mod common;

use std::sync::atomic::AtomicBool;

use candle::Device;
use deltafin::generate::sample::Sampler;
use deltafin::generate::{Drafter, SpecMode, Speculation};
use deltafin::model::state::LayerState;
use deltafin::{GenerateOptions, Generation, Generator, K3Model, SeqState};

/// Bitwise state equality (positions, KDA conv windows and matrices, MLA caches).
fn same_state(a: &SeqState, b: &SeqState, what: &str) {
    assert_eq!(a.pos, b.pos, "{what}: positions");
    for (l, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
        match (x, y) {
            (LayerState::Kda(x), LayerState::Kda(y)) => {
                assert!(x.s == y.s, "{what}: layer {l} KDA state differs");
                assert!(
                    x.conv == y.conv,
                    "{what}: layer {l} KDA conv window differs"
                );
            }
            (LayerState::Mla(x), LayerState::Mla(y)) => {
                assert!(
                    x.cache.rows() == y.cache.rows(),
                    "{what}: layer {l} MLA cache"
                );
            }
            _ => panic!("{what}: layer {l} kinds differ"),
        }
    }
}

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
    // A short context, and one past 1,024 positions (the MLA attention's second span).
    for n in [3usize, 1030] {
        let context: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % 400).collect();
        verify_equals_steps(&m, &context, &tokens, true);
    }
}

#[test]
fn verify_pass_equals_single_steps_on_the_slice() {
    let d = tempfile::tempdir().unwrap();
    deltafin::checkpoint::fixture::write_slice(d.path(), 4, 16, 3).unwrap();
    let m = K3Model::from_dir(d.path(), &Device::Cpu).unwrap();
    let tokens: Vec<u32> = (0..10).map(|i| (i * 53 + 7) % 500).collect();
    verify_equals_steps(&m, &[5, 9, 14], &tokens, false);
}

fn generate(
    m: &K3Model,
    prompt: &[u32],
    max_new: usize,
    spec: Speculation,
    sampler: Option<Sampler>,
) -> Generation {
    let opts = GenerateOptions {
        max_new,
        stop_ids: vec![],
        speculation: spec,
    };
    let no = AtomicBool::new(false);
    let mut s = sampler.unwrap_or_else(|| Sampler::new(0.0, 1.0, 0));
    Generator::new(m)
        .generate_with(
            &mut m.new_state(),
            prompt,
            &opts,
            &no,
            &mut |l: &[f32]| s.choose(l),
            |_| {},
        )
        .unwrap()
}

/// Proposes the reference continuation (plain decoding's output), with one draft in `every`
/// corrupted: partial acceptance at every depth.
struct Script {
    reference: Vec<u32>,
    every: usize,
    n: usize,
}

impl Drafter for Script {
    fn propose(&mut self, context: &[u32], k: usize) -> Vec<u32> {
        let at = context.len();
        let mut d: Vec<u32> = self.reference.iter().skip(at).take(k).copied().collect();
        for x in d.iter_mut() {
            self.n += 1;
            if self.n.is_multiple_of(self.every) {
                *x = (*x + 1) % 64;
            }
        }
        d
    }
}

fn scripted(m: &K3Model, prompt: &[u32], off: &Generation, every: usize) -> Generation {
    scripted_with(m, prompt, off, every, Sampler::new(0.0, 1.0, 0))
}

fn scripted_with(
    m: &K3Model,
    prompt: &[u32],
    off: &Generation,
    every: usize,
    mut sampler: Sampler,
) -> Generation {
    let opts = GenerateOptions {
        max_new: off.generated_ids.len(),
        stop_ids: vec![],
        speculation: NGRAM,
    };
    let mut reference = prompt.to_vec();
    reference.extend(&off.generated_ids);
    let mut d = Script {
        reference,
        every,
        n: 0,
    };
    let no = AtomicBool::new(false);
    Generator::new(m)
        .generate_drafted(
            &mut m.new_state(),
            prompt,
            &opts,
            &no,
            &mut |l: &[f32]| sampler.choose(l),
            &mut d,
            |_| {},
        )
        .unwrap()
}

const NGRAM: Speculation = Speculation {
    mode: SpecMode::Ngram,
    depth: 8,
};

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
    let (drafted, accepted) = greedy_identical(engine.model(), &prompts, 256, &[3]);
    eprintln!("K3-tiny, n-gram depth 8: {accepted} of {drafted} drafts accepted");
    assert!(accepted > 100, "{accepted} of {drafted} drafts");
}

#[test]
fn greedy_speculation_is_identical_on_the_slice() {
    let d = tempfile::tempdir().unwrap();
    deltafin::checkpoint::fixture::write_slice(d.path(), 2, 16, 5).unwrap();
    let m = K3Model::from_dir(d.path(), &Device::Cpu).unwrap();
    let prompts = vec![vec![3u32, 9, 3, 9, 3, 9], vec![11u32, 40, 77, 123, 301]];
    greedy_identical(&m, &prompts, 20, &[2]);
}

/// Seeded sampling with speculation reproduces itself and plain sampling's tokens; over many
/// seeds the token frequencies match plain sampling's (chi-square below the 0.1% critical
/// value). Drafts: the greedy continuation (independent of the seed), and the n-gram drafter.
#[test]
fn sampled_speculation_keeps_the_distribution() {
    let dir = deltafin::assets::k3_tiny().unwrap();
    let engine = deltafin::Engine::open(&dir, &Default::default()).unwrap();
    let m = engine.model();
    let prompt = engine
        .tokenizer()
        .encode_ordinary("It is a truth universally acknowledged, that a single man");
    let vocab = m.config().text().vocab_size;
    let (mut on_counts, mut off_counts) = (vec![0f64; vocab], vec![0f64; vocab]);
    let mut accepted = 0;
    let greedy = generate(m, &prompt, 12, Speculation::OFF, None);
    for seed in 0..150u64 {
        let s = || Sampler::new(0.7, 1.0, seed);
        let on = scripted_with(m, &prompt, &greedy, 1000, s());
        let again = scripted_with(m, &prompt, &greedy, 1000, s());
        assert_eq!(
            on.generated_ids, again.generated_ids,
            "seed {seed} reproducible"
        );
        let ngram = generate(m, &prompt, 12, NGRAM, Some(s()));
        let off = generate(m, &prompt, 12, Speculation::OFF, Some(s()));
        assert_eq!(
            ngram.generated_ids, off.generated_ids,
            "seed {seed}: n-gram vs off"
        );
        accepted += on.spec.accepted;
        for &t in &on.generated_ids {
            on_counts[t as usize] += 1.0;
        }
        for &t in &off.generated_ids {
            off_counts[t as usize] += 1.0;
        }
    }
    assert!(accepted > 20, "sampling accepted only {accepted} drafts");
    // Two-sample chi-square over the tokens seen (bins with fewer than 5 pooled).
    let (mut chi, mut bins, mut rest) = (0.0, 0usize, (0.0, 0.0));
    for (a, b) in on_counts.iter().zip(&off_counts) {
        if a + b >= 10.0 {
            chi += (a - b) * (a - b) / (a + b);
            bins += 1;
        } else {
            rest = (rest.0 + a, rest.1 + b);
        }
    }
    if rest.0 + rest.1 > 0.0 {
        chi += (rest.0 - rest.1).powi(2) / (rest.0 + rest.1);
        bins += 1;
    }
    // Wilson–Hilferty: the 99.9% point of chi-square with `df` degrees of freedom.
    let df = (bins - 1).max(1) as f64;
    let crit = df * (1.0 - 2.0 / (9.0 * df) + 3.09 * (2.0 / (9.0 * df)).sqrt()).powi(3);
    eprintln!("chi-square {chi:.2} over {bins} bins (critical {crit:.1}), {accepted} accepted");
    assert!(chi < crit, "chi-square {chi} ≥ {crit}");
}

/// A draft model that knows a text: it continues its input with what follows the input's last
/// 24 characters in the text (through text only, as a model with another tokenizer would).
struct Book(String);

impl deltafin::generate::TextModel for Book {
    fn continue_text(&mut self, text: &str, max_tokens: usize) -> String {
        let tail: String = {
            let c: Vec<char> = text.chars().collect();
            c[c.len().saturating_sub(24)..].iter().collect()
        };
        match self.0.rfind(&tail) {
            Some(i) => self.0[i + tail.len()..]
                .chars()
                .take(4 * max_tokens)
                .collect(),
            None => String::new(),
        }
    }
}

/// The draft-model plumbing: a text continuation is re-tokenised with K3's tokenizer into the
/// ids that follow the context, and generation with it emits plain decoding's ids.
#[test]
fn text_drafter_maps_through_text() {
    use deltafin::generate::{TextDrafter, TextModel};
    let dir = deltafin::assets::k3_tiny().unwrap();
    let engine = deltafin::Engine::open(&dir, &Default::default()).unwrap();
    let tok = std::sync::Arc::new(deltafin::tokenizer::Tokenizer::from_dir(&dir).unwrap());
    let m = engine.model();
    let prompt = tok.encode_ordinary("It is a truth universally acknowledged, that a single man");
    // Proposal = K3's tokens of the continuation text.
    let mut d = TextDrafter::new(
        Book("It is a truth universally acknowledged, that a single man in possession".into()),
        tok.clone(),
    );
    let got = d.propose(&prompt, 8);
    let whole = tok
        .encode_ordinary("It is a truth universally acknowledged, that a single man in possession");
    assert_eq!(
        got[..],
        whole[prompt.len()..(prompt.len() + 8).min(whole.len())]
    );
    assert!(TextDrafter::new(Book(String::new()), tok.clone())
        .propose(&prompt, 8)
        .is_empty());
    // End to end: the plain run's own text as the book; drafts accepted, output unchanged.
    let off = generate(m, &prompt, 64, Speculation::OFF, None);
    let mut all = prompt.clone();
    all.extend(&off.generated_ids);
    let mut book = Book(tok.decode(&all));
    assert!(!book.continue_text(&tok.decode(&prompt), 4).is_empty());
    let mut d = TextDrafter::new(book, tok.clone());
    let opts = GenerateOptions {
        max_new: 64,
        stop_ids: vec![],
        speculation: NGRAM,
    };
    let no = AtomicBool::new(false);
    let on = Generator::new(m)
        .generate_drafted(
            &mut m.new_state(),
            &prompt,
            &opts,
            &no,
            &mut |l: &[f32]| deltafin::generate::argmax(l),
            &mut d,
            |_| {},
        )
        .unwrap();
    assert_eq!(on.generated_ids, off.generated_ids);
    assert!(on.spec.accepted > 20, "{:?}", on.spec);
}

/// The rollback record's size: `(6·P + H)·4` bytes per verified row per KDA layer, 19.4 MiB at
/// K3's full shape (69 KDA layers, P = 12,288, H = 96), and what a pass really holds on K3-nano.
#[test]
fn rollback_bytes_per_row() {
    let full = deltafin::K3Config::from_json(
        &deltafin::checkpoint::fixture::full::k3_config().to_string(),
    )
    .unwrap();
    let per_row = deltafin::model::verify::bytes_per_row(&full);
    assert_eq!(per_row, 69 * 4 * (6 * 12_288 + 96));
    eprintln!(
        "K3: {per_row} bytes ({:.2} MiB) per verified row",
        per_row as f64 / (1 << 20) as f64
    );
    let m = K3Model::from_dir(&common::nano(), &Device::Cpu).unwrap();
    let mut st = m.new_state();
    m.forward(&[1, 2, 3], &mut st).unwrap();
    let (_, rb9) = m
        .verify(&[4, 5, 6, 7, 8, 9, 10, 11, 12], &mut st.clone(), None)
        .unwrap();
    let (_, rb1) = m.verify(&[4], &mut st.clone(), None).unwrap();
    // Eight more rows hold eight rows' worth (the pre-pass conv window is in both).
    let nano_row = deltafin::model::verify::bytes_per_row(m.config());
    assert_eq!(rb9.bytes() - rb1.bytes(), 8 * nano_row);
    assert_eq!((rb9.rows(), rb1.rows()), (9, 1));
}
