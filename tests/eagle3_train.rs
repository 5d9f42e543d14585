//! The trained EAGLE-3 head is the head the drafter runs: the training network's unrolled
//! draft steps (`drafters::eagle3::train::net`) give the logits the exported checkpoint gives
//! when `Eagle3Head` runs the same chain through its cache, step by step.

use candle::{Device, Tensor};
use deltafin::drafters::eagle3::train::net::{Batch, HeadDims, HeadNet};
use deltafin::drafters::eagle3::train::{export, WeightDtype};
use deltafin::drafters::eagle3::{DraftCache, Eagle3Head, HeadInput};

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let d: f32 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f32>()
        .sqrt();
    let n: f32 = b.iter().map(|y| y * y).sum::<f32>().sqrt();
    d / n.max(1e-12)
}

#[test]
fn the_trained_network_equals_the_exported_head_over_a_draft_chain() {
    let dims = HeadDims {
        hidden: 16,
        target_hidden: 12,
        heads: 2,
        head_dim: 8,
        intermediate: 24,
        vocab: 50,
        draft_vocab: 20,
    };
    let net = HeadNet::init(dims, 7, &Device::Cpu).unwrap();
    // The draft vocabulary: every other target id from 3.
    let vocab: Vec<u32> = (0..20).map(|i| 3 + 2 * i).collect();
    let d = tempfile::tempdir().unwrap();
    export(&net, &vocab, &[1, 3, 5], WeightDtype::F32, d.path()).unwrap();
    let head = Eagle3Head::open(d.path()).unwrap();

    let (t, steps) = (7usize, 3usize);
    let taps: Vec<f32> = (0..t * 3 * 12)
        .map(|i| ((i * 7919 % 101) as f32 / 50.0 - 1.0) * 2.0)
        .collect();
    let ids: Vec<u32> = (0..(t + steps + 1) as u32)
        .map(|i| (i * 17 + 4) % 50)
        .collect();
    let batch = Batch {
        taps: Tensor::from_vec(taps.clone(), (1, t, 36), &Device::Cpu).unwrap(),
        ids: vec![ids.clone()],
        labels: Vec::new(),
    };
    let logits: Vec<Vec<f32>> = net
        .forward(&batch, steps)
        .unwrap()
        .iter()
        .map(|l| l.flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    let vd = 20;
    // Step 0 at every position: the head over the tapped rows.
    let out = head
        .step(
            &head.embed(&ids[1..=t]).unwrap(),
            HeadInput::Taps(&taps),
            &mut DraftCache::default(),
        )
        .unwrap();
    let r = rel(&logits[0], &out.logits);
    assert!(r < 1e-5, "step 0: rel {r}");
    // The chain anchored at each position: the head's cache holds positions 0..=a, then
    // each step feeds its own row and the next token's embedding.
    for a in 0..t {
        let mut cache = DraftCache::default();
        let first = head
            .step(
                &head.embed(&ids[1..=a + 1]).unwrap(),
                HeadInput::Taps(&taps[..(a + 1) * 36]),
                &mut cache,
            )
            .unwrap();
        let mut row = first.rows[a * 16..].to_vec();
        for j in 1..steps {
            let o = head
                .step(
                    &head.embed(&ids[a + j + 1..=a + j + 1]).unwrap(),
                    HeadInput::Rows(&row),
                    &mut cache,
                )
                .unwrap();
            let want = &logits[j][a * vd..][..vd];
            let r = rel(want, &o.logits);
            assert!(r < 1e-5, "anchor {a}, step {j}: rel {r}");
            row = o.rows;
        }
    }
    // The exported maps: draft id d is target id vocab[d].
    assert_eq!(head.target_id(0), 3);
    assert_eq!(head.target_id(19), 41);
}
