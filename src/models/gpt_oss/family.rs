//! gpt-oss as a registered family (`models::FAMILIES`): `model_type` `gpt_oss`, harmony chat,
//! a `tokenizer.json`, stacked MXFP4 experts, and dense tensors mapped from the shards (a
//! streaming install copies them into one file instead of a spine store).

use std::path::Path;

use candle::Device;

use super::{names, plan, GptOssConfig, GptOssModel};
use crate::chat::ChatFormat;
use crate::checkpoint::{ExpertIndex, Inventory};
use crate::runtime::family::ModelFamily;
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::MemoryPlan;
use crate::runtime::model::Model;
use crate::spine::convert::TensorBytes;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// The gpt-oss family.
pub struct GptOss;

fn config(root: &Path) -> Result<GptOssConfig> {
    GptOssConfig::from_file(&root.join("config.json"))
}

impl ModelFamily for GptOss {
    fn name(&self) -> &'static str {
        "gpt-oss"
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["gpt_oss"]
    }

    fn chat_format(&self) -> &'static dyn ChatFormat {
        &crate::chat::Harmony
    }

    fn fixtures(&self) -> &'static [crate::runtime::fixtures::Fixture] {
        super::fixture::FIXTURES
    }

    fn metadata_files(&self) -> &'static [(&'static str, bool)] {
        &[
            ("tokenizer.json", true),
            ("tokenizer_config.json", false),
            ("generation_config.json", false),
            ("chat_template.jinja", false),
            ("model.safetensors.index.json", true),
        ]
    }

    fn expert_index(&self, root: &Path, inv: &Inventory) -> Result<ExpertIndex> {
        names::expert_index(inv, &config(root)?)
    }

    fn summary(&self, root: &Path) -> Result<String> {
        let c = config(root)?;
        Ok(format!(
            "gpt-oss: {} layers, hidden {}, {} experts (top {}), vocabulary {}",
            c.num_hidden_layers,
            c.hidden_size,
            c.num_local_experts,
            c.top_k(),
            c.vocab_size
        ))
    }

    fn plan(&self, root: &Path, _device: &Device, o: &LoadOptions) -> Result<MemoryPlan> {
        let inv = Inventory::from_dir(root)?;
        plan::plan(&config(root)?, &inv, o)
    }

    fn open(
        &self,
        root: &Path,
        device: &Device,
        o: &LoadOptions,
        report: &mut dyn FnMut(&MemoryPlan),
    ) -> Result<Box<dyn Model>> {
        if !device.is_cpu() {
            return Err(Error::Msg(
                "gpt-oss runs on the CPU only so far (--device cpu)".into(),
            ));
        }
        Ok(Box::new(GptOssModel::open_planned(root, o, report)?))
    }

    fn tokenizer(&self, root: &Path) -> Result<Tokenizer> {
        Tokenizer::from_dir(root)
    }

    fn dense_copy_bytes(&self, _dense_bytes: u64) -> u64 {
        // The shards are mapped as they are.
        0
    }

    fn finish_full_install(&self, _root: &Path) -> Result<()> {
        Ok(())
    }

    fn install_dense(&self, root: &Path, inv: &Inventory, remote: &dyn TensorBytes) -> Result<()> {
        use crate::installed::dense::{dense_bytes, write_dense};
        let total = dense_bytes(inv, names::is_expert);
        let bar = crate::progress::Bar::bytes(total, "dense tensors");
        write_dense(root, inv, remote, names::is_expert, |d, _| {
            bar.set_position(d)
        })?;
        bar.finish_and_clear();
        Ok(())
    }
}
