//! End-to-end: the K3-nano fixture's inventory lists every tensor and every expert span.

use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::models::k3::config::{AttnKind, FfnKind};
use deltafin::models::k3::fixture::{write_nano, NanoOptions};

#[test]
fn inventory_reports_every_tensor_and_expert() {
    for shards in [2usize, 3, 5] {
        let dir = tempfile::tempdir().unwrap();
        let opts = NanoOptions {
            seed: 3,
            shards,
            contiguous_experts: true,
        };
        let cfg = write_nano(dir.path(), &opts).unwrap();
        let inv = Inventory::from_dir(dir.path()).unwrap();
        assert_eq!(inv.shards.len(), shards);
        // Spec §1.3 counts: layer 0 KDA+dense 23, KDA+MoE 28, MLA+MoE 22; 5 globals; 6 per expert.
        let t = cfg.text();
        let mut want = 5;
        for k in &cfg.schedule {
            want += match (k.attn, k.ffn) {
                (AttnKind::Kda, FfnKind::Dense) => 23,
                (AttnKind::Kda, FfnKind::Moe) => 28 + 6 * t.num_experts,
                (AttnKind::Mla, FfnKind::Moe) => 22 + 6 * t.num_experts,
                (AttnKind::Mla, FfnKind::Dense) => 17,
            };
        }
        assert_eq!(inv.len(), want);
        assert_eq!(inv.skipped, 2);
        let ex = ExpertIndex::derive_k3(&inv, &cfg).unwrap();
        assert_eq!(ex.count(), cfg.moe_layers().count() * t.num_experts);
        for l in cfg.moe_layers() {
            for e in 0..t.num_experts {
                let s = ex.span(l, e).unwrap();
                assert!(s.is_contiguous());
                assert_eq!(s.len() as usize, cfg.expert_span_bytes());
            }
        }
        // Schedule features K3 has: dense layer 0, MLA at l%4==3 and the last layer, >= 2 AttnRes boundaries.
        assert_eq!(cfg.schedule[0].ffn, FfnKind::Dense);
        let n = cfg.num_layers();
        assert_eq!(cfg.schedule[n - 1].attn, AttnKind::Mla);
        assert!((0..n).filter(|l| l % t.attn_res_block_size == 0).count() >= 2);
        assert!(t.num_experts_per_token < t.num_experts);
        assert!(t.routed_expert_hidden_size < t.hidden_size);
    }
}

#[test]
fn broken_checkpoints_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_nano(dir.path(), &NanoOptions::default()).unwrap();
    let inv = Inventory::from_dir(dir.path()).unwrap();
    let shard = dir.path().join(&inv.shards[1].file);

    // An index.json that disagrees with the headers.
    let mut map = serde_json::Map::new();
    for (name, t) in inv.iter() {
        map.insert(name.clone(), inv.shards[t.shard].file.clone().into());
    }
    let name = inv.iter().find(|(_, t)| t.shard == 0).unwrap().0.clone();
    map.insert(name, inv.shards[1].file.clone().into());
    let index = serde_json::json!({ "weight_map": map });
    let ipath = dir.path().join("model.safetensors.index.json");
    std::fs::write(&ipath, index.to_string()).unwrap();
    let err = Inventory::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("index.json"), "{err}");
    std::fs::remove_file(&ipath).unwrap();

    // A truncated shard names the file.
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let err = Inventory::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains(&inv.shards[1].file), "{err}");

    // A missing shard is reported.
    std::fs::remove_file(&shard).unwrap();
    let err = Inventory::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn duplicate_tensor_across_shards_is_an_error() {
    use deltafin::checkpoint::header::{build_header, Dtype};
    let dir = tempfile::tempdir().unwrap();
    for i in 1..=2 {
        let mut b = build_header(&[("x".into(), Dtype::U8, vec![4])]).unwrap();
        b.extend_from_slice(&[0; 4]);
        std::fs::write(
            dir.path()
                .join(format!("model-0000{i}-of-00002.safetensors")),
            b,
        )
        .unwrap();
    }
    let err = Inventory::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("appears in both"), "{err}");
}
