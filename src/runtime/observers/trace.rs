//! The router trace: one JSON line per token with the experts every MoE layer selected
//! (`router_trace.jsonl`). An `Observer`: off unless attached (`Model::observe`); it collects a
//! pass's routes and writes them when the pass ends.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::moe::Route;
use crate::runtime::observe::{Event, Observer, RouteTrace};
use crate::{Error, Result};

/// Writes router traces.
pub struct RouterTrace {
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
    /// The pass being collected: its first position and routes so far.
    pass: Mutex<PassRoutes>,
    /// The first write error, reported by `flush`.
    failed: Mutex<Option<Error>>,
}

impl RouterTrace {
    /// Creates (truncates) the trace file.
    pub fn create(path: &Path) -> Result<Self> {
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(RouterTrace {
            path: path.to_path_buf(),
            out: Mutex::new(BufWriter::new(f)),
            pass: Mutex::new(PassRoutes::default()),
            failed: Mutex::new(None),
        })
    }

    /// The `K3_TRACE` setting (the binary reads the variable): `buffered` turns tracing on,
    /// writing `dir/router_trace.jsonl`; unset, empty or `off` leaves it off.
    pub fn from_setting(setting: Option<&str>, dir: &Path) -> Result<Option<Self>> {
        match setting {
            Some("buffered") => Ok(Some(Self::create(&dir.join("router_trace.jsonl"))?)),
            Some("") | Some("off") | None => Ok(None),
            Some(other) => Err(Error::Msg(format!(
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

    /// Flushes buffered lines; reports the first error a pass's write met.
    pub fn flush(&self) -> Result<()> {
        let done = self.pass.lock().ok().and_then(|mut p| p.done.take());
        self.write_pending(done, usize::MAX);
        if let Some(e) = self.failed.lock().ok().and_then(|mut f| f.take()) {
            return Err(e);
        }
        let mut out = self
            .out
            .lock()
            .map_err(|_| Error::Msg("router trace lock poisoned".into()))?;
        out.flush().map_err(|e| Error::io(&self.path, e))
    }
}

/// The routes of the pass in progress and of the last finished one, not yet written.
#[derive(Default)]
struct PassRoutes {
    first: usize,
    routes: RouteTrace,
    done: Option<(usize, RouteTrace)>,
}

impl RouterTrace {
    /// Writes the first `rows` positions of a finished pass.
    fn write_pending(&self, done: Option<(usize, RouteTrace)>, rows: usize) {
        let Some((first, mut routes)) = done else {
            return;
        };
        for (_, r) in &mut routes {
            r.truncate(rows);
        }
        if let Err(e) = self.write(first, &routes) {
            if let Ok(mut f) = self.failed.lock() {
                f.get_or_insert(e);
            }
        }
    }
}

impl Observer for RouterTrace {
    fn on(&self, layer: usize, event: &Event<'_>) {
        let Ok(mut pass) = self.pass.lock() else {
            return;
        };
        match event {
            Event::PassStart { first_pos, .. } => {
                self.write_pending(pass.done.take(), usize::MAX);
                pass.first = *first_pos;
            }
            Event::Routes(r) => pass.routes.push((layer, r.to_vec())),
            // Held until the next pass, `Kept` or `flush`: a verify pass's rejected drafts
            // never reach the file.
            Event::PassEnd => pass.done = Some((pass.first, std::mem::take(&mut pass.routes))),
            Event::Kept { rows } => self.write_pending(pass.done.take(), *rows),
            _ => {}
        }
    }
}

impl Drop for RouterTrace {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
