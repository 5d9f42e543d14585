//! The DFlash block drafter (`drafters::dflash`) on random heads written here in speculators'
//! spelling: the context read in pieces (and cut back, as after a rejected draft) gives the
//! block the whole context gives; malformed heads are refused by name; on K3-nano, decoding
//! with the drafter emits plain decoding's tokens (greedy and seeded) and the drafter's
//! proposal after a speculative generation is the head's block over the target's rows of the
//! whole context, computed by hand. Its logits against speculators' own module are
//! `scripts/dflash_reference.py` (in `.ci/run`).

#[path = "common/runner.rs"]
mod runner;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use deltafin::drafters::dflash::{ContextCache, DFlashDrafter, DFlashHead};
use deltafin::drafters::DraftHead;
use deltafin::runtime::generate::sample::Sampler;
use deltafin::runtime::generate::{argmax, Drafter, SpecMode, Speculation};
use deltafin::{Engine, EngineOptions, GenerateOptions, Generator};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

const H: usize = 32;
const BLOCK: usize = 5;

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

/// A random two-layer head for a target of vocabulary `v` and hidden size `h`, tapping the
/// outputs of layers 1, 3, 5 (speculators' capture points 2, 4, 6); `edit` changes the config.
fn write_head(dir: &Path, v: usize, h: usize, edit: impl FnOnce(&mut serde_json::Value)) {
    std::fs::create_dir_all(dir).unwrap();
    let mut cfg = serde_json::json!({
        "speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"],
        "draft_vocab_size": v, "block_size": BLOCK, "aux_hidden_state_layer_ids": [2, 4, 6],
        "mask_token_id": v - 1,
        "transformer_layer_config": {"model_type": "qwen3", "hidden_size": h,
            "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": v, "rms_norm_eps": 1e-5, "num_hidden_layers": 2,
            "rope_theta": 1000.0}});
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut rng = Lcg(11);
    let mut shapes: Vec<(String, Vec<usize>, f32)> = vec![
        ("fc.weight".into(), vec![h, 3 * h], 0.05),
        ("hidden_norm.weight".into(), vec![h], -1.0),
        ("embed_tokens.weight".into(), vec![v, h], 1.0),
        ("norm.weight".into(), vec![h], -1.0),
        ("lm_head.weight".into(), vec![v, h], 0.3),
    ];
    if cfg["speculators_model_type"] == "dspark" {
        let r = cfg["markov_rank"].as_u64().unwrap() as usize;
        shapes.push(("markov_head.markov_w1.weight".into(), vec![v, r], 1.0));
        shapes.push(("markov_head.markov_w2.weight".into(), vec![v, r], 1.0));
        let mix = match cfg["markov_head_type"].as_str() {
            Some("gated") => Some(("gate_proj", r, h + r)),
            Some("rnn") => Some(("joint_proj", 3 * r, 2 * r + h)),
            _ => None,
        };
        if let Some((name, rows, cols)) = mix {
            let p = format!("markov_head.{name}");
            shapes.push((format!("{p}.weight"), vec![rows, cols], 0.3));
            shapes.push((format!("{p}.bias"), vec![rows], 0.3));
        }
    }
    for l in 0..2 {
        let p = format!("layers.{l}.");
        for (n, sh, s) in [
            ("input_layernorm.weight", vec![h], -1.0),
            ("post_attention_layernorm.weight", vec![h], -1.0),
            ("self_attn.q_norm.weight", vec![8], -1.0),
            ("self_attn.k_norm.weight", vec![8], -1.0),
            ("self_attn.q_proj.weight", vec![32, h], 0.3),
            ("self_attn.k_proj.weight", vec![16, h], 0.3),
            ("self_attn.v_proj.weight", vec![16, h], 0.3),
            ("self_attn.o_proj.weight", vec![h, 32], 0.3),
            ("mlp.gate_proj.weight", vec![48, h], 0.3),
            ("mlp.up_proj.weight", vec![48, h], 0.3),
            ("mlp.down_proj.weight", vec![h, 48], 0.3),
        ] {
            shapes.push((format!("{p}{n}"), sh, s));
        }
    }
    let mut data: HashMap<String, (Vec<usize>, Vec<u8>)> = HashMap::new();
    for (name, shape, s) in shapes {
        let n: usize = shape.iter().product();
        // A negative scale marks a norm weight: values around 1.
        let b: Vec<u8> = (0..n)
            .flat_map(|_| {
                let x = rng.next();
                (if s < 0.0 { 1.0 + 0.4 * x } else { s * x }).to_le_bytes()
            })
            .collect();
        data.insert(name, (shape, b));
    }
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(k, (sh, b))| {
            (
                k.clone(),
                TensorView::new(Dtype::F32, sh.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

fn taps(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Lcg(seed);
    (0..n * 3 * H).map(|_| 2.0 * rng.next()).collect()
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let top = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / top
}

#[test]
fn the_context_read_in_pieces_gives_the_blocks_of_the_whole() {
    let d = tempfile::tempdir().unwrap();
    write_head(d.path(), 60, H, |_| {});
    let head = DFlashHead::open(d.path()).unwrap();
    let rows = taps(30, 3);
    let w = 3 * H;
    let mut whole = ContextCache::starting_at(0);
    head.extend(&rows, &mut whole).unwrap();
    let want = head.block(17, &mut whole).unwrap().logits;
    assert_eq!(want.len(), BLOCK * 60);
    // A block leaves the context as it was (its own rows are cut off again).
    assert_eq!(whole.end(), 30);
    assert_eq!(head.block(17, &mut whole).unwrap().logits, want);
    // In pieces, with a stretch read, cut back (rejected drafts) and read again.
    let mut pieces = ContextCache::starting_at(0);
    head.extend(&rows[..11 * w], &mut pieces).unwrap();
    head.extend(&taps(6, 99), &mut pieces).unwrap();
    pieces.truncate_to(11);
    head.extend(&rows[11 * w..20 * w], &mut pieces).unwrap();
    head.extend(&rows[20 * w..], &mut pieces).unwrap();
    assert_eq!(pieces.end(), 30);
    let got = head.block(17, &mut pieces).unwrap().logits;
    assert!(rel(&got, &want) < 1e-5, "rel {}", rel(&got, &want));
    // The check can see the context: a block over one row fewer differs.
    let mut short = whole.clone();
    short.truncate_to(29);
    let other = head.block(17, &mut short).unwrap().logits;
    assert!(rel(&other, &want) > 1e-3, "rel {}", rel(&other, &want));
    // Both spellings open as DraftHead, by their config.
    assert_eq!(DraftHead::open(d.path()).unwrap().kind(), "DFlash");
}

#[test]
fn malformed_heads_are_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let err = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let dir = d.path().join(name);
        write_head(&dir, 60, H, edit);
        DFlashHead::open(&dir).err().unwrap().to_string()
    };
    let e = err("mask", &|c| c["mask_token_id"] = 60.into());
    assert!(e.contains("mask_token_id 60"), "{e}");
    let e = err("sliding", &|c| {
        c["transformer_layer_config"]["layer_types"] =
            serde_json::json!(["sliding_attention", "full_attention"])
    });
    assert!(e.contains("sliding"), "{e}");
    let e = err("block", &|c| c["block_size"] = 1.into());
    assert!(e.contains("block_size 1"), "{e}");
    let e = err("taps", &|c| {
        c["aux_hidden_state_layer_ids"] = serde_json::json!([2, 4])
    });
    assert!(e.contains("fc.weight"), "{e}");
    // A head that borrows its target's embedding names the tensor and what to do.
    let dir = d.path().join("borrowed");
    write_head(&dir, 60, H, |_| {});
    let st = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    let kept: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(k, _)| k != "embed_tokens.weight")
        .collect();
    let out = d.path().join("borrowed2");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
    safetensors::serialize_to_file(kept, None, &out.join("model.safetensors")).unwrap();
    let e = DFlashHead::open(&out).err().unwrap().to_string();
    assert!(e.contains("embed_tokens") && e.contains("borrows"), "{e}");
    // Not a draft head at all.
    let e = DraftHead::open(d.path()).err().unwrap().to_string();
    assert!(e.contains("config.json"), "{e}");
}

/// DSpark's sequential head drafts what it would score: the chain's drafts, fed back as the
/// block's true tokens, give the same logits (each slot biased by the token drafted before it),
/// and the bias moves the drafts (else this could not see it).
#[test]
fn dspark_chains_each_slot_on_the_draft_before_it() {
    let d = tempfile::tempdir().unwrap();
    for (kind, from_anchor) in [("vanilla", true), ("gated", false), ("rnn", true)] {
        let dir = d.path().join(kind);
        write_head(&dir, 60, H, |c| {
            c["speculators_model_type"] = "dspark".into();
            c["markov_rank"] = 8.into();
            c["markov_head_type"] = kind.into();
            c["sample_from_anchor"] = from_anchor.into();
        });
        let head = DFlashHead::open(&dir).unwrap();
        let mut cache = ContextCache::starting_at(0);
        head.extend(&taps(12, 5), &mut cache).unwrap();
        let block = head.block(17, &mut cache).unwrap();
        let (logits, drafts) = head.chain(&block, 17, None).unwrap();
        assert_eq!(drafts.len(), if from_anchor { BLOCK } else { BLOCK - 1 });
        let forced: Vec<u32> = std::iter::once(17).chain(drafts.iter().copied()).collect();
        let (again, same) = head.chain(&block, 17, Some(&forced)).unwrap();
        assert_eq!(same, drafts, "{kind}");
        assert_eq!(again, logits, "{kind}");
        assert_ne!(logits, block.logits, "{kind}: the bias moves nothing");
        // Another previous token moves the slots after the first drafting one.
        let mut other = forced.clone();
        other[1] = (other[1] + 1) % 60;
        let (moved, _) = head.chain(&block, 17, Some(&other)).unwrap();
        assert_ne!(moved, logits, "{kind}");
    }
}

/// K3-nano with a random DFlash head: speculation with it emits plain decoding's tokens, and
/// its proposal after a generation is the block over the whole context's rows.
#[test]
fn on_k3_nano_the_drafter_changes_no_token_and_reads_the_whole_context() {
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
    let v = text["vocab_size"].as_u64().unwrap() as usize;
    let ht = text["hidden_size"].as_u64().unwrap() as usize;
    let head_dir = d.path().join("head");
    write_head(&head_dir, v, ht, |_| {});
    let mut e = Engine::open(&nano, &EngineOptions::default()).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % v as u32).collect();
    let no = AtomicBool::new(false);
    let gen = |e: &Engine, spec: Speculation, seed: Option<u64>, drafter: &mut dyn Drafter| {
        let opts = GenerateOptions {
            max_new: 32,
            speculation: spec,
            ..Default::default()
        };
        let mut s = seed.map(|s| Sampler::new(0.8, 0.95, s));
        let mut choose = |l: &[f32]| match &mut s {
            Some(s) => s.choose(l),
            None => argmax(l),
        };
        let m = e.model();
        Generator::new(m)
            .generate_drafted(
                &mut m.new_state(),
                &prompt,
                &opts,
                &no,
                &mut choose,
                drafter,
                |_| {},
            )
            .unwrap()
    };
    let spec = Speculation {
        mode: SpecMode::Ngram,
        depth: BLOCK - 1,
    };
    let dspark_dir = d.path().join("dspark");
    write_head(&dspark_dir, v, ht, |c| {
        c["speculators_model_type"] = "dspark".into();
        c["markov_rank"] = 8.into();
        c["markov_head_type"] = "rnn".into();
    });
    for (seed, dir) in [
        (None, &head_dir),
        (Some(1), &head_dir),
        (Some(2), &head_dir),
        (None, &dspark_dir),
        (Some(3), &dspark_dir),
    ] {
        let plain = gen(&e, Speculation::OFF, seed, &mut *e.new_drafter());
        e.use_drafter(dir).unwrap();
        let g = gen(&e, spec, seed, &mut *e.new_drafter());
        assert_eq!(g.generated_ids, plain.generated_ids, "seed {seed:?}");
        // It drafts in every pass after the prompt's but the last (which may have no room):
        // rejected rows are cut from its context, so the next block starts at the right place.
        assert!(g.spec.verify_passes > 5, "{:?}", g.spec);
        assert!(g.spec.verify_passes + 2 >= g.spec.passes, "{:?}", g.spec);
        e.set_drafter(None);
    }
    // The drafter's proposal after a generation, against the head over a tap of one pass.
    let head = Arc::new(DFlashHead::open(&head_dir).unwrap());
    let mut drafter = DFlashDrafter::new(head.clone());
    let g = gen(&e, spec, None, &mut drafter);
    let mut context = prompt.clone();
    context.extend(&g.generated_ids);
    let got = drafter.propose(&context, BLOCK - 1);
    let hand = Arc::new(deltafin::runtime::observers::HiddenTap::new(&[1, 3, 5]));
    e.model_mut().observe(hand.clone());
    let m = e.model();
    let n = context.len() - 1;
    m.forward(&context[..n], &mut m.new_state()).unwrap();
    let rows = hand.take();
    let taps: Vec<f32> = (0..n)
        .flat_map(|r| {
            rows.iter()
                .flat_map(move |t| t.rows[r * ht..][..ht].to_vec())
        })
        .collect();
    let mut cache = ContextCache::starting_at(0);
    head.extend(&taps, &mut cache).unwrap();
    let logits = head.block(context[n], &mut cache).unwrap().logits;
    let want: Vec<u32> = logits
        .chunks(v)
        .skip(1)
        .map(|r| head.target_id(argmax(r) as usize))
        .collect();
    assert_eq!(got, want);
}
