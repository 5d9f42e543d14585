//! Long prompts and contexts on K3-nano: a 4,000-token prompt prefills in layer-major passes, a
//! cancel during it returns within one layer step's time and rewinds the state, the context
//! limit is enforced with an error that names it, generation stops at the limit, and prefetch
//! hints stay bounded by the last position's routes.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deltafin::experts::{ExpertBytes, ExpertProvider, TieredExperts, TieredOptions};
use deltafin::models::k3::K3Model;
use deltafin::{GenerateOptions, Generator, StopReason};

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = deltafin::checkpoint::rng::Rng::new(7);
    (0..n)
        .map(|_| rng.below(vocab as u64 - 300) as u32)
        .collect()
}

#[test]
fn long_prompt_prefills_and_cancels_within_a_layer() {
    let m = K3Model::from_dir(&common::nano(), &candle::Device::Cpu).unwrap();
    let vocab = m.config().text().vocab_size;
    let ids = prompt(4000, vocab);
    // The whole prompt, in layer-major passes, with a logits vector at the end.
    let mut st = m.new_state();
    let t0 = Instant::now();
    let logits = m.forward(&ids, &mut st).unwrap();
    let whole = t0.elapsed();
    assert_eq!(st.pos, 4000);
    assert_eq!(logits.dims1().unwrap(), vocab);
    // One layer of one pass: the most a cancel waits for.
    let steps = ids.len().div_ceil(m.options.pass_len()) * m.config().num_layers();
    let per_step = whole / steps as u32;
    eprintln!("4,000 tokens {whole:?}, {steps} layer steps, {per_step:?} each");
    // Cancel midway: returns within about one layer step of the flag being set, with the state
    // rewound to where the prompt began.
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    let delay = whole / 3;
    let setter = std::thread::spawn(move || {
        std::thread::sleep(delay);
        c.store(true, Ordering::SeqCst);
        Instant::now()
    });
    let mut st = m.new_state();
    let opts = GenerateOptions {
        max_new: 4,
        stop_ids: vec![],
        ..Default::default()
    };
    let g = Generator::new(&m)
        .generate(&mut st, &ids, &opts, &cancel, |_| {})
        .unwrap();
    let returned = Instant::now();
    let set_at = setter.join().unwrap();
    let lag = returned.saturating_duration_since(set_at);
    assert_eq!(g.stop, StopReason::Cancelled);
    assert!(g.generated_ids.is_empty());
    assert_eq!(
        st.pos, 0,
        "a cancelled prefill leaves the state where it began"
    );
    assert!(
        lag <= per_step * 2 + Duration::from_millis(50),
        "cancel took {lag:?}, one layer step takes {per_step:?}"
    );
}

#[test]
fn context_limit_is_enforced_and_named() {
    let mut m = K3Model::from_dir(&common::nano(), &candle::Device::Cpu).unwrap();
    let plan = m.plan().expect("from_dir loads under the memory plan");
    assert!(plan.context >= 4096 && m.context_limit() == plan.context);
    m.set_context_limit(50);
    let vocab = m.config().text().vocab_size;
    let mut st = m.new_state();
    let e = m.forward(&prompt(51, vocab), &mut st).unwrap_err();
    assert!(matches!(
        e,
        deltafin::Error::ContextLimit {
            needed: 51,
            limit: 50
        }
    ));
    let msg = e.to_string();
    assert!(msg.contains("50") && msg.contains("--context"), "{msg}");
    assert_eq!(st.pos, 0, "nothing consumed");
    // Generation stops (length) when the context is full.
    let opts = GenerateOptions {
        max_new: 100,
        stop_ids: vec![],
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let g = Generator::new(&m)
        .generate(&mut st, &prompt(45, vocab), &opts, &stop, |_| {})
        .unwrap();
    assert_eq!(g.stop, StopReason::Length);
    assert_eq!(st.pos, 50);
    assert_eq!(g.generated_ids.len(), 6);
}

/// Counts the hints the model gives (`note_routes`) around a real provider.
struct Counting {
    inner: Arc<TieredExperts>,
    most_hinted: std::sync::Mutex<usize>,
}

impl ExpertProvider for Counting {
    fn fetch(&self, layer: usize, experts: &[usize]) -> deltafin::Result<Vec<ExpertBytes>> {
        self.inner.fetch(layer, experts)
    }
    fn note_routes(&self, layer: usize, experts: &[usize]) {
        let mut m = self.most_hinted.lock().unwrap();
        *m = (*m).max(experts.len());
        self.inner.note_routes(layer, experts);
    }
    fn begin_token(&self) {
        self.inner.begin_token();
    }
    fn stats(&self) -> Option<deltafin::experts::ExpertStats> {
        Some(self.inner.stats())
    }
}

#[test]
fn prefetch_after_a_long_prefill_is_the_last_position_only_and_capped() {
    let dir = common::nano();
    let cfg = deltafin::models::k3::config::K3Config::from_file(&dir.join("config.json")).unwrap();
    let inv = Arc::new(deltafin::checkpoint::Inventory::from_dir(&dir).unwrap());
    let index = Arc::new(deltafin::checkpoint::ExpertIndex::derive_k3(&inv, &cfg).unwrap());
    let top_k = cfg.text().num_experts_per_token;
    let layers = cfg.moe_layers().count();
    let expert = cfg.expert_span_bytes() as u64;
    for cap_experts in [1000u64, 3] {
        let opts = TieredOptions {
            ram_budget: 0,
            prefetch_cap: cap_experts * expert,
            ..Default::default()
        };
        let store =
            Arc::new(TieredExperts::new(index.clone(), Some(inv.clone()), None, &opts).unwrap());
        let counting = Arc::new(Counting {
            inner: store.clone(),
            most_hinted: std::sync::Mutex::new(0),
        });
        let spine = deltafin::spine::source::Spine::open(
            &dir,
            inv.clone(),
            cfg.num_layers(),
            &candle::Device::Cpu,
            &Default::default(),
        )
        .unwrap();
        let m = K3Model::load(cfg.clone(), Arc::new(spine), counting.clone()).unwrap();
        let mut st = m.new_state();
        let ids = prompt(64, cfg.text().vocab_size);
        m.forward(&ids, &mut st).unwrap();
        let before = store.stats();
        assert_eq!(
            before.prefetch_issued, 0,
            "one chunk: nothing to prefetch yet"
        );
        m.forward(&[5], &mut st).unwrap();
        let d = store.stats().since(&before);
        assert!(d.prefetch_issued > 0, "{d:?}");
        assert!(
            d.prefetch_issued as usize <= top_k * layers,
            "first decode token prefetched {} experts; the last position chose at most {}",
            d.prefetch_issued,
            top_k * layers
        );
        assert!(*counting.most_hinted.lock().unwrap() <= top_k);
        let peak = store.stats().prefetch_peak_bytes;
        assert!(
            peak <= cap_experts * expert,
            "held {peak} B, cap {} B",
            cap_experts * expert
        );
    }
}
