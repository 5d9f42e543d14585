//! Speculative decoding, continued: seeded sampling keeps plain sampling's tokens and
//! distribution, the draft-model plumbing, the rollback record's size, and the stop rules (the
//! state after a generation holds exactly what plain decoding's holds).

mod common;

use std::sync::atomic::AtomicBool;

use candle::Device;
use common::spec::{generate, same_state, scripted_with, Script, NGRAM};
use deltafin::models::k3::K3Model;
use deltafin::runtime::generate::sample::Sampler;
use deltafin::runtime::generate::{Drafter, Speculation};
use deltafin::{GenerateOptions, Generator};

/// Seeded sampling with speculation reproduces itself and plain sampling's tokens; over many
/// seeds the token frequencies match plain sampling's (chi-square below the 0.1% critical
/// value). Drafts: the greedy continuation (independent of the seed), and the n-gram drafter.
#[test]
fn sampled_speculation_keeps_the_distribution() {
    let dir = deltafin::assets::k3_tiny().unwrap();
    let engine = deltafin::Engine::open(&dir, &Default::default()).unwrap();
    let m = &deltafin::models::k3::K3Model::open(&dir, &candle::Device::Cpu, &Default::default())
        .unwrap();
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

impl deltafin::runtime::generate::TextModel for Book {
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
    use deltafin::runtime::generate::{TextDrafter, TextModel};
    let dir = deltafin::assets::k3_tiny().unwrap();
    let tok = std::sync::Arc::new(deltafin::tokenizer::Tokenizer::from_dir(&dir).unwrap());
    let m = &deltafin::models::k3::K3Model::open(&dir, &candle::Device::Cpu, &Default::default())
        .unwrap();
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
            &mut |l: &[f32]| deltafin::runtime::generate::argmax(l),
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
    let full = deltafin::models::k3::config::K3Config::from_json(
        &deltafin::models::k3::fixture::full::k3_config(
            deltafin::models::k3::fixture::full::K3_LAYERS,
        )
        .to_string(),
    )
    .unwrap();
    let per_row = deltafin::models::k3::verify::bytes_per_row(&full);
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
    let nano_row = deltafin::models::k3::verify::bytes_per_row(m.config());
    assert_eq!(rb9.bytes() - rb1.bytes(), 8 * nano_row);
    // One row: the pre-pass conv windows and that row's raw q, k, v (3·P per KDA layer).
    let cfg = m.config();
    let la = &cfg.text().linear_attn_config;
    let kda = deltafin::models::k3::verify::kda_layers(cfg);
    let fixed = deltafin::models::k3::verify::fixed_bytes(cfg);
    assert_eq!(
        rb1.bytes(),
        fixed + kda * 4 * 3 * la.num_heads * la.head_dim
    );
    assert_eq!((rb9.rows(), rb1.rows()), (9, 1));
}

/// Generation that ends inside a verify pass (a stop token, `max_new`, the context limit, a
/// cancellation from the token callback) emits plain decoding's tokens with its stop reason,
/// and leaves the state plain decoding leaves, bit for bit: every emitted token but the last.
#[test]
fn stops_inside_a_verify_pass_leave_plain_decodings_state() {
    let mut m = K3Model::from_dir(&common::nano(), &Device::Cpu).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 41 + 7) % 400).collect();
    let reference = generate(&m, &prompt, 40, Speculation::OFF, None);
    let stop = reference.generated_ids[9];
    // (max_new, stop ids, context limit, cancel after this many tokens)
    let cases = [
        (40, vec![stop], None, None),
        (13, vec![], None, None),
        (40, vec![], Some(prompt.len() + 17), None),
        (40, vec![], None, Some(7)),
    ];
    for (case, (max_new, stop_ids, limit, cancel_at)) in cases.into_iter().enumerate() {
        m.set_context_limit(limit.unwrap_or(usize::MAX));
        let run = |every: Option<usize>| {
            let opts = GenerateOptions {
                max_new,
                stop_ids: stop_ids.clone(),
                speculation: every.map_or(Speculation::OFF, |_| NGRAM),
            };
            let mut all = prompt.clone();
            all.extend(&reference.generated_ids);
            let mut d = Script {
                reference: all,
                every: every.unwrap_or(1000),
                n: 0,
            };
            let cancel = AtomicBool::new(false);
            let mut emitted = 0;
            let mut st = m.new_state();
            let g = Generator::new(&m)
                .generate_drafted(
                    &mut st,
                    &prompt,
                    &opts,
                    &cancel,
                    &mut |l: &[f32]| deltafin::runtime::generate::argmax(l),
                    &mut d,
                    |_| {
                        emitted += 1;
                        if Some(emitted) == cancel_at {
                            cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    },
                )
                .unwrap();
            (g, st)
        };
        let (off, s_off) = run(None);
        for every in [3usize, 1000] {
            let (on, s_on) = run(Some(every));
            assert_eq!(
                on.generated_ids, off.generated_ids,
                "case {case}, 1/{every}"
            );
            assert_eq!(on.stop, off.stop, "case {case}");
            assert!(on.spec.accepted > 0, "case {case}: no draft accepted");
            same_state(&s_on, &s_off, &format!("case {case}, 1/{every}"));
            assert_eq!(s_on.pos, prompt.len() + on.generated_ids.len() - 1);
        }
    }
}

/// The router trace holds one line per position the sequence kept, in order: a verify pass's
/// rejected drafts never reach it.
#[test]
fn router_trace_drops_rejected_drafts() {
    let m0 = K3Model::from_dir(&common::nano(), &Device::Cpu).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 41 + 7) % 400).collect();
    let off = generate(&m0, &prompt, 30, Speculation::OFF, None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.jsonl");
    let mut m = K3Model::from_dir(&common::nano(), &Device::Cpu).unwrap();
    let trace =
        std::sync::Arc::new(deltafin::runtime::observers::RouterTrace::create(&path).unwrap());
    m.observe(trace.clone());
    let on = scripted_with(&m, &prompt, &off, 3, Sampler::new(0.0, 1.0, 0));
    assert_eq!(on.generated_ids, off.generated_ids);
    assert!(on.spec.accepted > 0 && on.spec.accepted < on.spec.drafted);
    trace.flush().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let pos: Vec<u64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["pos"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let want: Vec<u64> = (0..(prompt.len() + off.generated_ids.len() - 1) as u64).collect();
    assert_eq!(pos, want);
}
