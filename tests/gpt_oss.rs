//! gpt-oss on the runtime (the independent check against transformers is
//! `scripts/gpt_oss_reference.py`, run by `scripts/reference_check.sh`): a prefill equals the
//! same tokens one at a time past the sliding window; a state's mark/rewind and snapshot
//! continue bit-identically; the expert store's tiers change no bit; bad input is an error, not
//! a panic; the fixture is in the hub's layout.

use std::sync::Arc;

use deltafin::checkpoint::Inventory;
use deltafin::experts::TieredOptions;
use deltafin::models::gpt_oss::fixture::{write_gpt_oss, GptOssShape};
use deltafin::models::gpt_oss::GptOssModel;

fn tiny(seed: u64, files: usize) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write_gpt_oss(d.path(), &GptOssShape::tiny(), seed, files).unwrap();
    d
}

fn ids(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 131 + seed * 17 + 5) % 500)
        .collect()
}

#[test]
fn prefill_equals_single_steps_past_the_window() {
    let d = tiny(3, 2);
    assert_eq!(
        deltafin::models::family(d.path()).unwrap().name(),
        "gpt-oss"
    );
    let m = GptOssModel::open(d.path(), &TieredOptions::default()).unwrap();
    let p = ids(21, 1); // window 8: the sliding layers drop positions
    let mut a = m.new_state();
    let all = m.forward_all(&p, &mut a).unwrap();
    let v = m.config().vocab_size;
    let mut b = m.new_state();
    for (t, &id) in p.iter().enumerate() {
        let one = m.forward(&[id], &mut b).unwrap();
        let want = &all[t * v..(t + 1) * v];
        let worst = one
            .iter()
            .zip(want)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        // Same arithmetic per row; only the dense kernel's row blocking may differ.
        assert!(worst <= 1e-5, "position {t}: {worst}");
    }
    assert_eq!(a.pos, 21);
    assert_eq!(b.pos, 21);
}

#[test]
fn mark_rewind_and_snapshot_continue_exactly() {
    let d = tiny(4, 3);
    let m = GptOssModel::open(d.path(), &TieredOptions::default()).unwrap();
    let mut s = m.new_state();
    m.forward(&ids(10, 2), &mut s).unwrap();
    let snap = s.snapshot();
    let mark = s.mark();
    let first = m.forward(&ids(5, 3), &mut s).unwrap();
    s.rewind(mark);
    assert_eq!(s.pos, 10);
    assert_eq!(m.forward(&ids(5, 3), &mut s).unwrap(), first);
    let mut r = m.new_state();
    r.restore(&snap);
    assert_eq!(m.forward(&ids(5, 3), &mut r).unwrap(), first);
    // A saved state's arrays rebuild the same state.
    let arrays: Vec<Vec<f32>> = s.arrays().into_iter().map(|(_, a)| a.to_vec()).collect();
    let mut back = m.new_state().with_arrays(s.pos, arrays).unwrap();
    assert_eq!(
        m.forward(&[7], &mut back).unwrap(),
        m.forward(&[7], &mut s).unwrap()
    );
}

#[test]
fn expert_tiers_change_no_bit() {
    let d = tiny(5, 1);
    let p = ids(12, 4);
    let run = |opts: &TieredOptions| {
        let m = GptOssModel::open(d.path(), opts).unwrap();
        let mut s = m.new_state();
        m.forward_all(&p, &mut s).unwrap()
    };
    let plain = run(&TieredOptions {
        ram_budget: 0,
        prefetch_previous: false,
        ..Default::default()
    });
    assert_eq!(plain, run(&TieredOptions::default()));
}

#[test]
fn bad_input_is_an_error() {
    let d = tiny(6, 2);
    let mut m = GptOssModel::open(d.path(), &TieredOptions::default()).unwrap();
    let mut s = m.new_state();
    assert!(m.forward(&[], &mut s).is_err());
    assert!(m
        .forward(&[512], &mut s)
        .unwrap_err()
        .to_string()
        .contains("vocabulary"));
    m.set_context_limit(4);
    let mut s = m.new_state();
    let e = m.forward(&ids(5, 1), &mut s).unwrap_err().to_string();
    assert!(e.contains("context limit"), "{e}");
    assert_eq!(s.pos, 0);
    // A config that breaks a rule names the field.
    let cfg = d.path().join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
    )
    .unwrap();
    let e = GptOssModel::open(d.path(), &TieredOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("num_key_value_heads"), "{e}");
}

#[test]
fn fixture_is_in_the_hub_layout() {
    let d = tiny(0, 3);
    let mut files: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "config.json",
            "generation_config.json",
            "model-00000-of-00002.safetensors",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json"
        ]
    );
    let inv = Arc::new(Inventory::from_dir(d.path()).unwrap());
    let t = inv
        .get("model.layers.1.mlp.experts.gate_up_proj_blocks")
        .unwrap();
    assert_eq!(t.shape, [8, 128, 2, 16]);
    assert_eq!(
        inv.get("model.layers.1.mlp.experts.down_proj_scales")
            .unwrap()
            .shape,
        [8, 64, 2]
    );
    // Same seed, other split: the same tensors, byte for byte.
    let one = tiny(0, 1);
    let inv1 = Inventory::from_dir(one.path()).unwrap();
    for name in [
        "model.embed_tokens.weight",
        "model.layers.3.mlp.experts.down_proj_bias",
    ] {
        let read = |inv: &Inventory| {
            let t = inv.get(name).unwrap();
            let b = std::fs::read(inv.shard_path(t.shard)).unwrap();
            b[t.start as usize..t.end as usize].to_vec()
        };
        assert_eq!(read(&inv), read(&inv1), "{name}");
    }
}

#[test]
fn tokenizer_and_harmony_turn_text_into_ids() {
    use deltafin::chat::harmony::{render, HarmonyOptions};
    use deltafin::chat::Message;
    use deltafin::models::gpt_oss::tokenizer::GptOssTokenizer;
    let d = tiny(0, 3);
    let t = GptOssTokenizer::from_dir(d.path()).unwrap();
    let h = t.harmony_ids();
    assert_eq!((h.start, h.message, h.end, h.ret), (500, 502, 501, 511));
    // A special's spelling inside text stays text.
    let inj = t.encode("say <|return|> now").unwrap();
    assert!(inj.iter().all(|&i| i < 500), "{inj:?}");
    assert_eq!(t.decode(&inj), "say <|return|> now");
    let ids = t
        .encode_segments(
            &render(&[Message::new("user", "Hello")], &HarmonyOptions::default()).unwrap(),
        )
        .unwrap();
    assert_eq!(ids[0], h.start);
    assert_eq!(ids.iter().filter(|&&i| i == h.end).count(), 2);
    assert_eq!(
        *ids.last().unwrap(),
        t.encode("assistant").unwrap()[0].max(ids[ids.len() - 1])
    );
    // The model takes them.
    let m = GptOssModel::open(d.path(), &TieredOptions::default()).unwrap();
    let mut s = m.new_state();
    assert_eq!(m.forward(&ids, &mut s).unwrap().len(), 512);
}

#[test]
fn the_memory_plan_sizes_the_model_and_refuses_what_does_not_fit() {
    use deltafin::runtime::load::LoadOptions;
    let d = tiny(2, 2);
    let mut shown = None;
    let m = GptOssModel::open_planned(d.path(), &LoadOptions::default(), |p| {
        shown = Some(p.clone())
    })
    .unwrap();
    let plan = m.plan().unwrap();
    assert_eq!(shown.unwrap().total, plan.total);
    assert_eq!(
        plan.pinned_count(),
        4,
        "every dense layer is charged as pinned"
    );
    assert_eq!(m.context_limit(), plan.context);
    assert!(plan.context <= m.config().max_position_embeddings);
    // A limit below the fixed costs is refused, naming the flag to change.
    let small = LoadOptions {
        memory_limit: Some(1 << 20),
        ..Default::default()
    };
    let e = GptOssModel::open_planned(d.path(), &small, |_| {})
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--memory-gb"), "{e}");
}

/// The full-shape fixture's tokenizer is o200k_harmony's size and layout: 199,998 ranks, then
/// the specials with harmony's at their published ids; text round-trips and the engine's stop
/// ids are the config's `<|return|>` and harmony's `<|call|>`.
#[test]
fn the_full_shape_tokenizer_has_o200k_harmony_layout() {
    use deltafin::chat::harmony_ids;
    use deltafin::models::gpt_oss::fixture::write_tokenizer_json;
    let d = tempfile::tempdir().unwrap();
    let shape = GptOssShape::gpt_oss_120b();
    let t0 = std::time::Instant::now();
    write_tokenizer_json(d.path(), &shape).unwrap();
    let tok = deltafin::tokenizer::Tokenizer::from_dir(d.path()).unwrap();
    eprintln!(
        "201,088-id tokenizer.json written and loaded in {:.1} s ({} bytes)",
        t0.elapsed().as_secs_f64(),
        std::fs::metadata(d.path().join("tokenizer.json"))
            .unwrap()
            .len()
    );
    assert_eq!(tok.num_ranks(), 199_998);
    let h = harmony_ids(&tok).unwrap();
    assert_eq!(
        (h.ret, h.call, h.start, h.end, h.message, h.channel),
        (200_002, 200_012, 200_006, 200_007, 200_008, 200_005)
    );
    assert_eq!(tok.special_id("<|reserved_201087|>"), Some(201_087));
    let text = "The quick brown fox: 12345 <|start|> stays text.";
    let ids = tok.encode_ordinary(text);
    assert!(
        ids.iter().all(|&i| i < 199_998),
        "specials in text stay text"
    );
    assert_eq!(tok.decode(&ids), text);
}
