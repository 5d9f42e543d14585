//! Helpers of the speculation tests: bitwise state equality, generation with a speculation
//! setting, and a scripted drafter.

use std::sync::atomic::AtomicBool;

use deltafin::models::k3::K3Model;
use deltafin::runtime::generate::sample::Sampler;
use deltafin::runtime::generate::{Drafter, SpecMode, Speculation};
use deltafin::runtime::state::LayerState;
use deltafin::runtime::state::SeqState;
use deltafin::{GenerateOptions, Generation, Generator};

/// Bitwise state equality (positions, KDA conv windows and matrices, MLA caches).
pub fn same_state(a: &SeqState, b: &SeqState, what: &str) {
    assert_eq!(a.pos, b.pos, "{what}: positions");
    for (l, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
        match (x, y) {
            (LayerState::Recurrent(x), LayerState::Recurrent(y)) => {
                // KDA: the conv window (buffer 0) and the recurrent matrix (buffer 1).
                assert!(
                    x.buffers == y.buffers,
                    "{what}: layer {l} KDA state differs"
                );
            }
            (LayerState::Rows(x), LayerState::Rows(y)) => {
                assert!(x.rows() == y.rows(), "{what}: layer {l} MLA cache");
            }
            _ => panic!("{what}: layer {l} kinds differ"),
        }
    }
}

/// Greedy (or `sampler`) generation of `max_new` tokens with `spec` and the n-gram drafter.
pub fn generate(
    m: &K3Model,
    prompt: &[u32],
    max_new: usize,
    spec: Speculation,
    sampler: Option<Sampler>,
) -> Generation {
    let s = sampler.unwrap_or_else(|| Sampler::new(0.0, 1.0, 0));
    let d = &mut deltafin::runtime::generate::NgramDrafter::default();
    drafted(m, prompt, max_new, spec, s, d)
}

/// Generation with `drafter` and `sampler`, no stop token.
pub fn drafted(
    m: &K3Model,
    prompt: &[u32],
    max_new: usize,
    speculation: Speculation,
    mut sampler: Sampler,
    drafter: &mut dyn Drafter,
) -> Generation {
    let opts = GenerateOptions {
        max_new,
        stop_ids: vec![],
        speculation,
    };
    let no = AtomicBool::new(false);
    Generator::new(m)
        .generate_drafted(
            &mut m.new_state(),
            prompt,
            &opts,
            &no,
            &mut |l: &[f32]| sampler.choose(l),
            drafter,
            |_| {},
        )
        .unwrap()
}

/// Proposes the reference continuation (plain decoding's output), with one draft in `every`
/// corrupted: partial acceptance at every depth.
pub struct Script {
    pub reference: Vec<u32>,
    pub every: usize,
    pub n: usize,
}

impl Drafter for Script {
    fn propose(&mut self, context: &[u32], k: usize) -> Vec<u32> {
        let at = context.len();
        let mut d: Vec<u32> = self.reference.iter().skip(at).take(k).copied().collect();
        for x in d.iter_mut() {
            self.n += 1;
            if self.n.is_multiple_of(self.every) {
                *x = (*x + 1) % 64;
            }
        }
        d
    }
}

pub fn scripted(m: &K3Model, prompt: &[u32], off: &Generation, every: usize) -> Generation {
    scripted_with(m, prompt, off, every, Sampler::new(0.0, 1.0, 0))
}

pub fn scripted_with(
    m: &K3Model,
    prompt: &[u32],
    off: &Generation,
    every: usize,
    sampler: Sampler,
) -> Generation {
    let mut reference = prompt.to_vec();
    reference.extend(&off.generated_ids);
    let mut d = Script {
        reference,
        every,
        n: 0,
    };
    drafted(m, prompt, off.generated_ids.len(), NGRAM, sampler, &mut d)
}

pub const NGRAM: Speculation = Speculation {
    mode: SpecMode::Ngram,
    depth: 8,
};
