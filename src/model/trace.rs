//! The router trace: one JSON line per token with the experts every MoE layer selected
//! (`router_trace.jsonl`). Off by default and free when off.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::moe::Route;
use crate::{Error, Result};

/// Writes router traces.
pub struct RouterTrace {
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
}

impl RouterTrace {
    /// Creates (truncates) the trace file.
    pub fn create(path: &Path) -> Result<Self> {
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(RouterTrace {
            path: path.to_path_buf(),
            out: Mutex::new(BufWriter::new(f)),
        })
    }

    /// `K3_TRACE=buffered` turns tracing on, writing `dir/router_trace.jsonl`.
    pub fn from_env(dir: &Path) -> Result<Option<Self>> {
        match std::env::var("K3_TRACE").as_deref() {
            Ok("buffered") => Ok(Some(Self::create(&dir.join("router_trace.jsonl"))?)),
            Ok("") | Ok("off") | Err(_) => Ok(None),
            Ok(other) => Err(Error::Msg(format!(
                "K3_TRACE={other} is not understood (use `buffered`, or unset it)"
            ))),
        }
    }

    /// Writes one line per position: `{"pos": p, "layers": {"1": [e, ...], ...}}`.
    pub fn write(&self, first_pos: usize, layers: &[(usize, Vec<Route>)]) -> Result<()> {
        let positions = layers.first().map(|l| l.1.len()).unwrap_or(0);
        let mut out = self
            .out
            .lock()
            .map_err(|_| Error::Msg("router trace lock poisoned".into()))?;
        for p in 0..positions {
            let mut m = serde_json::Map::new();
            for (l, routes) in layers {
                if let Some(r) = routes.get(p) {
                    m.insert(l.to_string(), serde_json::json!(r.experts));
                }
            }
            let line = serde_json::json!({"pos": first_pos + p, "layers": m});
            writeln!(out, "{line}").map_err(|e| Error::io(&self.path, e))?;
        }
        Ok(())
    }

    /// Flushes buffered lines.
    pub fn flush(&self) -> Result<()> {
        let mut out = self
            .out
            .lock()
            .map_err(|_| Error::Msg("router trace lock poisoned".into()))?;
        out.flush().map_err(|e| Error::io(&self.path, e))
    }
}

impl Drop for RouterTrace {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
