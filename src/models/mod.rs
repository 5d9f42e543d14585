//! The models that run on the runtime. Each model's tensor names, config and modules live in
//! its own folder; the runtime (`moe`, `experts`, `spine`, `compute`, `mxfp4`, `engine`) takes
//! names and layouts as values. `ModelKind::detect` is the one place that tells them apart (by
//! config.json's `model_type`).

use std::path::Path;

use crate::checkpoint::{ExpertIndex, Inventory};
use crate::engine::LoadOptions;
use crate::memory::MemoryPlan;
use crate::runtime::model::Model;
use crate::{Error, Result};

pub mod gpt_oss;
pub mod k3;

/// The model families this crate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// Kimi K3 (`kimi_k3`, or K3's `text_config` layout).
    K3,
    /// gpt-oss (`gpt_oss`).
    GptOss,
}

impl ModelKind {
    /// The family of the checkpoint in `root`, from its config.json's `model_type`.
    pub fn detect(root: &Path) -> Result<ModelKind> {
        let path = root.join("config.json");
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| Error::Json { path, source: e })?;
        Ok(match v.get("model_type").and_then(|t| t.as_str()) {
            Some("gpt_oss") => ModelKind::GptOss,
            _ => ModelKind::K3,
        })
    }

    /// The chat format the family's checkpoints speak.
    pub fn chat_format(self) -> crate::chat::ChatFormat {
        match self {
            ModelKind::K3 => crate::chat::ChatFormat::Xtml,
            ModelKind::GptOss => crate::chat::ChatFormat::Harmony,
        }
    }

    /// The files `setup` fetches besides the shards and config.json: `(name, required)`.
    pub fn metadata_files(self) -> &'static [(&'static str, bool)] {
        match self {
            ModelKind::K3 => &[
                ("tiktoken.model", true),
                ("tokenizer_config.json", true),
                ("generation_config.json", false),
                ("model.safetensors.index.json", true),
            ],
            ModelKind::GptOss => &[
                ("tokenizer.json", true),
                ("tokenizer_config.json", false),
                ("generation_config.json", false),
                ("chat_template.jinja", false),
                ("model.safetensors.index.json", true),
            ],
        }
    }

    /// Every routed expert's span in the checkpoint `inv` of `root` (config.json read here).
    pub fn expert_index(self, root: &Path, inv: &Inventory) -> Result<ExpertIndex> {
        let cfg = root.join("config.json");
        match self {
            ModelKind::K3 => ExpertIndex::derive_k3(inv, &crate::K3Config::from_file(&cfg)?),
            ModelKind::GptOss => {
                gpt_oss::names::expert_index(inv, &gpt_oss::GptOssConfig::from_file(&cfg)?)
            }
        }
    }
}

/// Opens the model in `root` under the memory plan (shown to `report` before anything large is
/// read), as the family its config.json names.
pub fn open(
    root: &Path,
    device: &candle::Device,
    o: &LoadOptions,
    report: impl FnOnce(&MemoryPlan),
) -> Result<Box<dyn Model>> {
    Ok(match ModelKind::detect(root)? {
        ModelKind::K3 => Box::new(k3::K3Model::open_with(root, device, o, report)?),
        ModelKind::GptOss => {
            if !device.is_cpu() {
                return Err(Error::Msg(
                    "gpt-oss runs on the CPU only so far (--device cpu)".into(),
                ));
            }
            let g = gpt_oss::GptOssOptions::from_load(o);
            Box::new(gpt_oss::GptOssModel::open_planned(root, &g, report)?)
        }
    })
}
