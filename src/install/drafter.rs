//! `setup --drafter REPO`: installs a published draft head (EAGLE-3 or DFlash, either spelling) beside a model,
//! in `ROOT/drafter/`, where front ends find it (`drafters::installed`). Its config is checked
//! as a head before any weights are fetched; the weights (one `model.safetensors`, or the
//! shards a `model.safetensors.index.json` names) come through the same resumable, verified
//! download as a model's shards; `config.json` is written last, so an interrupted install is
//! never taken for a head. Owns the drafter's files; the heads' formats are `drafters`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::download::download_shard;
use crate::checkpoint::source::HubShard;
use crate::fsio::atomic::write_atomic;
use crate::hub::HubRepo;
use crate::{Error, Result};

/// Installs the head in `repo` (at `revision`) into `root/drafter/`; returns that directory.
/// `endpoint`: the hub (default: what hf-hub picks, `HF_ENDPOINT` or huggingface.co).
pub fn install_drafter(
    repo: &str,
    revision: Option<String>,
    endpoint: Option<String>,
    root: &Path,
    mut say: impl FnMut(&str),
) -> Result<PathBuf> {
    let hub = HubRepo::new(repo, revision, endpoint)?;
    let dir = root.join("drafter");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let config = hub.fetch("config.json")?;
    let v: serde_json::Value = serde_json::from_slice(&config).map_err(|e| Error::Json {
        path: PathBuf::from(format!("{repo}/config.json")),
        source: e,
    })?;
    crate::drafters::is_dflash(&v, Path::new(&format!("{repo}/config.json")))?;
    let files: Vec<String> = match hub.fetch("model.safetensors.index.json") {
        Ok(index) => {
            write_atomic(&dir.join("model.safetensors.index.json"), &index)?;
            let v: serde_json::Value = serde_json::from_slice(&index).map_err(|e| Error::Json {
                path: PathBuf::from(format!("{repo}/model.safetensors.index.json")),
                source: e,
            })?;
            let names: BTreeSet<String> = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .map(|m| {
                    m.values()
                        .filter_map(|f| f.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            names.into_iter().collect()
        }
        Err(_) => vec!["model.safetensors".into()],
    };
    let mut metas = Vec::with_capacity(files.len());
    for f in &files {
        if f.contains('/') || f.contains("..") {
            return Err(Error::Msg(format!("{repo}: a weight file named {f:?}")));
        }
        let m = hub.metadata(f)?;
        metas.push(HubShard {
            size: m.size,
            etag: m.etag,
            verified: false,
        });
    }
    let total: u64 = metas.iter().map(|m| m.size).sum();
    say(&format!(
        "drafter {repo}: {} file(s), {}",
        files.len(),
        crate::progress::human_bytes(total)
    ));
    let bar = crate::progress::Bar::bytes(total, "drafter");
    for (f, want) in files.iter().zip(&metas) {
        download_shard(&hub, &dir, f, want, None, &bar)?;
    }
    bar.finish_and_clear();
    write_atomic(&dir.join("config.json"), &config)?;
    // Opens it as the engine will: every tensor's shape against the config.
    crate::drafters::DraftHead::open(&dir)?;
    say(&format!("drafter installed in {}", dir.display()));
    Ok(dir)
}
