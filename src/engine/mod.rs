//! The library's front door: an `Engine` (one loaded model: config, tokenizer, chat format,
//! spine, expert store and memory plan, opened once) and `Session`s on it (one sequence's state,
//! the tokens it holds and the chat history). Front ends (the CLI, the server, the chat example)
//! and library users go through these instead of assembling stores, spines and states
//! themselves. Owns no math: the model does the compute, the generator the decoding loop.

pub mod batch;
mod prefill;
pub mod prompt_cache;
mod session;

use std::path::{Path, PathBuf};

pub use prefill::Prefilled;
pub use session::{ChatTurn, Session, SessionSnapshot};

use std::sync::Arc;

use crate::chat::{ChatFormat, ChatOptions};
use crate::compute::device::DeviceChoice;
use crate::runtime::generate::Drafter;
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::MemoryPlan;
use crate::runtime::model::Model;
use crate::tokenizer::Tokenizer;
use crate::Result;

/// How to open an engine.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Memory plan inputs, expert store and spine choices.
    pub load: LoadOptions,
    /// Compute device.
    pub device: DeviceChoice,
}

/// One loaded model and its tokenizer.
pub struct Engine {
    model: Box<dyn Model>,
    tok: Arc<Tokenizer>,
    root: PathBuf,
    /// The id the server reports for the model (its family's `served_id`).
    model_id: String,
    /// The prompt cache, when attached (`enable_prompt_cache`).
    cache: Option<crate::engine::prompt_cache::PromptCache>,
    /// The checkpoint's fingerprint, computed on first use (it keys saved state files).
    fingerprint: std::sync::OnceLock<String>,
    /// Makes each generation's drafter (none: the n-gram drafter).
    drafter: Option<DrafterFactory>,
}

/// Makes a fresh drafter for each generation (a drafter follows one sequence).
pub type DrafterFactory = Arc<dyn Fn() -> Box<dyn Drafter> + Send + Sync>;

impl Engine {
    /// Opens the model in `root` under the memory plan (logged with `tracing`).
    pub fn open(root: &Path, opts: &EngineOptions) -> Result<Engine> {
        Self::open_with(root, opts, |p| tracing::info!("{p}"))
    }

    /// `open`, showing the memory plan to `report` before anything large is read. The
    /// model's family comes from its config.json's `model_type` (`models::family`).
    pub fn open_with(
        root: &Path,
        opts: &EngineOptions,
        report: impl FnOnce(&MemoryPlan),
    ) -> Result<Engine> {
        let device = crate::compute::device::select(opts.device)?;
        let family = crate::models::family(root)?;
        let mut report = Some(report);
        let model = family.open(root, &device, &opts.load, &mut |p| {
            if let Some(r) = report.take() {
                r(p)
            }
        })?;
        let tok = family.tokenizer(root)?;
        Ok(Engine {
            model,
            tok: Arc::new(tok),
            model_id: family.served_id(),
            root: root.to_path_buf(),
            cache: None,
            fingerprint: Default::default(),
            drafter: None,
        })
    }

    /// An engine over an already loaded model (tests, custom loading).
    pub fn from_parts(model: Box<dyn Model>, tok: Tokenizer, root: &Path) -> Engine {
        Engine {
            model,
            tok: Arc::new(tok),
            // The family of the checkpoint in `root` when it has one.
            model_id: crate::models::family(root).map_or("deltafin".into(), |f| f.served_id()),
            root: root.to_path_buf(),
            cache: None,
            fingerprint: Default::default(),
            drafter: None,
        }
    }

    /// The id the OpenAI server reports and accepts for this model by default (its family's
    /// `served_id`, e.g. `deltafin-kimi-k3`; `deltafin` for a model whose root has no known
    /// config.json).
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// The model.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    /// The model, to attach observers (router trace, layer profile) or change the context
    /// limit before sessions start.
    pub fn model_mut(&mut self) -> &mut dyn Model {
        self.model.as_mut()
    }

    /// The model, owned (the engine's tokenizer is dropped).
    pub fn into_model(self) -> Box<dyn Model> {
        self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// The tokenizer, shared (for splitters that outlive a borrow of the engine).
    pub fn tokenizer_arc(&self) -> &Arc<Tokenizer> {
        &self.tok
    }

    /// The model's chat format.
    pub fn chat_format(&self) -> &'static dyn ChatFormat {
        self.model.chat_format()
    }

    /// The model root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The token that ends a reply (the first of `stop_ids`).
    pub fn eos(&self) -> u32 {
        self.model.stop_ids().first().copied().unwrap_or(0)
    }

    /// Every token that ends a reply: the model's and its chat format's.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids = self.model.stop_ids();
        for id in self.chat_format().end_ids(&self.tok) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// Sets what drafts for speculative decoding from now on (`None`: the n-gram drafter).
    /// The output never depends on it, only the speed.
    pub fn set_drafter(&mut self, factory: Option<DrafterFactory>) {
        self.drafter = factory;
    }

    /// Drafts with the draft head in `dir` (EAGLE-3 or DFlash, docs/drafters.md), checked
    /// against this model: the same vocabulary, tapped layers the model has.
    pub fn use_drafter(&mut self, dir: &Path) -> Result<()> {
        let head = crate::drafters::DraftHead::open(dir)?;
        let (vocab, layers) = (self.model.vocab_size(), self.model.new_state().layers.len());
        let taps = head.taps(layers);
        if head.vocab() != vocab || taps.iter().any(|&l| l >= layers) {
            return Err(crate::Error::Msg(format!(
                "the {} head in {} is for a target of vocabulary {} tapping layers {taps:?}; \
                 this model has vocabulary {vocab} and {layers} layers",
                head.kind(),
                dir.display(),
                head.vocab()
            )));
        }
        self.drafter = Some(Arc::new(move || head.drafter(layers)));
        Ok(())
    }

    /// Whether a drafter other than the n-gram one is set.
    pub fn has_drafter(&self) -> bool {
        self.drafter.is_some()
    }

    /// A fresh drafter for one generation.
    pub fn new_drafter(&self) -> Box<dyn Drafter> {
        match &self.drafter {
            Some(f) => f(),
            None => Box::new(crate::runtime::generate::NgramDrafter::default()),
        }
    }

    /// A new, empty session that chats with `chat`.
    pub fn session(&self, chat: ChatOptions) -> Session<'_> {
        Session::new(self, chat)
    }
}
