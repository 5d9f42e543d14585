//! End-to-end correctness of the K3 forward pass on K3-nano.

mod common;

use std::sync::atomic::AtomicBool;

use candle::Device;
use common::{nano, reference::Reference, rel_err, rel_err32};
use deltafin::models::k3::K3Model;
use deltafin::models::k3::{KdaMode, MlaMode};
use deltafin::runtime::generate::argmax;
use deltafin::runtime::observe::RouteTrace;
use deltafin::runtime::state::SeqState;
use deltafin::{GenerateOptions, Generator};

const PROMPT: [u32; 5] = [12, 7, 99, 300, 45];

fn model() -> K3Model {
    K3Model::from_dir(&nano(), &Device::Cpu).unwrap()
}

fn logits(m: &K3Model, ids: &[u32], st: &mut SeqState) -> Vec<f32> {
    m.forward(ids, st).unwrap().to_vec1::<f32>().unwrap()
}

/// Model vs the independent f64 reference: logits within 1e-4 relative, the same greedy tokens
/// for 16 steps, the same routes everywhere.
#[test]
fn matches_independent_reference() {
    let m = model();
    let mut r = Reference::load(&nano());
    let mut st = m.new_state();
    let mut trace = RouteTrace::new();
    let mut got = m
        .forward_traced(&PROMPT, &mut st, Some(&mut trace))
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let mut want = Vec::new();
    let mut ref_routes = Vec::new();
    for &id in &PROMPT {
        let (lg, routes) = r.step(id);
        want = lg;
        ref_routes.push(routes);
    }
    // Prefill routes: trace[(layer, per-position routes)] vs reference per position.
    for (l, routes) in &trace {
        for (pos, rt) in routes.iter().enumerate() {
            let want = &ref_routes[pos].iter().find(|(rl, _)| rl == l).unwrap().1;
            assert_eq!(&rt.experts, want, "layer {l} position {pos}");
        }
    }
    for step in 0..16 {
        let e = rel_err(&got, &want);
        assert!(e < 1e-4, "step {step}: logits differ by {e:e} (relative)");
        let next = argmax(&got);
        let ref_next = want
            .iter()
            .enumerate()
            .fold(0, |b, (i, v)| if *v > want[b] { i } else { b }) as u32;
        assert_eq!(next, ref_next, "step {step}");
        let mut trace = RouteTrace::new();
        got = m
            .forward_traced(&[next], &mut st, Some(&mut trace))
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let (lg, routes) = r.step(next);
        want = lg;
        for ((l, rt), (rl, re)) in trace.iter().zip(&routes) {
            assert_eq!(l, rl);
            assert_eq!(&rt[0].experts, re, "step {step} layer {l}");
        }
    }
}

fn state_close(a: &SeqState, b: &SeqState, tol: f64) {
    use deltafin::runtime::state::LayerState;
    assert_eq!(a.pos, b.pos);
    for (x, y) in a.layers.iter().zip(&b.layers) {
        match (x, y) {
            (LayerState::Recurrent(x), LayerState::Recurrent(y)) => {
                // KDA: the conv window and the recurrent matrix.
                assert_eq!(x.buffers.len(), y.buffers.len());
                for (bx, by) in x.buffers.iter().zip(&y.buffers) {
                    let e = rel_err32(bx, by);
                    assert!(e < tol, "kda state {e}");
                }
            }
            (LayerState::Rows(x), LayerState::Rows(y)) => {
                let (a, b) = (x.rows(), y.rows());
                assert_eq!(a.len(), b.len());
                assert!(rel_err32(a, b) < tol, "mla cache {:e}", rel_err32(a, b));
            }
            _ => panic!("layer kinds differ"),
        }
    }
}

/// Prefill of T tokens vs T single steps: same next token, logits within 1e-5, same state.
#[test]
fn prefill_equals_single_steps() {
    let mut m = model();
    let prompt: Vec<u32> = (0..64).map(|i| (i * 37 + 11) % 400).collect();
    let mut s1 = m.new_state();
    let mut one = Vec::new();
    for &id in &prompt {
        one = logits(&m, &[id], &mut s1);
    }
    for chunk in [64usize, 16, 7] {
        m.options.prefill_chunk = chunk;
        let mut s2 = m.new_state();
        let all = logits(&m, &prompt, &mut s2);
        assert_eq!(argmax(&all), argmax(&one), "chunk {chunk}");
        let e = rel_err32(&all, &one);
        assert!(e < 1e-5, "chunk {chunk}: logits differ by {e:e}");
        // Batched projections round differently from T=1 ones; the state stays within 1e-4.
        state_close(&s1, &s2, 1e-4);
    }
}

/// The chunked KDA form inside the model gives the same tokens as the recurrence.
#[test]
fn chunked_kda_in_model() {
    let mut m = model();
    let prompt: Vec<u32> = (0..50).map(|i| (i * 13 + 5) % 400).collect();
    let mut s1 = m.new_state();
    let a = logits(&m, &prompt, &mut s1);
    m.options.kda = KdaMode::Chunked(16);
    let mut s2 = m.new_state();
    let b = logits(&m, &prompt, &mut s2);
    assert_eq!(argmax(&a), argmax(&b));
    let e = rel_err32(&b, &a);
    assert!(e < 1e-4, "{e:e}");
    state_close(&s1, &s2, 1e-4);
}

/// Compact (absorbed) MLA cache vs the expanded form.
#[test]
fn compact_mla_matches_expanded() {
    let mut m = model();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 400).collect();
    let mut s1 = m.new_state();
    let mut a = logits(&m, &prompt, &mut s1);
    m.options.mla = MlaMode::Expanded;
    let mut s2 = m.new_state();
    let mut b = logits(&m, &prompt, &mut s2);
    for _ in 0..4 {
        let e = rel_err32(&a, &b);
        assert!(e < 1e-5, "{e:e}");
        let n = argmax(&a);
        assert_eq!(n, argmax(&b));
        m.options.mla = MlaMode::Compact;
        a = logits(&m, &[n], &mut s1);
        m.options.mla = MlaMode::Expanded;
        b = logits(&m, &[n], &mut s2);
    }
}

/// Restore then continue is bit-identical to never having left.
#[test]
fn snapshot_restore_is_exact() {
    let m = model();
    let mut st = m.new_state();
    let first = logits(&m, &PROMPT, &mut st);
    let snap = st.snapshot();
    let run = |st: &mut SeqState| {
        let mut out = Vec::new();
        let mut lg = first.clone();
        for _ in 0..6 {
            let n = argmax(&lg);
            lg = logits(&m, &[n], st);
            out.push(lg.clone());
        }
        out
    };
    let a = run(&mut st);
    // A detour that mutates the state, then back.
    logits(&m, &[1, 2, 3], &mut st);
    st.restore(&snap);
    let b = run(&mut st);
    for (x, y) in a.iter().zip(&b) {
        assert!(x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()));
    }
}

/// A checkpoint whose expert tensors are scattered in the shard gives the same tokens.
#[test]
fn scattered_experts_same_tokens() {
    use deltafin::models::k3::fixture::{write_nano, NanoOptions};
    let dir = tempfile::tempdir().unwrap();
    write_nano(
        dir.path(),
        &NanoOptions {
            contiguous_experts: false,
            shards: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let scattered = K3Model::from_dir(dir.path(), &Device::Cpu).unwrap();
    let m = model();
    let opts = GenerateOptions {
        max_new: 8,
        stop_ids: vec![],
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let a = Generator::new(&m)
        .generate(&mut m.new_state(), &PROMPT, &opts, &stop, |_| {})
        .unwrap();
    let b = Generator::new(&scattered)
        .generate(&mut scattered.new_state(), &PROMPT, &opts, &stop, |_| {})
        .unwrap();
    assert_eq!(a.generated_ids, b.generated_ids);
    assert_eq!(a.first_step_top, b.first_step_top);
}

/// Generation stops on the end-of-message id, at max_new, and when cancelled.
#[test]
fn generator_stop_rules() {
    let m = model();
    let stop = AtomicBool::new(false);
    let g = Generator::new(&m);
    let opts = GenerateOptions {
        max_new: 5,
        stop_ids: vec![],
        ..Default::default()
    };
    let mut seen = Vec::new();
    let a = g
        .generate(&mut m.new_state(), &PROMPT, &opts, &stop, |t| seen.push(t))
        .unwrap();
    assert_eq!(a.generated_ids.len(), 5);
    assert_eq!(seen, a.generated_ids);
    // Stop on the second generated token.
    let opts2 = GenerateOptions {
        max_new: 5,
        stop_ids: vec![a.generated_ids[1]],
        ..Default::default()
    };
    let b = g
        .generate(&mut m.new_state(), &PROMPT, &opts2, &stop, |_| {})
        .unwrap();
    assert_eq!(b.generated_ids, a.generated_ids[..2].to_vec());
    assert_eq!(b.stop, deltafin::runtime::generate::StopReason::Stop);
    // Cancelled after the first token.
    let cancel = AtomicBool::new(false);
    let c = g
        .generate(&mut m.new_state(), &PROMPT, &opts, &cancel, |_| {
            cancel.store(true, std::sync::atomic::Ordering::SeqCst)
        })
        .unwrap();
    assert_eq!(c.generated_ids.len(), 1);
    assert_eq!(c.stop, deltafin::runtime::generate::StopReason::Cancelled);
    // Bad ids are errors, not panics.
    assert!(m.forward(&[u32::MAX], &mut m.new_state()).is_err());
    assert!(m.forward(&[], &mut m.new_state()).is_err());
}

/// A K3-format checkpoint of other shapes than K3-nano (9 layers so the last MLA layer is not at
/// l%4==3, 12 experts with top-3, other head counts and ranks, AttnRes blocks of 3, experts
/// stored part-major across 3 shards): the model still matches the independent reference.
#[test]
fn matches_reference_on_other_shapes() {
    use deltafin::checkpoint::tiktoken_fixture::train_ranks;
    use deltafin::models::k3::fixture::{k3_style_config, model_units, write_model, NANO_MERGES};
    let d = tempfile::tempdir().unwrap();
    let ranks = train_ranks(NANO_MERGES);
    let first = ranks.len() as u32;
    let config = k3_style_config(
        64,
        9,
        first as usize + 256,
        96,
        12,
        3,
        64,
        32,
        (2, 24, 16, 8, 8, 12),
        (2, 16),
        3,
        first,
    );
    let cfg = deltafin::models::k3::config::K3Config::from_root(
        serde_json::from_value(config.clone()).unwrap(),
    )
    .unwrap();
    let units = model_units(&cfg, "language_model.", false, false);
    write_model(d.path(), &config, units, 3, 11, &ranks, false).unwrap();
    let m = K3Model::from_dir(d.path(), &Device::Cpu).unwrap();
    let mut r = Reference::load(d.path());
    let mut st = m.new_state();
    let ids = [5u32, 17, 230, 3, 64, 9, 100];
    let mut want = Vec::new();
    for &id in &ids {
        want = r.step(id).0;
    }
    let mut got = logits(&m, &ids, &mut st);
    for step in 0..6 {
        let e = rel_err(&got, &want);
        assert!(e < 1e-4, "step {step}: logits differ by {e:e} (relative)");
        let next = argmax(&got);
        got = logits(&m, &[next], &mut st);
        want = r.step(next).0;
    }
}

/// Records every event of a pass as a short name (with the layer).
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<(usize, String)>>);

impl deltafin::runtime::observe::Observer for Recorder {
    fn on(&self, layer: usize, event: &deltafin::runtime::observe::Event<'_>) {
        use deltafin::runtime::observe::Event;
        let name = match event {
            Event::PassStart { first_pos, tokens } => format!("start {first_pos} {tokens}"),
            Event::LayerReady { attn, ffn } => format!("ready {attn} {ffn}"),
            Event::AttentionIn => "attn-in".into(),
            Event::Attention(t) => format!("attn {:?}", t.dims()),
            Event::FfnIn => "ffn-in".into(),
            Event::Routes(r) => format!("routes {}", r.len()),
            Event::Ffn(t) => format!("ffn {:?}", t.dims()),
            Event::LayerDone(t) => {
                let n = t.to_f32().unwrap().len();
                format!("done {:?}", [n / t.width(), t.width()])
            }
            Event::Kept { rows } => format!("kept {rows}"),
            Event::PassEnd => "end".into(),
            Event::Prefill(s) => format!("prefill {} {} {}", s.layer, s.pass, s.positions),
        };
        self.0.lock().unwrap().push((layer, name));
    }
}

/// An attached observer sees each layer's events in order (routes only on MoE layers; a prefill
/// step after each layer of a prompt) and does not change the logits; the route collector sees the routes the reference chooses.
#[test]
fn observers_see_every_layer_in_order() {
    let plain = model();
    let mut m = model();
    let rec = std::sync::Arc::new(Recorder::default());
    m.observe(rec.clone());
    let (mut a, mut b) = (plain.new_state(), m.new_state());
    let want = logits(&plain, &PROMPT, &mut a);
    let got = logits(&m, &PROMPT, &mut b);
    assert_eq!(got, want, "an observer changed the logits");
    let events = rec.0.lock().unwrap().clone();
    let h = m.config().text().hidden_size;
    let t = PROMPT.len();
    let mut expect = vec![(0, format!("start 0 {t}"))];
    for (l, kind) in m.config().schedule.iter().enumerate() {
        let attn = format!("{:?}", kind.attn).to_lowercase();
        let moe = matches!(kind.ffn, deltafin::models::k3::config::FfnKind::Moe);
        let ffn = if moe { "moe" } else { "dense" };
        expect.push((l, format!("ready {attn} {ffn}")));
        expect.push((l, "attn-in".into()));
        expect.push((l, format!("attn [{t}, {h}]")));
        expect.push((l, "ffn-in".into()));
        if moe {
            expect.push((l, format!("routes {t}")));
        }
        expect.push((l, format!("ffn [{t}, {h}]")));
        expect.push((l, format!("done [{t}, {h}]")));
        expect.push((l, format!("prefill {l} 0 {t}")));
    }
    expect.push((0, "end".into()));
    assert_eq!(events, expect);
    // A decode step starts at the next position.
    logits(&m, &[1], &mut b);
    assert_eq!(
        rec.0.lock().unwrap()[expect.len()],
        (0, format!("start {t} 1"))
    );
}
