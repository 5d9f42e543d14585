//! What an EAGLE-3 head is trained on: the target's own greedy continuations of prompts (text
//! windows, and user messages rendered in the model's chat format), with the target's hidden
//! rows at the three tapped layers, recorded by the decoding passes themselves (one `HiddenTap`
//! through `Drafter::observer`, no second pass). Labels are the target's greedy choices only:
//! prompt tokens are context, never targets. Owns the collection and the batching; works on
//! any `Model` (family-blind).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use candle::{Device, Tensor};

use super::net::Batch;
use crate::chat::{encode_marked, ChatOptions, Message};
use crate::checkpoint::rng::Rng;
use crate::runtime::generate::{Drafter, GenerateOptions, Generator, Speculation};
use crate::runtime::model::Model;
use crate::runtime::observe::Observer;
use crate::runtime::observers::HiddenTap;
use crate::tokenizer::Tokenizer;
use crate::Result;

/// One recorded continuation.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The prompt and the target's greedy continuation.
    pub ids: Vec<u32>,
    /// Tokens of the prompt.
    pub prompt_len: usize,
    /// The tapped rows of positions `0..ids.len() − 1`, `[n, 3·Ht]` (three layers ascending).
    pub taps: Vec<f32>,
}

/// Proposes nothing; its tap records every pass of the sequence.
struct Recorder(Arc<HiddenTap>);

impl Drafter for Recorder {
    fn propose(&mut self, _context: &[u32], _k: usize) -> Vec<u32> {
        Vec::new()
    }
    fn observer(&self) -> Option<&dyn Observer> {
        Some(self.0.as_ref())
    }
}

/// The prompts of a run: from `text`, `count` windows of 24–64 tokens at seeded offsets; every
/// `chat_every`-th one is instead a sentence of the text as a user message in the model's chat
/// format (0: none).
pub fn prompts(
    model: &dyn Model,
    tok: &Tokenizer,
    text: &str,
    count: usize,
    chat_every: usize,
    seed: u64,
) -> Result<Vec<Vec<u32>>> {
    let ids = tok.encode_ordinary(text);
    let sentences: Vec<&str> = text
        .split(['.', '?', '!'])
        .map(str::trim)
        .filter(|s| s.len() > 20 && s.len() < 300)
        .collect();
    if ids.len() < 128 {
        return Err(crate::Error::Msg(format!(
            "the training text holds {} tokens; a drafter needs at least 128",
            ids.len()
        )));
    }
    let mut rng = Rng::new(seed);
    let format = model.chat_format();
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        if chat_every > 0 && i % chat_every == 0 && !sentences.is_empty() {
            let s = sentences[rng.below(sentences.len() as u64) as usize];
            let (segs, marks) =
                format.render(&[Message::new("user", s)], &ChatOptions::default())?;
            out.push(encode_marked(tok, &segs, &marks).0);
        } else {
            let len = 24 + rng.below(41) as usize;
            let at = rng.below((ids.len() - len) as u64) as usize;
            out.push(ids[at..at + len].to_vec());
        }
    }
    Ok(out)
}

/// Generates up to `new_tokens` greedy tokens after each prompt (stopping at the model's stop
/// ids) and records the rows of `layers`. `progress` sees each finished sample.
pub fn collect(
    m: &dyn Model,
    stop_ids: &[u32],
    prompts: &[Vec<u32>],
    new_tokens: usize,
    layers: &[usize; 3],
    cancel: &AtomicBool,
    mut progress: impl FnMut(&Sample),
) -> Result<Vec<Sample>> {
    let opts = GenerateOptions {
        max_new: new_tokens,
        stop_ids: stop_ids.to_vec(),
        speculation: Speculation::OFF,
    };
    let mut out = Vec::with_capacity(prompts.len());
    for p in prompts {
        let tap = Arc::new(HiddenTap::new(layers));
        let mut rec = Recorder(tap.clone());
        let g = Generator::new(m).generate_drafted(
            &mut m.new_state(),
            p,
            &opts,
            cancel,
            &mut |l: &[f32]| crate::runtime::generate::argmax(l),
            &mut rec,
            |_| {},
        )?;
        if g.stop == crate::runtime::generate::StopReason::Cancelled {
            break;
        }
        let mut ids = p.clone();
        ids.extend(&g.generated_ids);
        let got = tap.take();
        let n = ids.len() - 1;
        let by: Vec<_> = layers
            .iter()
            .filter_map(|l| got.iter().find(|t| t.layer == *l))
            .collect();
        if by.len() != 3
            || by
                .iter()
                .any(|t| t.first != 0 || t.rows.len() < n * t.width)
        {
            return Err(crate::Error::Msg(format!(
                "the model reported rows of {:?} (layer, first position, rows) for layers \
                 {layers:?}, not {n} rows from position 0 (it has {} layers)",
                got.iter()
                    .map(|t| (t.layer, t.first, t.rows.len() / t.width.max(1)))
                    .collect::<Vec<_>>(),
                m.new_state().layers.len()
            )));
        }
        let w = by[0].width;
        let mut taps = Vec::with_capacity(n * 3 * w);
        for r in 0..n {
            for t in &by {
                taps.extend_from_slice(&t.rows[r * w..][..w]);
            }
        }
        let s = Sample {
            ids,
            prompt_len: p.len(),
            taps,
        };
        progress(&s);
        out.push(s);
    }
    Ok(out)
}

/// The draft vocabulary: the `size` target ids most often chosen by the target in `samples`
/// (ties: lower id), ascending; every id when `size` covers the vocabulary.
pub fn draft_vocab(samples: &[Sample], vocab: usize, size: usize) -> Vec<u32> {
    if size >= vocab {
        return (0..vocab as u32).collect();
    }
    let mut count = vec![0u64; vocab];
    for s in samples {
        for &id in &s.ids[s.prompt_len..] {
            if let Some(c) = count.get_mut(id as usize) {
                *c += 1;
            }
        }
    }
    let mut idx: Vec<u32> = (0..vocab as u32).collect();
    idx.sort_by(|&a, &b| count[b as usize].cmp(&count[a as usize]).then(a.cmp(&b)));
    idx.truncate(size);
    idx.sort_unstable();
    idx
}

/// A batch of `samples` padded to their longest (pads carry weight 0), labels for `steps`
/// draft steps over the draft vocabulary `vocab` (ascending target ids).
pub fn batch(samples: &[&Sample], steps: usize, vocab: &[u32], width: usize) -> Result<Batch> {
    let t = samples
        .iter()
        .map(|s| s.ids.len() - 1)
        .max()
        .unwrap_or(0)
        .max(1);
    let b = samples.len();
    let mut taps = vec![0f32; b * t * width];
    let mut ids = Vec::with_capacity(b);
    let mut labels = vec![(vec![0u32; b * t], vec![0f32; b * t]); steps];
    for (i, s) in samples.iter().enumerate() {
        taps[i * t * width..][..s.taps.len()].copy_from_slice(&s.taps);
        let mut w = s.ids.clone();
        w.resize(t + steps + 1, 0);
        ids.push(w);
        for (j, (lab, wt)) in labels.iter_mut().enumerate() {
            for a in 0..t {
                let m = a + j + 2;
                if m < s.ids.len() && m >= s.prompt_len {
                    if let Ok(d) = vocab.binary_search(&s.ids[m]) {
                        lab[i * t + a] = d as u32;
                        wt[i * t + a] = 1.0;
                    }
                }
            }
        }
    }
    let dev = Device::Cpu;
    Ok(Batch {
        taps: Tensor::from_vec(taps, (b, t, width), &dev)?,
        ids,
        labels: labels
            .into_iter()
            .map(|(l, w)| Ok((Tensor::new(l, &dev)?, Tensor::new(w, &dev)?)))
            .collect::<Result<_>>()?,
    })
}
