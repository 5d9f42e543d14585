//! `ModelFamily`: everything the engine, the installer and the front ends ask of a model family
//! (K3, gpt-oss, or a Candle user's own), so none of them names one. A family says which
//! config.json `model_type` values it runs, opens a checkpoint under the memory plan as a
//! `dyn Model`, loads its tokenizer, names its routed experts' spans (the expert store and the
//! installer stream them), and tells the installer which files it needs and what it builds from
//! the dense tensors. The list of families is `models::FAMILIES`; this module owns the contract
//! only and must not name a family.

use std::path::Path;

use candle::Device;

use crate::chat::ChatFormat;
use crate::checkpoint::{ExpertIndex, Inventory};
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::MemoryPlan;
use crate::runtime::model::Model;
use crate::spine::convert::TensorBytes;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A family check's outcome: what was found, or what looks wrong (a warning).
pub type Check = std::result::Result<String, String>;

/// How a family holds its dense weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseWeights {
    /// Mapped from the shards (or a streaming install's copy) and resident: nothing dense is
    /// re-read per token.
    Mapped,
    /// A converted spine store, pinned or streamed layer by layer under the plan (`spine/`).
    SpineStore,
}

/// A model family the runtime can open, install and serve.
pub trait ModelFamily: Send + Sync {
    /// The family's name for people (`"Kimi K3"`).
    fn name(&self) -> &'static str;

    /// The config.json `model_type` values it runs.
    fn model_types(&self) -> &'static [&'static str];

    /// The chat format its checkpoints were trained on.
    fn chat_format(&self) -> &'static dyn ChatFormat;

    /// The model id the OpenAI server reports and accepts unless told another
    /// (`deltafin-` and the first `model_type`, `_` as `-`: `deltafin-kimi-k3`).
    fn served_id(&self) -> String {
        let t = self.model_types().first().copied().unwrap_or("model");
        format!("deltafin-{}", t.replace('_', "-"))
    }

    /// The test and benchmark checkpoints it can write (`deltafin fixture NAME`).
    fn fixtures(&self) -> &'static [crate::runtime::fixtures::Fixture] {
        &[]
    }

    /// How it holds its dense weights (which benches apply).
    fn dense_weights(&self) -> DenseWeights {
        DenseWeights::Mapped
    }

    /// The files `setup` fetches besides config.json and the shards: `(name, required)`.
    fn metadata_files(&self) -> &'static [(&'static str, bool)];

    /// Every routed expert's span in the checkpoint `inv` of `root` (one entry per decoder
    /// layer; dense layers have none).
    fn expert_index(&self, root: &Path, inv: &Inventory) -> Result<ExpertIndex>;

    /// One line for people about the checkpoint's config (layers, widths, experts,
    /// vocabulary); reading it validates the config.
    fn summary(&self, root: &Path) -> Result<String>;

    /// The family's own checks of a checkpoint (`deltafin doctor`): `(what, detail)`, where
    /// an `Err` detail is a warning.
    fn checks(&self, _root: &Path, _inv: &Inventory) -> Vec<(&'static str, Check)> {
        Vec::new()
    }

    /// The memory plan for the checkpoint in `root` on `device`, without loading it.
    fn plan(&self, root: &Path, device: &Device, o: &LoadOptions) -> Result<MemoryPlan>;

    /// Opens the checkpoint in `root` under the memory plan, shown to `report` before anything
    /// large is read.
    fn open(
        &self,
        root: &Path,
        device: &Device,
        o: &LoadOptions,
        report: &mut dyn FnMut(&MemoryPlan),
    ) -> Result<Box<dyn Model>>;

    /// The checkpoint's tokenizer, checked against its config (a vocabulary of another size
    /// means the files do not belong together).
    fn tokenizer(&self, root: &Path) -> Result<Tokenizer>;

    /// Bytes a full install writes beside the shards from `dense_bytes` of dense tensors (a
    /// converted spine store; 0 when the model maps its shards as they are).
    fn dense_copy_bytes(&self, dense_bytes: u64) -> u64;

    /// A full install's last step, once every shard of `root` is in place and verified.
    fn finish_full_install(&self, root: &Path) -> Result<()>;

    /// A streaming install's dense tensors, read from `remote` (no shard is local) into what
    /// the model opens in `root`.
    fn install_dense(&self, root: &Path, inv: &Inventory, remote: &dyn TensorBytes) -> Result<()>;
}

/// The family among `families` whose `model_types` hold `model_type` (config.json at `path`).
pub fn find(
    families: &[&'static dyn ModelFamily],
    model_type: Option<&str>,
    path: &Path,
) -> Result<&'static dyn ModelFamily> {
    let hit = model_type.and_then(|t| {
        families
            .iter()
            .find(|f| f.model_types().contains(&t))
            .copied()
    });
    hit.ok_or_else(|| Error::UnknownFamily {
        path: path.to_path_buf(),
        found: model_type.map_or("missing".into(), |t| format!("{t:?}")),
        known: families
            .iter()
            .map(|f| format!("{} ({})", f.model_types().join(", "), f.name()))
            .collect::<Vec<_>>()
            .join("; "),
    })
}

/// config.json's root `model_type` in `root` (`None` when the field is absent).
pub fn read_model_type(root: &Path) -> Result<Option<String>> {
    let path = root.join("config.json");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| Error::Json { path, source: e })?;
    Ok(v.get("model_type")
        .and_then(|t| t.as_str())
        .map(str::to_string))
}

/// config.json's `eos_token_id` (one id, a list of them, or absent), each checked against the
/// vocabulary.
pub fn eos_ids(value: Option<&serde_json::Value>, vocab: usize) -> Result<Vec<u32>> {
    let bad = || Error::config("eos_token_id", "must be a token id or a list of them");
    let id = |v: &serde_json::Value| {
        v.as_u64()
            .filter(|&i| (i as usize) < vocab)
            .map(|i| i as u32)
            .ok_or_else(bad)
    };
    match value {
        None => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a.iter().map(id).collect(),
        Some(v) => Ok(vec![id(v)?]),
    }
}
