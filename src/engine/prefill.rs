//! The engine's prefill through the prompt cache: resume from the entry with the longest
//! prefix of the request, run the rest in segments cut at the request's message ends and every
//! `every` tokens, save an entry at each cut and at the end (with its logits). The cuts depend
//! on the request alone, so a resumed prefill runs the same passes as a fresh one and its
//! logits are bit-identical. Without a cache it is one `Model::run`.

use std::sync::atomic::AtomicBool;

use super::Engine;
use crate::engine::prompt_cache::{cut_points, PromptCache, PromptCacheOptions};
use crate::runtime::generate::{GenerateOptions, Generation, Generator, StopReason};
use crate::runtime::model::Forward;
use crate::runtime::state::SeqState;
use crate::{Error, Result};

/// A prompt prefilled: the state holding it and its last position's logits.
pub struct Prefilled {
    /// Holds every token of the prompt.
    pub state: SeqState,
    /// The last position's logits.
    pub logits: Vec<f32>,
    /// Tokens the cache supplied (not prefilled).
    pub cached: usize,
    /// Wall time of the prefill, ms.
    pub ms: f64,
}

impl Engine {
    /// Attaches a prompt cache (its files are keyed by this checkpoint's fingerprint).
    pub fn enable_prompt_cache(&mut self, opts: PromptCacheOptions) -> Result<()> {
        let cache = PromptCache::new(opts, self.fingerprint()?, self.model.new_state())?;
        self.cache = Some(cache);
        Ok(())
    }

    /// The checkpoint's fingerprint (every shard's name and identity): saved states carry it.
    pub fn fingerprint(&self) -> Result<String> {
        if let Some(f) = self.fingerprint.get() {
            return Ok(f.clone());
        }
        let inv = crate::checkpoint::Inventory::from_dir(&self.root)?;
        let f = crate::checkpoint::Source::of(&inv).fingerprint();
        Ok(self.fingerprint.get_or_init(|| f).clone())
    }

    /// The prompt cache, if one is attached.
    pub fn prompt_cache(&self) -> Option<&PromptCache> {
        self.cache.as_ref()
    }

    /// Prefills `ids` into a new state, through the prompt cache when there is one; `marks`
    /// are positions where a request may later diverge (message ends). `None` when `cancel`
    /// stopped it (entries saved at cuts before the stop are kept).
    pub fn prefill(
        &self,
        ids: &[u32],
        marks: &[usize],
        cancel: &AtomicBool,
    ) -> Result<Option<Prefilled>> {
        self.prefill_observed(ids, marks, cancel, None)
    }

    /// `prefill` with `observer` watching the passes it runs (a drafter's tap; positions a
    /// cache entry supplied are not run, so not seen).
    fn prefill_observed(
        &self,
        ids: &[u32],
        marks: &[usize],
        cancel: &AtomicBool,
        observer: Option<&dyn crate::runtime::observe::Observer>,
    ) -> Result<Option<Prefilled>> {
        let t0 = std::time::Instant::now();
        let f = Forward {
            cancel: Some(cancel),
            observer,
            ..Default::default()
        };
        let Some(cache) = &self.cache else {
            let mut state = self.model.new_state();
            let Some(out) = self.model.run(ids, &mut state, &f)? else {
                return Ok(None);
            };
            return Ok(Some(Prefilled {
                state,
                logits: out.logits.to_vec1::<f32>()?,
                cached: 0,
                ms: t0.elapsed().as_secs_f64() * 1e3,
            }));
        };
        let (mut state, start, logits) = match cache.lookup(ids)? {
            Some(r) => (r.state, r.start, r.logits),
            None => (self.model.new_state(), 0, None),
        };
        if let Some(logits) = logits {
            return Ok(Some(Prefilled {
                state,
                logits,
                cached: start,
                ms: t0.elapsed().as_secs_f64() * 1e3,
            }));
        }
        let mut at = start;
        let mut cuts = cut_points(ids.len(), marks, cache.every(), start);
        cuts.push(ids.len());
        let mut last = None;
        for cut in cuts {
            let Some(out) = self.model.run(&ids[at..cut], &mut state, &f)? else {
                return Ok(None);
            };
            at = cut;
            if cut < ids.len() {
                cache.insert(&ids[..cut], &state, None)?;
            } else {
                last = Some(out.logits.to_vec1::<f32>()?);
            }
        }
        let logits = last.ok_or_else(|| Error::Msg("prefill of no tokens".into()))?;
        cache.insert(ids, &state, Some(&logits))?;
        Ok(Some(Prefilled {
            state,
            logits,
            cached: start,
            ms: t0.elapsed().as_secs_f64() * 1e3,
        }))
    }

    /// Prefills `ids` (through the prompt cache, `prefill`) and decodes; the state after the
    /// reply is saved as an entry too (it holds the prompt and every generated token but the
    /// last). Returns the generation (`cached`: the tokens the cache supplied) and that state.
    #[allow(clippy::too_many_arguments)]
    pub fn generate(
        &self,
        ids: &[u32],
        marks: &[usize],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        choose: &mut dyn FnMut(&[f32]) -> u32,
        on_token: impl FnMut(u32),
    ) -> Result<(Generation, SeqState)> {
        if opts.max_new == 0 {
            return Ok((Generation::empty(ids), self.model.new_state()));
        }
        let mut drafter = self.new_drafter();
        let Some(pre) = self.prefill_observed(ids, marks, cancel, drafter.observer())? else {
            let mut g = Generation::empty(ids);
            g.stop = StopReason::Cancelled;
            return Ok((g, self.model.new_state()));
        };
        let (mut state, cached) = (pre.state, pre.cached);
        let mut g = Generator::new(self.model.as_ref()).decode_from(
            &mut state,
            ids,
            pre.logits,
            pre.ms,
            opts,
            cancel,
            choose,
            &mut *drafter,
            on_token,
        )?;
        g.cached = cached;
        if let Some(cache) = &self.cache {
            let mut seq = ids.to_vec();
            seq.extend_from_slice(&g.generated_ids[..g.generated_ids.len().saturating_sub(1)]);
            if g.stop != StopReason::Cancelled && state.pos == seq.len() && seq.len() > ids.len() {
                cache.insert(&seq, &state, None)?;
            }
        }
        Ok((g, state))
    }
}
