//! MLA decode allocates nothing in proportion to heads × context: what one decode step of an MLA
//! layer allocates (counted by a global allocator) is the same at 1k and 8k cached positions,
//! and its time grows at most linearly with the context.

mod common;

use deltafin::models::k3::K3Model;
use deltafin::runtime::state::LayerState;

#[global_allocator]
static ALLOC: deltafin::alloc_count::CountingAlloc = deltafin::alloc_count::CountingAlloc;

/// `(peak bytes allocated, seconds)` of one MLA decode step with `n` positions cached.
fn step(m: &K3Model, l: usize, n: usize) -> (usize, f64) {
    let ld = m.spine().load_layer(l).unwrap();
    let h = m.config().text().hidden_size;
    let x = candle::Tensor::ones((1, h), candle::DType::F32, &candle::Device::Cpu).unwrap();
    let mut st = m.new_state();
    let LayerState::Rows(cache) = &mut st.layers[l] else {
        panic!("layer {l} is not MLA")
    };
    let w = cache.width();
    let rows: Vec<f32> = (0..n * w)
        .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
        .collect();
    cache.append(&rows);
    st.pos = n;
    m.attention(l, &x, &mut st, &ld).unwrap(); // capacity doubles here, once
    let base = deltafin::alloc_count::reset_peak();
    let t0 = std::time::Instant::now();
    for _ in 0..3 {
        m.attention(l, &x, &mut st, &ld).unwrap();
    }
    (
        deltafin::alloc_count::peak() - base,
        t0.elapsed().as_secs_f64() / 3.0,
    )
}

#[test]
fn mla_step_allocation_does_not_grow_with_context() {
    let mut m = K3Model::from_dir(&common::nano(), &candle::Device::Cpu).unwrap();
    m.set_context_limit(1 << 20);
    let l = m
        .config()
        .schedule
        .iter()
        .position(|k| k.attn == deltafin::models::k3::config::AttnKind::Mla)
        .unwrap();
    let (a1, t1) = step(&m, l, 1024);
    let (a8, t8) = step(&m, l, 8192);
    eprintln!(
        "1k: {a1} B, {:.3} ms; 8k: {a8} B, {:.3} ms",
        t1 * 1e3,
        t8 * 1e3
    );
    assert!(
        a8 <= a1 + (64 << 10),
        "one step allocates {a1} B at 1k positions but {a8} B at 8k"
    );
    // The time ratio is printed, not asserted: a speed claim belongs in `bench`, where a bound
    // is measured in the same run (a busy or emulated machine fails a timing assert).
}
