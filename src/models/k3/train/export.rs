//! Export of a trained network to K3's exact on-disk format: BF16/F32 spine, routed experts
//! quantised to MXFP4 (E2M1 codes, an E8M0 scale per 32 inputs), several shards with each
//! layer's expert run contiguous in one of them, `model.safetensors.index.json`, config.json with
//! `text_config` and `quantization_config`, and the tokenizer files. The writing (temporary
//! names, fsync, rename) is `checkpoint::fixture::write_model_data`'s.

use std::path::Path;

use super::Net;
use crate::models::k3::fixture::{check_a_log_padding, model_units, write_model_data};
use crate::tokenizer::parse_ranks;
use crate::{Error, Result};

/// Writes `net` (whose config.json is `config`) with the tokenizer in `tokenizer` as a K3
/// model directory `out` of `shards` shards.
pub fn export(
    net: &Net,
    config: &serde_json::Value,
    tokenizer: &Path,
    out: &Path,
    shards: usize,
) -> Result<()> {
    let path = tokenizer.join("tiktoken.model");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let ranks = parse_ranks(&text, &path.display().to_string())?;
    check_a_log_padding(&net.cfg)?;
    let units = model_units(&net.cfg, "language_model.", true, false);
    let data = net.k3_tensors()?;
    write_model_data(out, config, units, shards, 0, &ranks, false, &data)
}
