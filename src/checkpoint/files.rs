//! Open-once handles to a checkpoint's shard files, shared by every reader.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex};

use super::Inventory;
use crate::{Error, Result};

/// Lazily opened shard files.
#[derive(Debug)]
pub struct ShardFiles {
    inv: Arc<Inventory>,
    files: Mutex<HashMap<usize, Arc<File>>>,
    /// Shards opened for direct reads (`None`: the filesystem refuses them).
    direct: Mutex<HashMap<usize, Option<Arc<File>>>>,
}

impl ShardFiles {
    /// Handles for the shards of `inv`.
    pub fn new(inv: Arc<Inventory>) -> Self {
        ShardFiles {
            inv,
            files: Mutex::new(HashMap::new()),
            direct: Mutex::new(HashMap::new()),
        }
    }

    /// The inventory.
    pub fn inventory(&self) -> &Arc<Inventory> {
        &self.inv
    }

    /// The open file of shard `shard`.
    pub fn get(&self, shard: usize) -> Result<Arc<File>> {
        let mut files = self
            .files
            .lock()
            .map_err(|_| Error::Msg("shard file table poisoned".into()))?;
        if let Some(f) = files.get(&shard) {
            return Ok(f.clone());
        }
        let path = self.inv.shard_path(shard);
        let f = Arc::new(File::open(&path).map_err(|e| Error::io(&path, e))?);
        files.insert(shard, f.clone());
        Ok(f)
    }

    /// Shard `shard` opened for direct reads (`fsio::direct`); `None` where they are refused.
    pub fn get_direct(&self, shard: usize) -> Result<Option<Arc<File>>> {
        let mut map = self
            .direct
            .lock()
            .map_err(|_| Error::Msg("shard file table poisoned".into()))?;
        if let Some(f) = map.get(&shard) {
            return Ok(f.clone());
        }
        let f = crate::fsio::direct::open(&self.inv.shard_path(shard))?.map(Arc::new);
        map.insert(shard, f.clone());
        Ok(f)
    }
}
