//! `deltafin run --events-jsonl PATH`: one JSON object per line for each event of a run (start,
//! every token, end), each with `t_ms` since the start, flushed as written so a benchmark harness
//! can parse the stream instead of the human-readable output.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use deltafin::experts::ExpertStats;
use deltafin::runtime::observers::LayerProfile;

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

/// What `run` reports after each token: the `--stats` line, the token event, the layer
/// profile's lines.
pub struct TokenReport {
    events: Events,
    stats: bool,
    profile: Option<Arc<LayerProfile>>,
    last: ExpertStats,
    clock: Instant,
    i: usize,
    err: Option<anyhow::Error>,
}

impl TokenReport {
    /// Starts reporting on `model`'s tokens.
    pub fn new(
        model: &dyn deltafin::Model,
        events: Events,
        stats: bool,
        profile: Option<Arc<LayerProfile>>,
    ) -> Self {
        TokenReport {
            events,
            stats,
            profile,
            last: model.expert_stats().unwrap_or_default(),
            clock: Instant::now(),
            i: 0,
            err: None,
        }
    }

    /// Whether anything is printed on stderr per token (then ids are not echoed there).
    pub fn prints(&self) -> bool {
        self.stats || self.profile.is_some()
    }

    /// Reports token `id` (its text `piece` when there is a tokenizer).
    pub fn token(&mut self, model: &dyn deltafin::Model, id: u32, piece: Option<String>) {
        // This token's expert statistics, read once for --stats and the event stream.
        let token_stats = (self.stats || self.events.on()).then(|| {
            let now = model.expert_stats().unwrap_or_default();
            let d = now.since(&self.last);
            self.last = now;
            d
        });
        if let (true, Some(d)) = (self.stats, &token_stats) {
            eprintln!("{}", stats_line(self.i, d));
        }
        if let Some(p) = &self.profile {
            for t in p.take() {
                eprintln!("{t}");
            }
        }
        if self.events.on() {
            let ms = deltafin::runtime::observers::profile::lap(&mut self.clock);
            let v = serde_json::json!({
                "i": self.i, "id": id, "ms": ms, "piece": piece, "experts": token_stats,
            });
            if let Err(e) = self.events.emit("token", v) {
                self.err.get_or_insert(e);
            }
        }
        self.i += 1;
    }

    /// The event stream back, or the first error a token event met.
    pub fn finish(self) -> anyhow::Result<Events> {
        match self.err {
            Some(e) => Err(e),
            None => Ok(self.events),
        }
    }
}

fn stats_line(i: usize, s: &ExpertStats) -> String {
    let mb = |b: u64| b as f64 / 1e6;
    format!(
        "token {i}: ram {} | prefetch hits {} | homes {} ({:.1} MB) | disk {} ({:.1} MB) | shards {} ({:.1} MB) | hub {} ({:.1} MB, {} requests) | wait {:.2} ms",
        s.ram_experts,
        s.prefetch_hits,
        s.home_experts,
        mb(s.home_bytes),
        s.disk_experts,
        mb(s.disk_bytes),
        s.shard_experts,
        mb(s.shard_bytes),
        s.hub_experts,
        mb(s.hub_bytes),
        s.hub_requests,
        s.read_wait_s * 1e3
    )
}
