//! Kimi K3 as a registered family (`models::FAMILIES`): `model_type` `kimi_k3`, the XTML chat
//! format, `tiktoken.model` with 256 reserved specials, MXFP4 experts per expert, and a spine
//! store (BF16, optionally row-int8) converted from the shards at install.

use std::path::Path;
use std::sync::Arc;

use candle::Device;

use super::config::K3Config;
use super::K3Model;
use crate::chat::ChatFormat;
use crate::checkpoint::{ExpertIndex, Inventory};
use crate::runtime::family::{Check, DenseWeights, ModelFamily};
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::MemoryPlan;
use crate::runtime::model::Model;
use crate::spine::convert::{convert_spine, convert_spine_from, SpineFormat, TensorBytes};
use crate::tokenizer::{Tokenizer, NUM_SPECIALS};
use crate::{Error, Result};

/// The Kimi K3 family.
pub struct K3;

fn config(root: &Path) -> Result<K3Config> {
    K3Config::from_file(&root.join("config.json"))
}

impl ModelFamily for K3 {
    fn name(&self) -> &'static str {
        "Kimi K3"
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["kimi_k3"]
    }

    fn chat_format(&self) -> &'static dyn ChatFormat {
        &crate::chat::Xtml
    }

    fn fixtures(&self) -> &'static [crate::runtime::fixtures::Fixture] {
        super::fixture::registry::FIXTURES
    }

    fn dense_weights(&self) -> DenseWeights {
        DenseWeights::SpineStore
    }

    fn metadata_files(&self) -> &'static [(&'static str, bool)] {
        &[
            ("tiktoken.model", true),
            ("tokenizer_config.json", true),
            ("generation_config.json", false),
            ("model.safetensors.index.json", true),
        ]
    }

    fn expert_index(&self, root: &Path, inv: &Inventory) -> Result<ExpertIndex> {
        ExpertIndex::derive_k3(inv, &config(root)?)
    }

    fn summary(&self, root: &Path) -> Result<String> {
        let c = config(root)?;
        let t = c.text();
        Ok(format!(
            "Kimi K3: {} layers, hidden {}, {} experts (top {}), vocabulary {}",
            c.num_layers(),
            t.hidden_size,
            t.num_experts,
            t.num_experts_per_token,
            t.vocab_size
        ))
    }

    fn checks(&self, root: &Path, inv: &Inventory) -> Vec<(&'static str, Check)> {
        let Ok(cfg) = config(root) else {
            return Vec::new();
        };
        vec![("kda gate", kda_gate(inv, &cfg))]
    }

    fn plan(&self, root: &Path, device: &Device, o: &LoadOptions) -> Result<MemoryPlan> {
        let inv = Arc::new(Inventory::from_dir(root)?);
        super::load::plan_for(root, &config(root)?, &inv, device, o)
    }

    fn open(
        &self,
        root: &Path,
        device: &Device,
        o: &LoadOptions,
        report: &mut dyn FnMut(&MemoryPlan),
    ) -> Result<Box<dyn Model>> {
        Ok(Box::new(K3Model::open_with(root, device, o, report)?))
    }

    fn tokenizer(&self, root: &Path) -> Result<Tokenizer> {
        let tok = Tokenizer::from_dir(root)?;
        // K3's vocabulary is the BPE ranks plus 256 reserved specials: another size means the
        // tokenizer and the model do not belong together.
        let cfgp = root.join("config.json");
        let vocab = config(root)?.text().vocab_size;
        let n = tok.num_ranks();
        if vocab != n as usize + NUM_SPECIALS as usize {
            return Err(Error::Msg(format!(
                "{}: {n} ranks + {NUM_SPECIALS} specials do not make config.json's vocab_size {vocab} ({}): the tokenizer files do not belong to this model",
                root.join("tiktoken.model").display(),
                cfgp.display()
            )));
        }
        Ok(tok)
    }

    fn dense_copy_bytes(&self, dense_bytes: u64) -> u64 {
        // The spine store is a second copy of the dense tensors beside the shards.
        dense_bytes
    }

    fn finish_full_install(&self, root: &Path) -> Result<()> {
        let inv = Inventory::from_dir(root)?;
        let layers = config(root)?.num_layers();
        convert_spine(&inv, layers, root, SpineFormat::Bf16, |_, _| {})?;
        Ok(())
    }

    fn install_dense(&self, root: &Path, inv: &Inventory, remote: &dyn TensorBytes) -> Result<()> {
        let layers = config(root)?.num_layers();
        let bar =
            crate::progress::Bar::new((layers + 2) as u64, "spine [{bar:30}] {pos}/{len}", true);
        convert_spine_from(remote, inv, layers, root, SpineFormat::Bf16, |d, _| {
            bar.set_position(d as u64)
        })?;
        bar.finish_and_clear();
        Ok(())
    }
}

/// KDA's `A_log`: per head, so only its first `num_heads` entries are read; non-zero padding
/// after them is ignored (as the reference ignores it) and said, since it suggests weights made
/// for the per-channel misreading.
fn kda_gate(inv: &Inventory, cfg: &K3Config) -> Check {
    let heads = cfg.text().linear_attn_config.num_heads;
    // A streaming install holds the dense tensors in its spine store, not the shards: the
    // padding cannot be read here, and saying so is not a problem of the install.
    if (0..inv.shards.len()).any(|i| !inv.shard_path(i).exists()) {
        return Ok(format!(
            "A_log read per head (first {heads} entries); its padding is not checked: the \
             shards are not local (a streaming install)"
        ));
    }
    match super::kda::a_log_padding(inv, cfg) {
        Ok(p) if p.is_empty() => Ok(format!(
            "A_log read per head (first {heads} entries); padding is zero"
        )),
        Ok(p) => Err(format!(
            "A_log has non-zero padding past its {heads} per-head entries in {} KDA layer(s) \
             (first: layer {}, {} value(s), largest |{:.4}|); it is ignored, as the reference \
             ignores it: check that these weights were not made for a per-channel A_log",
            p.len(),
            p[0].layer,
            p[0].nonzero,
            p[0].max_abs
        )),
        Err(e) => Err(format!("A_log not checked: {e}")),
    }
}
