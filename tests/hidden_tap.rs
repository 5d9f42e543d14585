//! Hidden rows at named layers (`Event::LayerDone`, `HiddenTap`) on every registered family:
//! the ability a drafter that reads the target's hidden states needs. The values themselves are
//! checked against transformers' `output_hidden_states` in `scripts/hf_reference.py`.

#[path = "common/runner.rs"]
mod runner;

use std::sync::Arc;

use deltafin::runtime::observers::HiddenTap;
use deltafin::{Engine, EngineOptions};

fn fixture(name: &str, dir: &std::path::Path) {
    let out = runner::command(env!("CARGO_BIN_EXE_deltafin"))
        .args(["fixture", name])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let m = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    a.iter().zip(b).fold(0f32, |w, (x, y)| w.max((x - y).abs())) / m
}

/// The rows a prompt's one pass taps equal, row by row, those of feeding it one token per pass
/// (so the tap sees every position in order, whatever the pass shape and however many
/// chunks a pass holds), on K3, gpt-oss and
/// Qwen3-MoE; a layer the model lacks is absent.
#[test]
fn tapped_rows_cover_every_position_on_every_family() {
    let d = tempfile::tempdir().unwrap();
    // Longer than a prefill chunk, so one pass holds several chunks per layer.
    let prompt: Vec<u32> = (0..200u32).map(|i| (i * 37 + 5) % 200 + 1).collect();
    for name in ["nano", "gpt-oss-tiny", "qwen3-moe"] {
        let root = d.path().join(name);
        fixture(name, &root);
        let mut e = Engine::open(&root, &EngineOptions::default()).unwrap();
        let tap = Arc::new(HiddenTap::new(&[0, 1, 999]));
        e.model_mut().observe(tap.clone());
        let m = e.model();
        let mut st = m.new_state();
        m.forward_all(&prompt, &mut st).unwrap();
        let whole = tap.take();
        assert!(whole.iter().all(|t| t.first == 0), "{name}");
        assert_eq!(
            whole.iter().map(|t| t.layer).collect::<Vec<_>>(),
            [0, 1],
            "{name}"
        );
        let mut st = m.new_state();
        for &id in &prompt {
            m.forward(&[id], &mut st).unwrap();
        }
        let stepped = tap.take();
        for (w, s) in whole.iter().zip(&stepped) {
            assert!(w.width > 0, "{name}");
            assert_eq!(w.rows.len(), prompt.len() * w.width, "{name}");
            assert_eq!(s.rows.len(), w.rows.len(), "{name}");
            for (p, (a, b)) in w
                .rows
                .chunks(w.width)
                .zip(s.rows.chunks(s.width))
                .enumerate()
            {
                let r = rel(a, b);
                assert!(r < 1e-4, "{name} layer {} position {p}: rel {r}", w.layer);
            }
        }
        // Not the same rows at two layers (the tap does not repeat one layer).
        assert!(rel(&whole[0].rows, &whole[1].rows) > 1e-3, "{name}");
    }
}

/// A tap with a row limit keeps the most recent rows per layer and counts the dropped ones in
/// `first`: the rows it keeps are those an unlimited tap holds at the same positions.
#[test]
fn a_limited_tap_keeps_the_latest_rows_and_their_position() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("nano");
    fixture("nano", &root);
    let mut e = Engine::open(&root, &EngineOptions::default()).unwrap();
    let all = Arc::new(HiddenTap::new(&[2]));
    let few = Arc::new(HiddenTap::with_limit(&[2], 3));
    e.model_mut().observe(all.clone());
    e.model_mut().observe(few.clone());
    let m = e.model();
    let mut st = m.new_state();
    m.forward(&[3, 17, 5, 9, 30], &mut st).unwrap();
    m.forward(&[2], &mut st).unwrap();
    m.forward(&[11], &mut st).unwrap();
    let (a, f) = (&all.take()[0], &few.take()[0]);
    assert_eq!(a.first, 0);
    assert_eq!(a.rows.len(), 7 * a.width);
    assert_eq!(f.first, 4, "7 positions, 3 kept");
    assert_eq!(f.rows, a.rows[4 * a.width..]);
}
