//! `deltafin run --events-jsonl PATH`: one JSON object per line for each event of a run (start,
//! every token, end), each with `t_ms` since the start, flushed as written so a benchmark harness
//! can parse the stream instead of the human-readable output.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// The event stream (inert when no path was given).
pub struct Events {
    out: Option<std::io::BufWriter<std::fs::File>>,
    t0: Instant,
}

impl Events {
    /// Creates (truncates) `path`, or an inert stream for `None`.
    pub fn create(path: Option<&Path>) -> anyhow::Result<Self> {
        let out = match path {
            Some(p) => Some(std::io::BufWriter::new(
                std::fs::File::create(p)
                    .map_err(|e| anyhow::anyhow!("--events-jsonl {}: {e}", p.display()))?,
            )),
            None => None,
        };
        Ok(Events {
            out,
            t0: Instant::now(),
        })
    }

    /// Whether events are written.
    pub fn on(&self) -> bool {
        self.out.is_some()
    }

    /// Writes `v` (an object) with `event` and `t_ms` added.
    pub fn emit(&mut self, event: &str, mut v: serde_json::Value) -> anyhow::Result<()> {
        let Some(w) = self.out.as_mut() else {
            return Ok(());
        };
        if let Some(o) = v.as_object_mut() {
            o.insert("event".into(), event.into());
            o.insert(
                "t_ms".into(),
                (self.t0.elapsed().as_secs_f64() * 1e3).into(),
            );
        }
        serde_json::to_writer(&mut *w, &v)?;
        w.write_all(b"\n")?;
        w.flush()?;
        Ok(())
    }
}
