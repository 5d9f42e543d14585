//! KDA's `A_log` as the real checkpoint holds it (spec §3.4): one value per head, zero-padded to
//! `head_dim`. The fixtures write it so, the model reads only the per-head values (non-zero
//! padding changes nothing and is reported), and a tensor too short is refused by name.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

use candle::Device;
use deltafin::checkpoint::Inventory;
use deltafin::models::k3::config::AttnKind;
use deltafin::models::k3::config::K3Config;
use deltafin::models::k3::fixture::{write_medium, write_nano, NanoOptions};
use deltafin::models::k3::kda::a_log_padding;
use deltafin::models::k3::K3Model;

fn a_logs(root: &Path, cfg: &K3Config) -> Vec<(usize, Vec<f32>)> {
    let inv = Inventory::from_dir(root).unwrap();
    let kda = cfg.schedule.iter().enumerate();
    kda.filter(|(_, k)| k.attn == AttnKind::Kda)
        .map(|(l, _)| {
            let info = inv.get(&inv.layer_name(l, "self_attn.A_log")).unwrap();
            let mut b = vec![0u8; info.len() as usize];
            let f = std::fs::File::open(inv.shard_path(info.shard)).unwrap();
            f.read_exact_at(&mut b, info.start).unwrap();
            let v = b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()));
            (l, v.collect())
        })
        .collect()
}

fn logits(root: &Path, ids: &[u32]) -> Vec<f32> {
    let m = K3Model::from_dir(root, &Device::Cpu).unwrap();
    let mut st = m.new_state();
    m.forward(ids, &mut st).unwrap().to_vec1().unwrap()
}

/// Every fixture writes `A_log [head_dim]`: `num_heads` non-zero per-head values, then zeros.
#[test]
fn fixtures_pad_a_log_like_the_real_checkpoint() {
    for (name, seed) in [("nano", 0u64), ("nano", 7), ("medium", 3)] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = match name {
            "nano" => {
                let o = NanoOptions {
                    seed,
                    ..Default::default()
                };
                write_nano(dir.path(), &o).unwrap()
            }
            _ => write_medium(dir.path(), seed, 3).unwrap(),
        };
        let la = &cfg.text().linear_attn_config;
        let all = a_logs(dir.path(), &cfg);
        assert!(all.len() >= 2, "{name}: KDA layers");
        for (l, v) in all {
            assert_eq!(v.len(), la.head_dim, "{name} layer {l}");
            assert!(v[..la.num_heads].iter().all(|x| *x != 0.0), "{name} {l}");
            assert!(v[la.num_heads..].iter().all(|x| *x == 0.0), "{name} {l}");
        }
        let inv = Inventory::from_dir(dir.path()).unwrap();
        assert!(a_log_padding(&inv, &cfg).unwrap().is_empty());
    }
}

/// Non-zero padding is ignored (bit-identical logits) and reported for every KDA layer.
#[test]
fn a_log_padding_is_ignored_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_nano(dir.path(), &NanoOptions::default()).unwrap();
    let ids = [12, 7, 99, 300, 45, 3, 3, 200];
    let before = logits(dir.path(), &ids);
    let inv = Inventory::from_dir(dir.path()).unwrap();
    let heads = cfg.text().linear_attn_config.num_heads;
    let kda: Vec<usize> = a_logs(dir.path(), &cfg).iter().map(|x| x.0).collect();
    for &l in &kda {
        let info = inv.get(&inv.layer_name(l, "self_attn.A_log")).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(inv.shard_path(info.shard))
            .unwrap();
        let at = info.start + 4 * heads as u64;
        f.write_all_at(&0.7f32.to_le_bytes(), at).unwrap();
    }
    let after = logits(dir.path(), &ids);
    assert_eq!(before, after, "padding must not be read");
    let report = a_log_padding(&inv, &cfg).unwrap();
    let layers: Vec<usize> = report.iter().map(|p| p.layer).collect();
    assert_eq!(layers, kda);
    assert!(report.iter().all(|p| p.nonzero == 1 && p.max_abs == 0.7));
}

/// An `A_log` with fewer entries than heads is an error that names the tensor.
#[test]
fn a_log_shorter_than_the_heads_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_nano(dir.path(), &NanoOptions::default()).unwrap();
    let heads = cfg.text().linear_attn_config.num_heads;
    let inv = Inventory::from_dir(dir.path()).unwrap();
    let name = inv.layer_name(1, "self_attn.A_log");
    let shard = inv.shard_path(inv.get(&name).unwrap().shard);
    let bytes = std::fs::read(&shard).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut data: HashMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    let e = data.get_mut(&name).unwrap();
    e.1 = vec![heads - 1];
    e.2.truncate(4 * (heads - 1));
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, (d, s, b))| {
            let v = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &shard).unwrap();
    let err = match K3Model::from_dir(dir.path(), &Device::Cpu) {
        Ok(_) => panic!("an A_log of {} entries for {heads} heads loaded", heads - 1),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("A_log") && err.contains("one value per KDA head"),
        "{err}"
    );
}
