//! Qwen3-MoE as a registered family (`models::FAMILIES`): `model_type` `qwen3_moe`, ChatML with
//! Qwen3's think block, the checkpoint's `tokenizer.json`, BF16 experts one tensor per expert
//! and matrix, and dense tensors mapped from the shards (a streaming install copies them into
//! one file instead of a spine store).

use std::path::Path;

use candle::Device;

use super::{names, plan, Qwen3MoeConfig, Qwen3MoeModel};
use crate::chat::ChatFormat;
use crate::checkpoint::{ExpertIndex, Inventory};
use crate::installed::dense::{dense_bytes, write_dense};
use crate::runtime::family::ModelFamily;
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::MemoryPlan;
use crate::runtime::model::Model;
use crate::spine::convert::TensorBytes;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// The Qwen3-MoE family.
pub struct Qwen3Moe;

fn config(root: &Path) -> Result<Qwen3MoeConfig> {
    Qwen3MoeConfig::from_file(&root.join("config.json"))
}

impl ModelFamily for Qwen3Moe {
    fn name(&self) -> &'static str {
        "Qwen3-MoE"
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3_moe"]
    }

    fn chat_format(&self) -> &'static dyn ChatFormat {
        &crate::chat::ChatMl
    }

    fn fixtures(&self) -> &'static [crate::runtime::fixtures::Fixture] {
        super::fixture::FIXTURES
    }

    fn metadata_files(&self) -> &'static [(&'static str, bool)] {
        &[
            ("tokenizer.json", true),
            ("tokenizer_config.json", false),
            ("generation_config.json", false),
            ("model.safetensors.index.json", true),
        ]
    }

    fn expert_index(&self, root: &Path, inv: &Inventory) -> Result<ExpertIndex> {
        names::expert_index(inv, &config(root)?)
    }

    fn summary(&self, root: &Path) -> Result<String> {
        let c = config(root)?;
        Ok(format!(
            "Qwen3-MoE: {} layers ({} sparse), hidden {}, {} q / {} kv heads of {}, {} experts of {} (top {}), vocabulary {}",
            c.num_hidden_layers,
            c.moe_layers().len(),
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim(),
            c.num_experts,
            c.moe_intermediate_size,
            c.num_experts_per_tok,
            c.vocab_size
        ))
    }

    fn plan(&self, root: &Path, _device: &Device, o: &LoadOptions) -> Result<MemoryPlan> {
        let inv = Inventory::from_dir(root)?;
        crate::layers::plan::plan(&plan::shape(&config(root)?), &inv, o)
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
                "Qwen3-MoE runs on the CPU only so far (--device cpu)".into(),
            ));
        }
        Ok(Box::new(Qwen3MoeModel::open_planned(root, o, report)?))
    }

    fn tokenizer(&self, root: &Path) -> Result<Tokenizer> {
        let tok = Tokenizer::from_dir(root)?;
        let (have, vocab) = (tok.num_ids() as usize, config(root)?.vocab_size);
        // The hub's embedding is padded past the tokenizer (151,936 rows for 151,669 ids).
        Error::rule(have <= vocab, "vocab_size", || {
            format!(
                "{} holds {have} token ids, more than the model's {vocab}: the files do not belong together",
                root.join("tokenizer.json").display()
            )
        })?;
        Ok(tok)
    }

    fn dense_copy_bytes(&self, _dense_bytes: u64) -> u64 {
        // The shards are mapped as they are.
        0
    }

    fn finish_full_install(&self, _root: &Path) -> Result<()> {
        Ok(())
    }

    fn install_dense(&self, root: &Path, inv: &Inventory, remote: &dyn TensorBytes) -> Result<()> {
        let bar = crate::progress::Bar::bytes(dense_bytes(inv, names::is_expert), "dense tensors");
        write_dense(root, inv, remote, names::is_expert, |d, _| {
            bar.set_position(d)
        })?;
        bar.finish_and_clear();
        Ok(())
    }
}
