//! `Inventory`: every language tensor of a checkpoint (name → shard, dtype, shape, absolute
//! byte range), built from the shard headers alone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::header::{read_header, Dtype, ShardHeader};
use crate::{Error, Result};

/// Where one tensor lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Index into `Inventory::shards`.
    pub shard: usize,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Absolute start in the shard file.
    pub start: u64,
    /// Absolute end (exclusive).
    pub end: u64,
}

impl TensorInfo {
    /// Byte length.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// True for a zero-byte tensor.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// One shard file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// File name relative to the model directory (also the hub file name).
    pub file: String,
    /// File size in bytes.
    pub size: u64,
    /// JSON header length.
    pub header_len: u64,
    /// SHA-256 of the JSON header (hex).
    pub header_sha256: String,
}

/// All language tensors of a checkpoint.
#[derive(Debug, Clone)]
pub struct Inventory {
    /// The model directory (for error messages and local reads).
    pub dir: PathBuf,
    /// Shards in index order.
    pub shards: Vec<ShardInfo>,
    /// Name prefix of the language model (one of `names.wrappers`, or empty).
    pub prefix: String,
    /// The model's dense names (K3's unless set with `with_names`).
    pub names: super::DenseNames,
    /// Tensors skipped because they belong to the vision tower.
    pub skipped: usize,
    tensors: HashMap<String, TensorInfo>,
    /// Each layer's dense tensor names, sorted (built on first use: one pass over every name,
    /// instead of one per layer per token: at K3's 0.5 M names that pass cost 12% of a decode).
    dense: std::sync::OnceLock<HashMap<usize, Vec<String>>>,
}

/// Where a streaming install keeps the shard headers (`<shard>` files) and `sizes.json`.
pub fn remote_headers_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("deltafin-meta").join("headers")
}

/// Parses `model-NNNNN-of-MMMMM.safetensors` into (index, total).
pub fn parse_shard_name(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("model-")?.strip_suffix(".safetensors")?;
    let (a, b) = rest.split_once("-of-")?;
    if a.is_empty()
        || b.is_empty()
        || !a.bytes().all(|c| c.is_ascii_digit())
        || !b.bytes().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Orders and checks a set of shard file names: every index 1..=total (or 0..=total, as
/// gpt-oss names its shards), one total.
pub fn order_shards(names: &[String], dir: &Path) -> Result<Vec<String>> {
    let err = |msg: String| Error::Checkpoint {
        dir: dir.to_path_buf(),
        msg,
    };
    if names.len() == 1 && names[0] == "model.safetensors" {
        return Ok(names.to_vec());
    }
    let mut parsed = Vec::new();
    for n in names {
        let (i, t) = parse_shard_name(n).ok_or_else(|| {
            err(format!(
                "`{n}` is not named model-NNNNN-of-MMMMM.safetensors"
            ))
        })?;
        parsed.push((i, t, n.clone()));
    }
    let total = parsed.first().map(|p| p.1).ok_or_else(|| {
        err("no model-NNNNN-of-MMMMM.safetensors shards found (is this a model directory?)".into())
    })?;
    if let Some(p) = parsed.iter().find(|p| p.1 != total) {
        return Err(err(format!(
            "`{}` disagrees about the shard count ({} vs {total})",
            p.2, p.1
        )));
    }
    parsed.sort();
    parsed.dedup_by(|a, b| a.0 == b.0 && a.2 == b.2);
    for (k, p) in parsed.iter().enumerate() {
        if k > 0 && parsed[k - 1].0 == p.0 {
            return Err(err(format!("shard index {} appears twice", p.0)));
        }
    }
    let have: Vec<usize> = parsed.iter().map(|p| p.0).collect();
    // gpt-oss's shards are named zero-based: model-00000-of-00002 … model-00002-of-00002.
    if have.len() == total + 1 && have.iter().enumerate().all(|(k, &i)| k == i) {
        return Ok(parsed.into_iter().map(|p| p.2).collect());
    }
    if have.len() != total || have.iter().any(|&i| i == 0 || i > total) {
        // The first few missing indices, found without walking a claimed count (which comes
        // from a file name and may be 99999999999): `have` is sorted, so they lie within the
        // first `have.len() + 5` numbers.
        let missing: Vec<usize> = (1..=total)
            .filter(|i| have.binary_search(i).is_err())
            .take(5)
            .collect();
        let more = if total.saturating_sub(have.len()) > missing.len() {
            " and more"
        } else {
            ""
        };
        return Err(err(format!(
            "shards missing or out of range: expected 1..={total}, {} named, missing {missing:?}{more} (incomplete download?)",
            have.len()
        )));
    }
    Ok(parsed.into_iter().map(|p| p.2).collect())
}

/// The ordered shard files `model.safetensors.index.json` (its bytes) names for `dir`.
pub fn shards_from_index(text: &[u8], dir: &Path) -> Result<Vec<String>> {
    let index = dir.join("model.safetensors.index.json");
    let v: serde_json::Value = serde_json::from_slice(text).map_err(|e| Error::Json {
        path: index.clone(),
        source: e,
    })?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::Checkpoint {
            dir: dir.to_path_buf(),
            msg: "model.safetensors.index.json has no weight_map object".into(),
        })?;
    let mut names: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    names.sort();
    names.dedup();
    order_shards(&names, dir).map_err(|e| Error::Checkpoint {
        dir: dir.to_path_buf(),
        msg: format!("model.safetensors.index.json: {e}"),
    })
}

/// Lists the shard files of a model directory: from `model.safetensors.index.json` when present,
/// otherwise by file name.
pub fn discover_shards(dir: &Path) -> Result<Vec<String>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read(&index).map_err(|e| Error::io(&index, e))?;
        return shards_from_index(&text, dir);
    }
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if parse_shard_name(&name).is_some() {
            names.push(name);
        }
    }
    if names.is_empty() && dir.join("model.safetensors").is_file() {
        names.push("model.safetensors".into());
    }
    order_shards(&names, dir)
}

impl Inventory {
    /// Builds the inventory of a local model directory, reading only the shard headers.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let names = discover_shards(dir)?;
        let mut headers = Vec::with_capacity(names.len());
        let remote = remote_headers_dir(dir);
        let sizes: Option<serde_json::Map<String, serde_json::Value>> =
            std::fs::read(remote.join("sizes.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
        for n in names {
            let path = dir.join(&n);
            if path.is_file() {
                let size = std::fs::metadata(&path)
                    .map_err(|e| Error::io(&path, e))?
                    .len();
                headers.push((n, size, read_header(&path)?));
                continue;
            }
            // A streaming install keeps only each shard's header bytes and size.
            let hp = remote.join(&n);
            let size = sizes
                .as_ref()
                .and_then(|m| m.get(&n))
                .and_then(|v| v.as_u64());
            match (std::fs::read(&hp), size) {
                (Ok(bytes), Some(size)) => headers.push((
                    n,
                    size,
                    super::header::parse_header_bytes(&bytes, size, &hp)?,
                )),
                _ => {
                    return Err(Error::io(
                        &path,
                        std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "shard missing (and no saved header from a streaming install)",
                        ),
                    ))
                }
            }
        }
        let inv = Self::from_headers(dir, headers)?;
        inv.check_index(dir)?;
        Ok(inv)
    }

    /// Builds the inventory from already-parsed headers (local or fetched by range).
    pub fn from_headers(dir: &Path, headers: Vec<(String, u64, ShardHeader)>) -> Result<Self> {
        let mut tensors: HashMap<String, TensorInfo> = HashMap::new();
        let mut shards = Vec::with_capacity(headers.len());
        let mut skipped = 0;
        let names = super::DenseNames::default();
        for (si, (file, size, h)) in headers.into_iter().enumerate() {
            shards.push(ShardInfo {
                file: file.clone(),
                size,
                header_len: h.header_len,
                header_sha256: h.header_sha256.clone(),
            });
            for t in h.tensors {
                if names.skipped.iter().any(|p| t.name.starts_with(p.as_str())) {
                    skipped += 1;
                    continue;
                }
                let info = TensorInfo {
                    shard: si,
                    dtype: t.dtype,
                    shape: t.shape,
                    start: t.start,
                    end: t.end,
                };
                if let Some(prev) = tensors.insert(t.name.clone(), info) {
                    return Err(Error::Checkpoint {
                        dir: dir.to_path_buf(),
                        msg: format!(
                            "tensor `{}` appears in both {} and {file}",
                            t.name, shards[prev.shard].file
                        ),
                    });
                }
            }
        }
        Ok(Inventory {
            dir: dir.to_path_buf(),
            shards,
            prefix: String::new(),
            names: Default::default(),
            skipped,
            tensors,
            dense: Default::default(),
        }
        .with_names(names))
    }

    /// The inventory under another model's dense names: the language-model prefix is
    /// detected again (the wrapper under which `names.embedding` exists, else none).
    pub fn with_names(mut self, names: super::DenseNames) -> Self {
        self.prefix = names
            .wrappers
            .iter()
            .find(|w| {
                self.tensors
                    .contains_key(&format!("{w}{}", names.embedding))
            })
            .cloned()
            .unwrap_or_default();
        self.names = names;
        self.dense = Default::default();
        self
    }

    fn check_index(&self, dir: &Path) -> Result<()> {
        let index = dir.join("model.safetensors.index.json");
        if !index.is_file() {
            return Ok(());
        }
        let text = std::fs::read(&index).map_err(|e| Error::io(&index, e))?;
        let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| Error::Json {
            path: index.clone(),
            source: e,
        })?;
        if let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) {
            for (name, file) in map {
                if let (Some(t), Some(f)) = (self.tensors.get(name), file.as_str()) {
                    if self.shards[t.shard].file != f {
                        return Err(Error::Checkpoint {
                            dir: dir.to_path_buf(),
                            msg: format!(
                                "index.json puts `{name}` in {f}, but the headers put it in {}",
                                self.shards[t.shard].file
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Number of language tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Looks a tensor up by full name.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// Iterates over all tensors.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &TensorInfo)> {
        self.tensors.iter()
    }

    /// Full name of a model-level tensor: `suffix` under the language model's prefix (a
    /// wrapper `p.` makes `model.norm.weight` `p.model.norm.weight`).
    pub fn name(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// Full name of a per-layer tensor.
    pub fn layer_name(&self, layer: usize, suffix: &str) -> String {
        format!("{}model.layers.{layer}.{suffix}", self.prefix)
    }

    /// The full names of layer `layer`'s tensors that are not routed experts, sorted.
    pub fn dense_layer_names(&self, layer: usize) -> Vec<String> {
        let by_layer = self
            .dense
            .get_or_init(|| super::dense_names::by_layer(self.tensors.keys(), &self.prefix));
        by_layer.get(&layer).cloned().unwrap_or_default()
    }

    /// Looks a tensor up and checks its dtype and shape.
    pub fn require(&self, name: &str, dtype: Dtype, shape: &[usize]) -> Result<&TensorInfo> {
        let t = self.tensors.get(name).ok_or_else(|| Error::Tensor {
            name: name.into(),
            msg: format!("missing from the checkpoint in {}", self.dir.display()),
        })?;
        if t.dtype != dtype || t.shape != shape {
            return Err(Error::Tensor {
                name: name.into(),
                msg: format!(
                    "expected {} {shape:?}, found {} {:?}",
                    dtype, t.dtype, t.shape
                ),
            });
        }
        Ok(t)
    }

    /// Absolute path of a shard.
    pub fn shard_path(&self, shard: usize) -> PathBuf {
        self.dir.join(&self.shards[shard].file)
    }
}

#[cfg(test)]
#[path = "inventory_tests.rs"]
mod tests;
