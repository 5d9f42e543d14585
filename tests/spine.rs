//! The spine store: resident / streamed / mixed layers, the row-int8 spine, resumable conversion.

mod common;

use std::sync::Arc;

use candle::Device;
use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{ExpertProvider, TieredExperts, TieredOptions};
use deltafin::models::k3::config::K3Config;
use deltafin::models::k3::fixture::{write_nano, NanoOptions};
use deltafin::models::k3::K3Model;
use deltafin::runtime::generate::{argmax, top_k};
use deltafin::spine::convert::{convert_spine, SpineFormat};
use deltafin::spine::source::Spine;
use deltafin::spine::source::{SpineChoice, SpineOptions};

const PROMPT: [u32; 6] = [12, 7, 99, 300, 45, 8];

fn fixture() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write_nano(d.path(), &NanoOptions::default()).unwrap();
    d
}

fn model(dir: &std::path::Path, opts: &SpineOptions) -> K3Model {
    let cfg = K3Config::from_file(&dir.join("config.json")).unwrap();
    let inv = Arc::new(Inventory::from_dir(dir).unwrap());
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg).unwrap());
    let spine = Spine::open(dir, inv.clone(), cfg.num_layers(), &Device::Cpu, opts).unwrap();
    let experts: Arc<dyn ExpertProvider> =
        Arc::new(TieredExperts::new(index, Some(inv), None, &TieredOptions::default()).unwrap());
    K3Model::load(cfg, Arc::new(spine), experts).unwrap()
}

/// Logits of the prompt and of 6 greedy steps.
fn run(m: &K3Model) -> Vec<Vec<f32>> {
    let mut st = m.new_state();
    let mut out = vec![m
        .forward(&PROMPT, &mut st)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()];
    for _ in 0..6 {
        let n = argmax(out.last().unwrap());
        out.push(m.forward(&[n], &mut st).unwrap().to_vec1::<f32>().unwrap());
    }
    out
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn resident_streamed_and_mixed_are_bit_identical() {
    let d = fixture();
    let opts = |b: Option<u64>| SpineOptions {
        choice: SpineChoice::Bf16,
        resident_bytes: b,
        ..Default::default()
    };
    let all = model(d.path(), &opts(None));
    assert_eq!(all.spine().report().layers_streamed, 0);
    let want = bits(&run(&all));
    let none = model(d.path(), &opts(Some(0)));
    assert_eq!(none.spine().report().layers_pinned, 0);
    assert_eq!(bits(&run(&none)), want, "all layers streamed");
    let half = all.spine().report().resident_bytes / 2;
    let mixed = model(d.path(), &opts(Some(half)));
    let r = mixed.spine().report();
    assert!(r.layers_pinned > 0 && r.layers_streamed > 0, "{r:?}");
    assert_eq!(bits(&run(&mixed)), want, "half streamed");
    // An explicit pin list (the memory plan's form), not a prefix: every other layer.
    let n = all.config().num_layers();
    let alternate = SpineOptions {
        pin: Some((0..n).map(|l| l % 2 == 1).collect()),
        ..opts(None)
    };
    let alt = model(d.path(), &alternate);
    assert_eq!(alt.spine().report().layers_pinned, n / 2);
    assert_eq!(bits(&run(&alt)), want, "every other layer pinned");
    // Mapping streamed layers needs the store: on the shards, an error naming the fix.
    let no_store = SpineOptions {
        mapped: true,
        ..opts(Some(0))
    };
    let inv = Arc::new(Inventory::from_dir(d.path()).unwrap());
    match Spine::open(d.path(), inv, n, &Device::Cpu, &no_store) {
        Ok(_) => panic!("mapped streaming opened on the shards"),
        Err(e) => assert!(e.to_string().contains("convert-spine"), "{e}"),
    }
    // The BF16 store (one read per layer) holds the same bytes as the shards.
    convert_spine(
        &Inventory::from_dir(d.path()).unwrap(),
        10,
        d.path(),
        SpineFormat::Bf16,
        |_, _| {},
    )
    .unwrap();
    let store = model(d.path(), &opts(Some(0)));
    assert!(store.spine().report().from_store);
    assert_eq!(bits(&run(&store)), want, "from the BF16 store, streamed");
    // Mapped for each pass (a budget below one layer), not read into buffers.
    let mapped = SpineOptions {
        mapped: true,
        ..opts(Some(0))
    };
    let m = model(d.path(), &mapped);
    assert!(m.spine().report().mapped && !m.spine().report().direct);
    assert_eq!(bits(&run(&m)), want, "from the BF16 store, mapped");
    assert_eq!(
        m.spine().bytes_read(),
        7 * m.spine().report().bytes_read_per_token,
        "one mapping of each streamed layer per pass"
    );
    // The first pass learns each layer's use order; the six after it read ahead in it.
    let ahead = m.spine().read_ahead_bytes();
    assert!(
        ahead > 0 && ahead <= 6 * m.spine().report().bytes_read_per_token,
        "{ahead} bytes read ahead"
    );
    let deep = SpineOptions {
        choice: SpineChoice::Bf16,
        resident_bytes: Some(0),
        in_flight: 4,
        ..Default::default()
    };
    assert_eq!(
        bits(&run(&model(d.path(), &deep))),
        want,
        "four layers in flight"
    );
    // One in flight (a tight memory plan): each layer read when asked for, in the pass's thread.
    let one = SpineOptions {
        in_flight: 1,
        ..deep.clone()
    };
    let single = model(d.path(), &one);
    assert!(!single.spine().report().mapped);
    assert_eq!(bits(&run(&single)), want, "one layer in flight");
    assert_eq!(
        single.spine().bytes_read(),
        7 * single.spine().report().bytes_read_per_token,
        "one read of each streamed layer per pass"
    );
    // Streamed store layers read with parallel O_DIRECT requests (where the filesystem allows).
    let direct = model(
        d.path(),
        &SpineOptions {
            direct: true,
            ..opts(Some(0))
        },
    );
    assert!(direct.spine().direct());
    assert_eq!(bits(&run(&direct)), want, "streamed with O_DIRECT");
}

/// Copies the built-in K3-tiny (a trained network) into a temporary directory.
fn tiny_copy() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(deltafin::assets::k3_tiny().unwrap()).unwrap() {
        let e = e.unwrap();
        // Its files (the drafter beside it is not needed here).
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
        }
    }
    d
}

/// Issue 5's criterion, on a trained network (K3-tiny): with the int8 spine the first step keeps
/// the top-5 order and moves the top logit by less than 1%; over held-out positions the median
/// move stays under 1% too (the figures are printed).
#[test]
fn int8_spine_stays_close_to_bf16() {
    let d = tiny_copy();
    let bf = model(
        d.path(),
        &SpineOptions {
            choice: SpineChoice::Bf16,
            ..Default::default()
        },
    );
    // Asking for int8 before the store exists is an error naming the command that makes it.
    let inv = Inventory::from_dir(d.path()).unwrap();
    let int8 = SpineOptions {
        choice: SpineChoice::Int8,
        ..Default::default()
    };
    let n = bf.config().num_layers();
    let err = Spine::open(d.path(), Arc::new(inv.clone()), n, &Device::Cpu, &int8)
        .err()
        .expect("no int8 store yet")
        .to_string();
    assert!(err.contains("convert-spine-int8"), "{err}");
    convert_spine(&inv, n, d.path(), SpineFormat::Int8, |_, _| {}).unwrap();
    let q = model(d.path(), &SpineOptions::default());
    assert_eq!(
        q.spine().format(),
        SpineFormat::Int8,
        "auto picks the converted int8 spine"
    );
    let tok = deltafin::tokenizer::Tokenizer::from_dir(d.path()).unwrap();
    let prompt = tok.encode_ordinary("It is a truth universally acknowledged, that a single man");
    let first = |m: &K3Model| {
        m.forward(&prompt, &mut m.new_state())
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    let (want, got) = (first(&bf), first(&q));
    let (a, b) = (top_k(&want, 5), top_k(&got, 5));
    let ids = |v: &[(u32, f32)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
    let moved = ((a[0].1 - got[a[0].0 as usize]) / a[0].1).abs();
    eprintln!(
        "int8 vs bf16, first step: top-5 {a:?} vs {b:?}; top logit moved {:.3}%",
        100.0 * moved
    );
    assert_eq!(ids(&a), ids(&b));
    assert!(moved < 0.01, "top logit moved by {:.3}%", 100.0 * moved);
    let held = tok.encode_ordinary(include_str!("../data/heldout/persuasion.txt"));
    let r = deltafin::eval::compare(&bf, &q, &held, 128, Some(2048)).unwrap();
    eprintln!("int8 vs bf16 over held-out positions: {r:?}");
    assert!(r.top_logit_rel_median < 0.01, "{r:?}");
}

#[test]
fn interrupted_conversion_resumes_to_identical_files() {
    let d = fixture();
    let inv = Inventory::from_dir(d.path()).unwrap();
    let dir = convert_spine(&inv, 10, d.path(), SpineFormat::Int8, |_, _| {}).unwrap();
    let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
    let files: Vec<String> = (0..10)
        .map(|l| format!("layer-{l:03}.bin"))
        .chain(["global.bin".into(), "embed.bin".into()])
        .collect();
    let want: Vec<Vec<u8>> = files.iter().map(|f| read(f)).collect();
    // An interruption: one file missing, one truncated, a stray temporary file.
    std::fs::remove_file(dir.join("layer-004.bin")).unwrap();
    let b = read("layer-007.bin");
    std::fs::write(dir.join("layer-007.bin"), &b[..b.len() / 3]).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stray = dir.join(format!(".layer-008.bin.{dead}.0.tmp"));
    std::fs::write(&stray, b"partial").unwrap();
    let mut calls = 0;
    convert_spine(&inv, 10, d.path(), SpineFormat::Int8, |_, _| calls += 1).unwrap();
    assert!(calls > 0);
    assert!(!stray.exists(), "the crashed writer's temporary is swept");
    for (f, w) in files.iter().zip(&want) {
        assert!(read(f) == *w, "{f} differs after resuming");
    }
}

/// Every int8 matrix dequantises to within half a quantisation step (plus the f16 rounding of
/// the scale) of the BF16 original, every file passes its checksums, and the first token still
/// matches.
#[test]
fn int8_matrices_are_within_half_a_step() {
    let d = fixture();
    let inv = Inventory::from_dir(d.path()).unwrap();
    convert_spine(&inv, 10, d.path(), SpineFormat::Int8, |_, _| {}).unwrap();
    let q = model(d.path(), &SpineOptions::default());
    let bf = model(
        d.path(),
        &SpineOptions {
            choice: SpineChoice::Bf16,
            ..Default::default()
        },
    );
    let mut checked = 0;
    let dir = deltafin::spine::convert::store_dir(d.path(), SpineFormat::Int8);
    let pool = deltafin::fsio::BufPool::new(1);
    let shards = deltafin::spine::ShardSpine::new(Arc::new(inv.clone()));
    for l in 0..10 {
        let ld = deltafin::spine::layer::read_file(&dir.join(format!("layer-{l:03}.bin")), &pool)
            .unwrap();
        ld.verify().unwrap();
        for name in deltafin::spine::convert::layer_names(&inv, l) {
            let (bytes, dtype, shape) = shards.bytes(&name).unwrap();
            let rel = name.strip_prefix(&inv.layer_name(l, "")).unwrap();
            if !deltafin::spine::convert::is_int8_target(&name, dtype, &shape) {
                continue;
            }
            let w = deltafin::spine::to_f32(&bytes, dtype, &name).unwrap();
            let m = ld.matrix(rel, shape[0], shape[1]).unwrap();
            for r in 0..shape[0] {
                let row = &w[r * shape[1]..(r + 1) * shape[1]];
                let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
                let step = if amax == 0.0 { 1.0 } else { amax / 127.0 };
                for (c, v) in row.iter().enumerate() {
                    // Rounding to the step, plus |q| ≤ 127 times the f16 rounding of the scale.
                    let bound = 0.5 * step + 127.0 * step / 2048.0 + 1e-7;
                    assert!((m.get(r, c) - v).abs() <= bound, "{name}[{r},{c}]");
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked}");
    let (a, b) = (run(&bf), run(&q));
    assert_eq!(argmax(&a[0]), argmax(&b[0]));
}

/// Converting to int8 from the BF16 store (a streaming install's only source) gives the same
/// files as from the shards and reads each store file once, not once per tensor.
#[test]
fn int8_from_the_bf16_store_reads_each_file_once() {
    use deltafin::spine::convert::{convert_spine_from, store_dir, StoreTensors};
    let d = fixture();
    let inv = Inventory::from_dir(d.path()).unwrap();
    convert_spine(&inv, 10, d.path(), SpineFormat::Bf16, |_, _| {}).unwrap();
    let from_shards = tempfile::tempdir().unwrap();
    convert_spine(&inv, 10, from_shards.path(), SpineFormat::Int8, |_, _| {}).unwrap();
    let out = tempfile::tempdir().unwrap();
    let src = StoreTensors::new(store_dir(d.path(), SpineFormat::Bf16), &inv);
    convert_spine_from(&src, &inv, 10, out.path(), SpineFormat::Int8, |_, _| {}).unwrap();
    assert_eq!(
        src.files_read(),
        10 + 2,
        "one read per layer file, global and embed"
    );
    for f in ["layer-000.bin", "layer-009.bin", "global.bin", "embed.bin"] {
        let a = std::fs::read(store_dir(out.path(), SpineFormat::Int8).join(f)).unwrap();
        let b = std::fs::read(store_dir(from_shards.path(), SpineFormat::Int8).join(f)).unwrap();
        assert!(a == b, "{f} differs");
    }
}
