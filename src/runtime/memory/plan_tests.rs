use super::super::GB;
use super::*;

/// K3's real spine: layer 0 (KDA + dense), KDA + MoE layers, MLA + MoE layers (spec §2.5).
fn k3_layers() -> Vec<u64> {
    (0..93)
        .map(|l| match l {
            0 => 2_341_213_184,
            l if l % 4 == 3 || l == 92 => 844_335_616,
            _ => 1_267_744_256,
        })
        .collect()
}

fn k3(limit: Option<u64>) -> PlanInputs {
    PlanInputs {
        memory: Memory {
            total: 24 * GB,
            available: 23 * GB,
            cgroup_limit: None,
        },
        limit_override: limit,
        layer_bytes: k3_layers(),
        global_bytes: 2_348_810_240,
        small_bytes: 60_000_000,
        device_copies: false,
        in_flight: 2,
        largest_store_tensor: None,
        expert_bytes: 17_547_264,
        expert_ram: None,
        prefetch: true,
        pool_buffers: 16,
        expert_batch: 32,
        state_fixed: 434_000_000,
        state_per_position: 55_296,
        context: None,
        max_context: 1 << 20,
        saved_states: 0,
        batch: Some(1),
        prompt_cache: 0,
        activation_bytes: 200_000_000,
        pass_row_bytes: 600_000,
        prefill_chunk: 64,
        baseline: 300_000_000,
        resident_cap: None,
        reserve_override: None,
        spine_resident: false,
    }
}

#[test]
fn every_consumer_fits_the_budget() {
    // 6 GB cannot hold lm_head and one layer-0 template: a clear error, not an OOM.
    let e = MemoryPlan::new(&k3(Some(6 * GB))).unwrap_err().to_string();
    assert!(e.contains("--context") && e.contains("in flight"), "{e}");
    for gb_ in [12u64, 16, 23, 64, 512] {
        let p = MemoryPlan::new(&k3(Some(gb_ * GB))).unwrap();
        assert_eq!(p.total, p.lines.iter().map(|l| l.bytes).sum::<u64>());
        assert!(p.total <= p.limit - p.reserve, "{gb_} GB: {p}");
        // The in-flight line covers the largest streamed layer twice.
        let streamed_max = (0..93)
            .filter(|&l| !p.pinned[l])
            .map(|l| k3_layers()[l])
            .max()
            .unwrap_or(0);
        let inflight = p
            .lines
            .iter()
            .find(|l| l.what.contains("in flight (2"))
            .unwrap();
        assert_eq!(inflight.bytes, 2 * streamed_max, "{p}");
    }
}

#[test]
fn a_smaller_machine_pins_fewer_layers() {
    let big = MemoryPlan::new(&k3(None)).unwrap();
    let small = MemoryPlan::new(&k3(Some(12 * GB))).unwrap();
    assert_eq!(big.limit, 23 * GB);
    assert_eq!(big.limit_source, "MemAvailable");
    assert!(big.pinned_count() > small.pinned_count(), "{big}\n{small}");
    // 512 GB pins the whole 108.8 GB of layers.
    assert_eq!(
        MemoryPlan::new(&k3(Some(512 * GB))).unwrap().pinned_count(),
        93
    );
}

#[test]
fn context_is_picked_and_checked() {
    let p = MemoryPlan::new(&k3(None)).unwrap();
    assert!(
        p.context.is_power_of_two() && p.context >= 4096,
        "{}",
        p.context
    );
    let state = p
        .lines
        .iter()
        .find(|l| l.what.starts_with("sequence state"))
        .unwrap();
    assert!(state.bytes <= (p.limit - p.reserve) / 10);
    let mut i = k3(None);
    i.context = Some(2 << 20);
    let e = MemoryPlan::new(&i).unwrap_err().to_string();
    assert!(e.contains("max_position_embeddings"), "{e}");
    // A context that cannot fit names the flag.
    i.context = Some(1 << 20);
    let e = MemoryPlan::new(&i).unwrap_err().to_string();
    assert!(e.contains("--context"), "{e}");
}

#[test]
fn saved_states_device_copies_and_caps_are_charged() {
    let base = MemoryPlan::new(&k3(None)).unwrap();
    let mut i = k3(None);
    i.saved_states = 1;
    i.context = Some(base.context);
    let saved = MemoryPlan::new(&i).unwrap();
    let st = |p: &MemoryPlan| {
        p.lines
            .iter()
            .find(|l| l.what.starts_with("sequence state"))
            .unwrap()
            .bytes
    };
    assert_eq!(st(&saved), 2 * st(&base));
    let mut i = k3(Some(64 * GB));
    let host = MemoryPlan::new(&i).unwrap();
    i.device_copies = true;
    let dev = MemoryPlan::new(&i).unwrap();
    assert!(dev.pinned_count() < host.pinned_count());
    assert!(dev.total <= dev.limit - dev.reserve);
    let mut i = k3(Some(64 * GB));
    i.resident_cap = Some(0);
    assert_eq!(MemoryPlan::new(&i).unwrap().pinned_count(), 0);
    i.prefetch = false;
    assert_eq!(MemoryPlan::new(&i).unwrap().prefetch_cap, 0);
    i.expert_ram = Some(100 * GB);
    let e = MemoryPlan::new(&i).unwrap_err().to_string();
    assert!(e.contains("--ram-gb"), "{e}");
}

#[test]
fn degenerate_inputs_stay_bounded() {
    // No MLA layer (nothing grows with the context) and no configured maximum: the picked
    // context stays finite.
    let mut i = k3(None);
    i.state_per_position = 0;
    i.max_context = usize::MAX;
    let p = MemoryPlan::new(&i).unwrap();
    assert!(p.context <= 1 << 30);
    // A huge explicit context saturates instead of wrapping, and does not fit.
    i.state_per_position = 55_296;
    i.context = Some(usize::MAX / 2);
    assert!(MemoryPlan::new(&i).is_err());
    // A prefetch cap below one expert would never read: prefetch is off.
    let mut i = k3(Some(12 * GB));
    i.expert_bytes = 2 * GB;
    i.expert_batch = 0;
    i.pool_buffers = 0;
    assert_eq!(MemoryPlan::new(&i).unwrap().prefetch_cap, 0);
}

#[test]
fn prefill_pass_is_charged_and_sized_by_the_budget() {
    let mut last = 0;
    for gb_ in [16u64, 23, 64, 512] {
        let p = MemoryPlan::new(&k3(Some(gb_ * GB))).unwrap();
        let line = p
            .lines
            .iter()
            .find(|l| l.what.starts_with("prefill pass"))
            .unwrap_or_else(|| panic!("{gb_} GB: no prefill pass line: {p}"));
        assert_eq!(line.bytes, p.prefill_pass as u64 * 600_000, "{gb_} GB");
        assert!(p.prefill_pass.is_multiple_of(64) && (64..=4096).contains(&p.prefill_pass));
        assert!(line.bytes <= (p.limit - p.reserve) / 10, "{gb_} GB: {p}");
        assert!(
            p.prefill_pass >= last,
            "a larger budget never shortens the pass"
        );
        last = p.prefill_pass;
        // The KDA states a cancelled prefill returns to are charged.
        assert!(p
            .lines
            .iter()
            .any(|l| l.what.contains("before the turn") && l.bytes == 434_000_000));
    }
    assert_eq!(last, 4096, "512 GB holds the longest pass");
    // A machine that can only just run the model gets a shorter pass, not an error.
    let small = MemoryPlan::new(&k3(Some(12 * GB))).unwrap();
    let roomy = MemoryPlan::new(&k3(Some(23 * GB))).unwrap();
    assert!(small.prefill_pass < roomy.prefill_pass, "{small}");
    // Never longer than the context.
    let mut i = k3(Some(64 * GB));
    i.context = Some(100);
    assert_eq!(MemoryPlan::new(&i).unwrap().prefill_pass, 64);
}

#[test]
fn the_batch_is_charged_and_picked_from_the_budget() {
    let st = |p: &MemoryPlan| {
        p.lines
            .iter()
            .find(|l| l.what.starts_with("sequence state"))
            .unwrap()
            .bytes
    };
    let one = MemoryPlan::new(&k3(Some(64 * GB))).unwrap();
    assert_eq!(one.max_batch, 1);
    let mut i = k3(Some(64 * GB));
    i.context = Some(one.context);
    i.batch = Some(6);
    let six = MemoryPlan::new(&i).unwrap();
    assert_eq!(six.max_batch, 6);
    assert_eq!(st(&six), 6 * st(&one), "each sequence's state is charged");
    assert!(six.pinned_count() <= one.pinned_count());
    // The plan's own choice: as many as fit a quarter of the budget, at most 8.
    i.batch = None;
    let auto = MemoryPlan::new(&i).unwrap();
    let budget = auto.limit - auto.reserve;
    assert!((1..=8).contains(&auto.max_batch));
    assert!(st(&auto) <= budget / 4, "{auto}");
    if auto.max_batch < 8 {
        assert!(st(&auto) / auto.max_batch as u64 * (auto.max_batch as u64 + 1) > budget / 4);
    }
    // A batch that cannot fit is an error naming the largest costs.
    i.batch = Some(4096);
    let e = MemoryPlan::new(&i).unwrap_err().to_string();
    assert!(e.contains("sequence states"), "{e}");
}

/// A family that keeps its dense layers resident (gpt-oss's shape: six 0.4 GB layers, a
/// 1.2 GB lm_head) gets them before the RAM tier: the auto tier takes only what is left.
#[test]
fn a_resident_spine_comes_before_the_ram_tier() {
    let resident = |limit: u64, ram: Option<u64>| {
        let mut i = k3(Some(limit));
        i.layer_bytes = vec![400_000_000; 6];
        i.global_bytes = 1_200_000_000;
        i.state_fixed = 0;
        i.in_flight = 1;
        i.spine_resident = true;
        i.expert_ram = ram;
        i.context = Some(4096);
        MemoryPlan::new(&i)
    };
    for gb_ in [8u64, 12, 24] {
        let p = resident(gb_ * GB, None).unwrap();
        assert_eq!(p.pinned_count(), 6, "{gb_} GB: {p}");
        assert!(p.total <= p.limit - p.reserve, "{gb_} GB: {p}");
    }
    // An asked RAM tier that leaves no room for the layers is refused by name.
    let e = resident(8 * GB, Some(3 * GB)).unwrap_err().to_string();
    assert!(e.contains("--ram-gb"), "{e}");
    // Too small for 32 expert reads at once: fewer are held, down to what fits.
    let p = resident(13 * GB / 2, None).unwrap();
    assert!(p.expert_batch < 32 && p.expert_batch >= 1, "{p}");
    assert!(p.total <= p.limit - p.reserve, "{p}");
    assert!(
        p.to_string()
            .contains(&format!("({} experts)", p.expert_batch)),
        "{p}"
    );
    assert_eq!(resident(24 * GB, None).unwrap().expert_batch, 32);
    // Nothing is left to pin: the automatic RAM tier takes the whole budget but the prefetch
    // cap (it was a fifth, and the rest stayed idle).
    let p = resident(12 * GB, None).unwrap();
    assert_eq!(p.total, p.limit - p.reserve, "{p}");
    assert!(p.expert_ram > 4 * GB && p.prefetch_cap > 0, "{p}");
    // Too small for the layers themselves: the error names them.
    let e = resident(6 * GB, None).unwrap_err().to_string();
    assert!(e.contains("dense layers kept resident"), "{e}");
    // The reserve scales down with a small limit, and `--reserve-gb` replaces it.
    let mut i = k3(Some(2 * GB));
    assert_eq!(reserve(2 * GB), GB / 2);
    i.reserve_override = Some(GB / 4);
    let e = MemoryPlan::new(&i).unwrap_err().to_string();
    assert!(e.contains("0.25 GB reserve"), "{e}");
}

/// Where two streamed layers do not fit but one does (K3 at 10 GB: two layer-0 templates are
/// 4.7 GB), the plan holds one, reading the next after it; where two fit, it keeps two.
#[test]
fn a_tight_budget_streams_one_layer_at_a_time() {
    let line = |p: &MemoryPlan, depth: usize| {
        p.lines
            .iter()
            .find(|l| l.what.contains(&format!("in flight ({depth} ×")))
            .map(|l| l.bytes)
    };
    let p = MemoryPlan::new(&k3(Some(10 * GB))).unwrap();
    assert_eq!(p.in_flight, 1, "{p}");
    assert!(p.total <= p.limit - p.reserve, "{p}");
    assert_eq!(line(&p, 1), Some(k3_layers()[0]), "{p}");
    // Each depth starts from the family's expert batch: with one layer in flight all 32 fit.
    assert_eq!(p.expert_batch, 32, "{p}");
    let p = MemoryPlan::new(&k3(Some(16 * GB))).unwrap();
    assert_eq!(p.in_flight, 2, "{p}");
    assert!(line(&p, 2).is_some(), "{p}");
}

/// Below one streamed layer, a spine from the store is mapped (the largest tensor charged in the
/// page cache); gathered from the shards (no store), the same budget is refused by name.
#[test]
fn a_budget_below_one_layer_maps_the_store() {
    let tight = |store: Option<u64>| {
        let mut i = k3(Some(7 * GB));
        i.largest_store_tensor = store;
        MemoryPlan::new(&i)
    };
    let e = tight(None).unwrap_err().to_string();
    assert!(
        e.contains("in flight") && e.contains("convert-spine"),
        "{e}"
    );
    // K3's largest spine tensor: a dense MLP projection, 33,792 × 7,168 BF16.
    let t = 484_442_112;
    let p = tight(Some(t)).unwrap();
    assert!(p.mapped_stream && p.in_flight == 1, "{p}");
    // Below the mapped floor too, the refusal names it (and no store hint: there is one).
    let mut i = k3(Some(5 * GB));
    i.largest_store_tensor = Some(t);
    let e = MemoryPlan::new(&i).unwrap_err().to_string();
    assert!(e.contains("mapped") && !e.contains("convert-spine"), "{e}");
    assert!(p.total <= p.limit - p.reserve, "{p}");
    let mapped = p.lines.iter().find(|l| l.what.contains("mapped")).unwrap();
    assert_eq!(mapped.bytes, t, "{p}");
    // Where one layer fits, layers are read, not mapped.
    let mut i = k3(Some(10 * GB));
    i.largest_store_tensor = Some(t);
    let p = MemoryPlan::new(&i).unwrap();
    assert!(!p.mapped_stream && p.in_flight == 1, "{p}");
}
