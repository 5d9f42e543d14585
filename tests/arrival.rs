//! Experts computed as their bytes arrive: any order of arrival gives the same bits, and the
//! tiered store hands over RAM-resident experts before it reads the rest.

mod common;

use std::sync::{Arc, Mutex};

use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{ExpertBytes, ExpertProvider, Ready, TieredExperts, TieredOptions};
use deltafin::models::k3::config::K3Config;

/// Delivers each layer's experts one at a time in reverse request order.
struct Reversed(Arc<TieredExperts>);

impl ExpertProvider for Reversed {
    fn fetch(&self, layer: usize, experts: &[usize]) -> deltafin::Result<Vec<ExpertBytes>> {
        self.0.fetch(layer, experts)
    }

    fn fetch_each(
        &self,
        layer: usize,
        experts: &[usize],
        ready: &mut Ready<'_>,
    ) -> deltafin::Result<()> {
        let all = self.0.fetch(layer, experts)?;
        for (i, b) in all.into_iter().enumerate().rev() {
            ready(&[(i, b)])?;
        }
        Ok(())
    }
}

fn tiered(root: &std::path::Path, ram: usize) -> Arc<TieredExperts> {
    let cfg = K3Config::from_file(&root.join("config.json")).unwrap();
    let inv = Arc::new(Inventory::from_dir(root).unwrap());
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg).unwrap());
    let o = TieredOptions {
        ram_budget: ram,
        prefetch_previous: false,
        ..Default::default()
    };
    Arc::new(TieredExperts::new(index, Some(inv), None, &o).unwrap())
}

fn logits(root: &std::path::Path, experts: Arc<dyn ExpertProvider>) -> Vec<Vec<u32>> {
    let m = common::model_over(root, experts);
    let mut st = m.new_state();
    // A prefill chunk (many experts per layer) and decode steps.
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 500).collect();
    let mut l = m
        .forward(&prompt, &mut st)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let mut out = vec![];
    for _ in 0..6 {
        out.push(l.iter().map(|x| x.to_bits()).collect());
        let n = deltafin::runtime::generate::argmax(&l);
        l = m.forward(&[n], &mut st).unwrap().to_vec1::<f32>().unwrap();
    }
    out
}

#[test]
fn any_arrival_order_gives_the_same_bits() {
    let root = common::nano();
    let want = logits(&root, tiered(&root, 0));
    let got = logits(&root, Arc::new(Reversed(tiered(&root, 0))));
    assert_eq!(got, want);
}

#[test]
fn ram_resident_experts_arrive_first() {
    let root = common::nano();
    let s = tiered(&root, 1 << 30);
    let cfg = K3Config::from_file(&root.join("config.json")).unwrap();
    let l = cfg.moe_layers().next().unwrap();
    s.fetch(l, &[3, 4]).unwrap(); // now in RAM
    let batches = Mutex::new(Vec::new());
    s.fetch_each(l, &[0, 3, 1, 4, 2], &mut |b| {
        batches
            .lock()
            .unwrap()
            .push(b.iter().map(|(i, _)| *i).collect::<Vec<_>>());
        Ok(())
    })
    .unwrap();
    let batches = batches.into_inner().unwrap();
    assert_eq!(batches[0], vec![1, 3], "RAM hits first: {batches:?}");
    let mut all: Vec<usize> = batches.concat();
    all.sort();
    assert_eq!(all, vec![0, 1, 2, 3, 4]);
    // The bytes handed over are the expert's span.
    let want = s.fetch(l, &[2]).unwrap();
    let mut got = None;
    s.fetch_each(l, &[2], &mut |b| {
        got = Some(b[0].1.clone());
        Ok(())
    })
    .unwrap();
    assert_eq!(got.unwrap().to_vec(), want[0].to_vec());
}
