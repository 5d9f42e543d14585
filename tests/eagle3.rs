//! The EAGLE-3 head (`drafters::eagle3`) on a random head written here in speculators' spelling:
//! a step over several positions equals the same positions fed one at a time through its
//! key/value rows, a truncated cache replays to the same logits, `d2t` maps to target ids, and
//! malformed heads are refused by name. Its logits against speculators' own module are
//! `scripts/eagle3_reference.py` (in `.ci/run`).

#[path = "common/runner.rs"]
mod runner;

use std::collections::HashMap;
use std::path::Path;

use deltafin::drafters::eagle3::{DraftCache, Eagle3Head, HeadInput};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

const V: usize = 50;
const VD: usize = 20;
const H: usize = 32;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }
}

/// A head's sizes: target vocabulary, draft vocabulary, hidden, the target's hidden, and the
/// tapped layers as speculators counts them.
struct Dims {
    v: usize,
    vd: usize,
    ht: usize,
    ids: [usize; 3],
    /// Scale of `fc`'s weights (small: the embeddings weigh as much as the target's rows).
    fc: f32,
}

const SMALL: Dims = Dims {
    v: V,
    vd: VD,
    ht: H,
    ids: [2, 4, 6],
    fc: 0.2,
};

fn write_head(dir: &Path, d2t: Option<Vec<i64>>, layers: usize) {
    write_head_dims(dir, d2t, layers, &SMALL)
}

fn write_head_dims(dir: &Path, d2t: Option<Vec<i64>>, layers: usize, d: &Dims) {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = serde_json::json!({
        "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": d.vd, "norm_before_residual": false, "target_hidden_size": d.ht,
        "eagle_aux_hidden_state_layer_ids": d.ids,
        "transformer_layer_config": {"model_type": "llama", "hidden_size": H,
            "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": d.v, "rms_norm_eps": 1e-5, "num_hidden_layers": layers,
            "rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"}}});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut rng = Lcg(7);
    let shapes: Vec<(&str, Vec<usize>, f32)> = vec![
        ("fc.weight", vec![H, 3 * d.ht], d.fc),
        ("embed_tokens.weight", vec![d.v, H], 1.0),
        ("layers.0.input_layernorm.weight", vec![H], -1.0),
        ("layers.0.hidden_norm.weight", vec![H], -1.0),
        ("layers.0.post_attention_layernorm.weight", vec![H], -1.0),
        ("layers.0.self_attn.q_proj.weight", vec![32, 2 * H], 0.2),
        ("layers.0.self_attn.k_proj.weight", vec![16, 2 * H], 0.2),
        ("layers.0.self_attn.v_proj.weight", vec![16, 2 * H], 0.2),
        ("layers.0.self_attn.o_proj.weight", vec![H, 32], 0.2),
        ("layers.0.mlp.gate_proj.weight", vec![48, H], 0.2),
        ("layers.0.mlp.up_proj.weight", vec![48, H], 0.2),
        ("layers.0.mlp.down_proj.weight", vec![H, 48], 0.2),
        ("norm.weight", vec![H], -1.0),
        ("lm_head.weight", vec![d.vd, H], 0.3),
    ];
    let mut data: HashMap<String, (Dtype, Vec<usize>, Vec<u8>)> = HashMap::new();
    for (name, shape, s) in shapes {
        let n: usize = shape.iter().product();
        // A negative scale marks a norm weight: values around 1.
        let v: Vec<u8> = (0..n)
            .flat_map(|_| {
                let x = rng.next();
                (if s < 0.0 { 1.0 + 0.4 * x } else { s * x }).to_le_bytes()
            })
            .collect();
        data.insert(name.into(), (Dtype::F32, shape, v));
    }
    if let Some(map) = d2t {
        let b: Vec<u8> = map.iter().flat_map(|x| x.to_le_bytes()).collect();
        data.insert("d2t".into(), (Dtype::I64, vec![d.vd], b));
    }
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(k, (dt, sh, b))| (k.clone(), TensorView::new(*dt, sh.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

fn d2t() -> Vec<i64> {
    // Draft id i is target id 2i + 3.
    (0..VD as i64).map(|i| i + 3).collect()
}

#[test]
fn one_step_over_positions_equals_one_position_at_a_time() {
    let d = tempfile::tempdir().unwrap();
    write_head(d.path(), Some(d2t()), 1);
    let head = Eagle3Head::open(d.path()).unwrap();
    assert_eq!(
        head.config().taps(12),
        vec![1, 3, 5],
        "capture points minus one"
    );
    let ids = [3u32, 9, 17, 40, 2, 33];
    let mut rng = Lcg(99);
    let taps: Vec<f32> = (0..ids.len() * 3 * H).map(|_| rng.next()).collect();
    let embeds = head.embed(&ids).unwrap();
    let mut whole = DraftCache::default();
    let all = head
        .step(&embeds, HeadInput::Taps(&taps), &mut whole)
        .unwrap();
    assert_eq!(all.logits.len(), ids.len() * VD);
    assert_eq!(whole.len(), ids.len());
    let mut cache = DraftCache::default();
    for p in 0..ids.len() {
        let one = head
            .step(
                &embeds[p * H..][..H],
                HeadInput::Taps(&taps[p * 3 * H..][..3 * H]),
                &mut cache,
            )
            .unwrap();
        for (a, b) in one.logits.iter().zip(&all.logits[p * VD..][..VD]) {
            assert!((a - b).abs() < 1e-5, "position {p}: {a} vs {b}");
        }
        for (a, b) in one.rows.iter().zip(&all.rows[p * H..][..H]) {
            assert!((a - b).abs() < 1e-5, "position {p} rows");
        }
    }
    // Rejected drafts leave the cache: truncated to 3 positions, the 4th replays the same.
    cache.truncate(3);
    let again = head
        .step(
            &embeds[3 * H..][..H],
            HeadInput::Taps(&taps[3 * 3 * H..][..3 * H]),
            &mut cache,
        )
        .unwrap();
    for (a, b) in again.logits.iter().zip(&all.logits[3 * VD..][..VD]) {
        assert!((a - b).abs() < 1e-5);
    }
    // A later step may take the head's own rows instead of taps.
    let fed = head
        .step(&embeds[..H], HeadInput::Rows(&again.rows), &mut cache)
        .unwrap();
    assert_eq!(fed.logits.len(), VD);
    assert_eq!(head.target_id(0), 3);
    assert_eq!(head.target_id(VD - 1), 2 * (VD as u32 - 1) + 3);
}

#[test]
fn malformed_heads_are_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    write_head(&d.path().join("no-d2t"), None, 1);
    let e = Eagle3Head::open(&d.path().join("no-d2t")).err().unwrap();
    assert!(e.to_string().contains("d2t"), "{e}");
    let mut bad = d2t();
    bad[5] = 1000;
    write_head(&d.path().join("bad-d2t"), Some(bad), 1);
    let e = Eagle3Head::open(&d.path().join("bad-d2t")).err().unwrap();
    assert!(e.to_string().contains("outside the target"), "{e}");
    write_head(&d.path().join("two"), Some(d2t()), 2);
    let e = Eagle3Head::open(&d.path().join("two")).err().unwrap();
    assert!(e.to_string().contains("2 decoder layers"), "{e}");
    let head = Eagle3Head::open(&{
        write_head(&d.path().join("ok"), Some(d2t()), 1);
        d.path().join("ok")
    })
    .unwrap();
    let e = head
        .step(
            &[0.0; H],
            HeadInput::Taps(&[0.0; 5]),
            &mut DraftCache::default(),
        )
        .err()
        .unwrap();
    assert!(e.to_string().contains("tapped rows"), "{e}");
    assert!(head.embed(&[V as u32]).is_err());
}

/// The head as the decoding loop's drafter on a target (K3-nano): it drafts from the target's
/// tapped rows, and the verify pass keeps the output exactly plain greedy decoding's.
#[test]
fn the_drafter_drafts_from_the_targets_rows_and_changes_no_token() {
    use deltafin::drafters::eagle3::Eagle3Drafter;
    use deltafin::runtime::generate::Drafter;
    use deltafin::runtime::generate::{argmax, SpecMode, Speculation};
    use deltafin::{Engine, EngineOptions, GenerateOptions, Generator};
    use std::sync::atomic::AtomicBool;
    let d = tempfile::tempdir().unwrap();
    let nano = d.path().join("nano");
    let out = runner::command(env!("CARGO_BIN_EXE_deltafin"))
        .args(["fixture", "nano"])
        .arg(&nano)
        .output()
        .unwrap();
    assert!(out.status.success());
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(nano.join("config.json")).unwrap()).unwrap();
    let text = cfg.get("text_config").unwrap_or(&cfg);
    let (v, ht) = (
        text["vocab_size"].as_u64().unwrap() as usize,
        text["hidden_size"].as_u64().unwrap() as usize,
    );
    let layers = text["num_hidden_layers"].as_u64().unwrap() as usize;
    let dims = Dims {
        v,
        vd: 64,
        ht,
        ids: [2, 4, 6],
        fc: 0.002,
    };
    let head_dir = d.path().join("head");
    let d2t: Vec<i64> = (0..64).map(|i| i * 5).collect();
    write_head_dims(&head_dir, Some(d2t), 1, &dims);
    let head = std::sync::Arc::new(Eagle3Head::open(&head_dir).unwrap());
    let e = Engine::open(&nano, &EngineOptions::default()).unwrap();
    let mut drafter = Eagle3Drafter::new(head, layers);
    let m = e.model();
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % v as u32).collect();
    let no = AtomicBool::new(false);
    let opts = |spec| GenerateOptions {
        max_new: 24,
        speculation: spec,
        ..Default::default()
    };
    let g = Generator::new(m);
    let plain = g
        .generate_drafted(
            &mut m.new_state(),
            &prompt,
            &opts(Speculation::OFF),
            &no,
            &mut |l: &[f32]| argmax(l),
            &mut drafter,
            |_| {},
        )
        .unwrap();
    let spec = Speculation {
        mode: SpecMode::Ngram,
        depth: 4,
    };
    let mut drafter2 = {
        let head = std::sync::Arc::new(Eagle3Head::open(&head_dir).unwrap());
        Eagle3Drafter::new(head, layers)
    };
    drop(e);
    let mut e = Engine::open(&nano, &EngineOptions::default()).unwrap();
    let m = e.model();
    let drafted = Generator::new(m)
        .generate_drafted(
            &mut m.new_state(),
            &prompt,
            &opts(spec),
            &no,
            &mut |l: &[f32]| argmax(l),
            &mut drafter2,
            |_| {},
        )
        .unwrap();
    assert_eq!(drafted.generated_ids, plain.generated_ids);
    // It drafts in every verify pass, not only after the prompt's: its tap follows the
    // positions of each pass (a tap that placed every pass at position 0 drafted once).
    assert!(drafted.spec.verify_passes > 3, "{:?}", drafted.spec);
    // (the last pass may have room for no draft).
    assert!(
        drafted.spec.verify_passes + 1 >= drafted.spec.passes,
        "{:?}",
        drafted.spec
    );

    // Alignment: after the prompt's pass, the first draft is the head's step over positions
    // 0..P (the embedding of token t + 1 with the target's rows at t), computed by hand.
    let head = std::sync::Arc::new(Eagle3Head::open(&head_dir).unwrap());
    let mut drafter3 = Eagle3Drafter::new(head.clone(), layers);
    let hand = std::sync::Arc::new(deltafin::runtime::observers::HiddenTap::new(&[1, 3, 5]));
    e.model_mut().observe(drafter3.tap().clone());
    e.model_mut().observe(hand.clone());
    let m = e.model();
    // A short prompt: over long contexts this random head's argmax settles on one token.
    let prompt = &prompt[..7];
    let mut st = m.new_state();
    let last = m
        .forward(prompt, &mut st)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let x0 = argmax(&last);
    let mut context = prompt.to_vec();
    context.push(x0);
    let got = drafter3.propose(&context, 3);
    let rows = hand.take();
    let p = prompt.len();
    let taps: Vec<f32> = (0..p)
        .flat_map(|r| {
            rows.iter()
                .flat_map(move |t| t.rows[r * ht..][..ht].to_vec())
        })
        .collect();
    let embeds = head.embed(&context[1..=p]).unwrap();
    let mut cache = DraftCache::default();
    let out = head
        .step(&embeds, HeadInput::Taps(&taps), &mut cache)
        .unwrap();
    // The chain: each draft's embedding with the head's own row of the step before.
    let mut want = vec![head.target_id(argmax(&out.logits[(p - 1) * 64..]) as usize)];
    let mut row = out.rows[(p - 1) * 32..].to_vec();
    while want.len() < 3 {
        let e = head.embed(&want[want.len() - 1..]).unwrap();
        let o = head.step(&e, HeadInput::Rows(&row), &mut cache).unwrap();
        want.push(head.target_id(argmax(&o.logits) as usize));
        row = o.rows;
    }
    assert_eq!(got, want);
    // The head's proposals depend on its inputs (else this check could not see a shift).
    let shifted = head
        .step(
            &head.embed(&context[..p]).unwrap(),
            HeadInput::Taps(&taps),
            &mut DraftCache::default(),
        )
        .unwrap();
    let other: Vec<u32> = (0..p)
        .map(|r| head.target_id(argmax(&shifted.logits[r * 64..][..64]) as usize))
        .collect();
    let mine: Vec<u32> = (0..p)
        .map(|r| head.target_id(argmax(&out.logits[r * 64..][..64]) as usize))
        .collect();
    assert_ne!(
        other[p - 1],
        mine[p - 1],
        "the embeddings do not move the head's first draft: the check above cannot see a shift"
    );
}

/// `setup --drafter REPO --drafter-only` installs a published head from the hub (here the
/// project's Hugging Face mock) beside a model, where front ends find it; a repository that
/// is not a head is refused before any weights are fetched.
#[test]
fn setup_installs_a_published_head_beside_the_model() {
    use deltafin::hub::mock::MockHub;
    let src = tempfile::tempdir().unwrap();
    write_head(src.path(), Some(d2t()), 1);
    let hub = MockHub::start(src.path(), "org/eagle3-head").unwrap();
    let root = tempfile::tempdir().unwrap();
    let out = runner::command(env!("CARGO_BIN_EXE_deltafin"))
        .args([
            "setup",
            "--drafter",
            "org/eagle3-head",
            "--drafter-only",
            "--model-root",
        ])
        .arg(root.path())
        .env("HF_ENDPOINT", hub.endpoint())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = deltafin::drafters::installed(root.path()).expect("installed");
    let got = Eagle3Head::open(&dir).unwrap();
    let want = Eagle3Head::open(src.path()).unwrap();
    assert_eq!(got.config(), want.config());
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        std::fs::read(src.path().join("model.safetensors")).unwrap()
    );

    // A model repository (no EAGLE-3 config) is refused, and nothing is installed.
    let model = tempfile::tempdir().unwrap();
    std::fs::write(
        model.path().join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 8}"#,
    )
    .unwrap();
    let hub2 = MockHub::start(model.path(), "org/not-a-head").unwrap();
    let root2 = tempfile::tempdir().unwrap();
    let out = runner::command(env!("CARGO_BIN_EXE_deltafin"))
        .args([
            "setup",
            "--drafter",
            "org/not-a-head",
            "--drafter-only",
            "--model-root",
        ])
        .arg(root2.path())
        .env("HF_ENDPOINT", hub2.endpoint())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not an EAGLE-3 head"), "{err}");
    assert!(deltafin::drafters::installed(root2.path()).is_none());
}

/// K3-tiny with the head it ships: greedy and seeded sampling emit exactly plain decoding's
/// tokens on chat prompts, with the head drafting at a fixed depth and at the depth the cost
/// model picks, and the head's drafts are accepted.
#[test]
fn k3_tiny_with_its_head_emits_plain_decodings_tokens() {
    use deltafin::runtime::generate::sample::Sampler;
    use deltafin::runtime::generate::{SpecMode, Speculation};
    use deltafin::{Engine, EngineOptions, GenerateOptions, Generator};
    use std::sync::atomic::AtomicBool;
    let root = deltafin::assets::k3_tiny().unwrap();
    let head = deltafin::drafters::installed(&root).expect("K3-tiny ships a drafter");
    let mut e = Engine::open(&root, &EngineOptions::default()).unwrap();
    let questions = [
        "What did Anne think of Captain Wentworth",
        "Describe the town of Bath in winter",
        "Why did Sir Walter leave Kellynch Hall",
    ];
    let prompts = chat_prompts(&e, &questions);
    let no = AtomicBool::new(false);
    let gen = |e: &Engine, p: &[u32], spec: Speculation, seed: Option<u64>| {
        let opts = GenerateOptions {
            max_new: 48,
            stop_ids: e.stop_ids(),
            speculation: spec,
        };
        let mut s = seed.map(|s| Sampler::new(0.8, 0.95, s));
        let mut choose = |l: &[f32]| match &mut s {
            Some(s) => s.choose(l),
            None => deltafin::runtime::generate::argmax(l),
        };
        let m = e.model();
        Generator::new(m)
            .generate_drafted(
                &mut m.new_state(),
                p,
                &opts,
                &no,
                &mut choose,
                &mut *e.new_drafter(),
                |_| {},
            )
            .unwrap()
    };
    let runs: Vec<(usize, Option<u64>)> = (0..prompts.len())
        .flat_map(|p| [None, Some(p as u64), Some(7 + p as u64)].map(|s| (p, s)))
        .collect();
    let plain: Vec<Vec<u32>> = runs
        .iter()
        .map(|&(p, s)| gen(&e, &prompts[p], Speculation::OFF, s).generated_ids)
        .collect();
    e.use_drafter(&head).unwrap();
    let mut accepted = 0;
    for spec in [
        Speculation {
            mode: SpecMode::Ngram,
            depth: 6,
        },
        Speculation::default(),
    ] {
        for (&(p, s), want) in runs.iter().zip(&plain) {
            let g = gen(&e, &prompts[p], spec, s);
            assert_eq!(&g.generated_ids, want, "prompt {p}, seed {s:?}, {spec:?}");
            accepted += g.spec.accepted;
        }
    }
    assert!(
        accepted > 50,
        "the head's drafts were accepted {accepted} times"
    );
}

/// Through the batch scheduler (requests sharing passes, as `serve` runs them), each request
/// drafts from its own rows of the shared pass: its tokens equal plain decoding's and its head's
/// drafts are accepted as often as alone (rows handed to the wrong sequence are not).
#[test]
fn batched_requests_draft_from_their_own_rows() {
    use deltafin::engine::batch::{BatchOptions, Request, Scheduler, SeqEvent};
    use deltafin::runtime::generate::{argmax, Speculation};
    use deltafin::{Engine, EngineOptions, GenerateOptions, Generator};
    use std::sync::atomic::AtomicBool;
    use std::sync::{mpsc, Arc};
    let root = deltafin::assets::k3_tiny().unwrap();
    let mut e = Engine::open(&root, &EngineOptions::default()).unwrap();
    let prompts = chat_prompts(
        &e,
        &[
            "Who is Anne Elliot",
            "Tell me about Lyme",
            "What is a baronet",
        ],
    );
    let opts = |spec| GenerateOptions {
        max_new: 48,
        stop_ids: vec![],
        speculation: spec,
    };
    let no = AtomicBool::new(false);
    let plain: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let m = e.model();
            Generator::new(m)
                .generate(&mut m.new_state(), p, &opts(Speculation::OFF), &no, |_| {})
                .unwrap()
                .generated_ids
        })
        .collect();
    e.use_drafter(&deltafin::drafters::installed(&root).unwrap())
        .unwrap();
    let s = Scheduler::new(Arc::new(e), BatchOptions::default());
    let (tx, rx) = mpsc::channel();
    for (i, p) in prompts.iter().enumerate() {
        let tx = tx.clone();
        s.submit(Request {
            ids: p.clone(),
            marks: vec![],
            opts: opts(Speculation {
                mode: deltafin::runtime::generate::SpecMode::Ngram,
                depth: 4,
            }),
            choose: Box::new(|l: &[f32]| argmax(l)),
            on_event: Box::new(move |ev| {
                if let SeqEvent::Done(g) = ev {
                    tx.send((i, g)).unwrap();
                }
            }),
            cancel: Arc::new(AtomicBool::new(false)),
            prompt_logits: None,
            drafter: None,
        })
        .unwrap();
    }
    for _ in 0..prompts.len() {
        let (i, g) = rx
            .recv_timeout(std::time::Duration::from_secs(300))
            .unwrap();
        assert_eq!(g.generated_ids, plain[i], "request {i}");
        assert!(
            g.spec.acceptance() > 0.5,
            "request {i}: acceptance {:?}",
            g.spec
        );
    }
    let st = s.stats();
    assert!(st.seq_passes > st.passes, "the requests shared passes");
}

/// Each question as a user message in the engine's chat format, as ids.
fn chat_prompts(e: &deltafin::Engine, questions: &[&str]) -> Vec<Vec<u32>> {
    use deltafin::chat::{encode_marked, ChatOptions, Message};
    questions
        .iter()
        .map(|q| {
            let (segs, marks) = e
                .chat_format()
                .render(&[Message::new("user", q)], &ChatOptions::default())
                .unwrap();
            encode_marked(e.tokenizer(), &segs, &marks).0
        })
        .collect()
}
