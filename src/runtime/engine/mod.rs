//! The library's front door: an `Engine` (one loaded model: config, tokenizer, chat format,
//! spine, expert store and memory plan, opened once) and `Session`s on it (one sequence's state,
//! the tokens it holds and the chat history). Front ends (the CLI, the server, the chat example)
//! and library users go through these instead of assembling stores, spines and states
//! themselves. Owns no math: the model does the compute, the generator the decoding loop.

mod load;
mod prefill;
mod session;
mod store;

use std::path::{Path, PathBuf};

pub use prefill::Prefilled;
pub use session::{ChatTurn, Session, SessionSnapshot};
pub use store::expert_store;

use crate::chat::ChatOptions;
use crate::compute::device::DeviceChoice;
use crate::memory::MemoryPlan;
use crate::tokenizer::Tokenizer;
use crate::{K3Model, Result};
pub use load::{activation_bytes, pass_row_bytes, plan_for, state_bytes, CacheRam, LoadOptions};

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
    model: K3Model,
    tok: Tokenizer,
    root: PathBuf,
    /// The prompt cache, when attached (`enable_prompt_cache`).
    cache: Option<crate::runtime::prompt_cache::PromptCache>,
    /// The checkpoint's fingerprint, computed on first use (it keys saved state files).
    fingerprint: std::sync::OnceLock<String>,
}

impl Engine {
    /// Opens the model in `root` under the memory plan (logged with `tracing`).
    pub fn open(root: &Path, opts: &EngineOptions) -> Result<Engine> {
        Self::open_with(root, opts, |p| tracing::info!("{p}"))
    }

    /// `open`, showing the memory plan to `report` before anything large is read.
    pub fn open_with(
        root: &Path,
        opts: &EngineOptions,
        report: impl FnOnce(&MemoryPlan),
    ) -> Result<Engine> {
        let device = crate::compute::device::select(opts.device)?;
        let model = K3Model::open_with(root, &device, &opts.load, report)?;
        let tok = Tokenizer::from_dir(root)?;
        Ok(Engine {
            model,
            tok,
            root: root.to_path_buf(),
            cache: None,
            fingerprint: Default::default(),
        })
    }

    /// An engine over an already loaded model (tests, custom loading).
    pub fn from_parts(model: K3Model, tok: Tokenizer, root: &Path) -> Engine {
        Engine {
            model,
            tok,
            root: root.to_path_buf(),
            cache: None,
            fingerprint: Default::default(),
        }
    }

    /// The model.
    pub fn model(&self) -> &K3Model {
        &self.model
    }

    /// The model, to attach observers (router trace, layer profile) or change the context
    /// limit before sessions start.
    pub fn model_mut(&mut self) -> &mut K3Model {
        &mut self.model
    }

    /// The model, owned (the engine's tokenizer is dropped).
    pub fn into_model(self) -> K3Model {
        self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// The model root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The end-of-message token, which ends a reply.
    pub fn eos(&self) -> u32 {
        self.model.config().eos_token_id
    }

    /// A new, empty session that chats with `chat`.
    pub fn session(&self, chat: ChatOptions) -> Session<'_> {
        Session::new(self, chat)
    }
}
