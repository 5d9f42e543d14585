//! The EAGLE-3 head (`drafters::eagle3`) on a random head written here in speculators' spelling:
//! a step over several positions equals the same positions fed one at a time through its
//! key/value rows, a truncated cache replays to the same logits, `d2t` maps to target ids, and
//! malformed heads are refused by name. Its logits against speculators' own module are
//! `scripts/eagle3_reference.py` (in `.ci/run`).

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

fn write_head(dir: &Path, d2t: Option<Vec<i64>>, layers: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = serde_json::json!({
        "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": VD, "norm_before_residual": false,
        "eagle_aux_hidden_state_layer_ids": [2, 4, 6],
        "transformer_layer_config": {"model_type": "llama", "hidden_size": H,
            "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": V, "rms_norm_eps": 1e-5, "num_hidden_layers": layers,
            "rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"}}});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut rng = Lcg(7);
    let shapes: Vec<(&str, Vec<usize>, f32)> = vec![
        ("fc.weight", vec![H, 3 * H], 0.2),
        ("embed_tokens.weight", vec![V, H], 1.0),
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
        ("lm_head.weight", vec![VD, H], 0.3),
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
    if let Some(d) = d2t {
        let b: Vec<u8> = d.iter().flat_map(|x| x.to_le_bytes()).collect();
        data.insert("d2t".into(), (Dtype::I64, vec![VD], b));
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
