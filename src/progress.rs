//! User-facing progress: bars (`Bar`: indicatif's with the `progress` feature, hidden
//! automatically when stderr is not a terminal; without the feature a counter that draws
//! nothing) and `PrefillProgress`, the observer that shows where a long prefill is. Owns no
//! model state.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::runtime::observe::{Event, Observer, PrefillStep};

/// A progress bar: indicatif's with the `progress` feature; without it, a position counter
/// that draws nothing (`is_hidden` is true, so callers print their occasional lines instead).
pub struct Bar {
    #[cfg(feature = "progress")]
    bar: indicatif::ProgressBar,
    #[cfg(not(feature = "progress"))]
    pos: std::sync::atomic::AtomicU64,
}

impl Bar {
    /// A bar to `total` drawn with an indicatif `template` (`{bar}`, `{pos}`, `{len}`, `{msg}`,
    /// `{eta}`, `{bytes}` ...); `shown` false keeps it hidden even on a terminal.
    pub fn new(total: u64, template: &str, shown: bool) -> Bar {
        #[cfg(feature = "progress")]
        {
            let bar = match shown {
                true => indicatif::ProgressBar::new(total),
                false => indicatif::ProgressBar::hidden(),
            };
            let style = indicatif::ProgressStyle::with_template(template)
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            Bar { bar }
        }
        #[cfg(not(feature = "progress"))]
        {
            let _ = (total, template, shown);
            Bar {
                pos: Default::default(),
            }
        }
    }

    /// A byte-count bar with a message.
    pub fn bytes(total: u64, msg: &str) -> Bar {
        let b = Bar::new(
            total,
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            true,
        );
        b.set_message(msg.to_string());
        b
    }

    /// Moves the bar to `pos`.
    pub fn set_position(&self, pos: u64) {
        #[cfg(feature = "progress")]
        self.bar.set_position(pos);
        #[cfg(not(feature = "progress"))]
        self.pos.store(pos, std::sync::atomic::Ordering::Relaxed);
    }

    /// Advances the bar by `n`.
    pub fn inc(&self, n: u64) {
        #[cfg(feature = "progress")]
        self.bar.inc(n);
        #[cfg(not(feature = "progress"))]
        self.pos.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Where the bar is.
    pub fn position(&self) -> u64 {
        #[cfg(feature = "progress")]
        return self.bar.position();
        #[cfg(not(feature = "progress"))]
        self.pos.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The bar's message.
    pub fn set_message(&self, msg: String) {
        #[cfg(feature = "progress")]
        self.bar.set_message(msg);
        #[cfg(not(feature = "progress"))]
        let _ = msg;
    }

    /// Whether nothing is drawn (no terminal, or no `progress` feature).
    pub fn is_hidden(&self) -> bool {
        #[cfg(feature = "progress")]
        return self.bar.is_hidden();
        #[cfg(not(feature = "progress"))]
        true
    }

    /// Ends the bar, leaving it drawn.
    pub fn finish(&self) {
        #[cfg(feature = "progress")]
        self.bar.finish();
    }

    /// Ends the bar and erases it.
    pub fn finish_and_clear(&self) {
        #[cfg(feature = "progress")]
        self.bar.finish_and_clear();
    }

    /// Stops drawing the bar where it is.
    pub fn abandon(&self) {
        #[cfg(feature = "progress")]
        self.bar.abandon();
    }
}

/// Bytes for people (`1.25 GiB`).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{b} B"),
        _ => format!("{v:.2} {}", UNITS[u]),
    }
}

/// How `PrefillProgress` shows a prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar on a terminal; else a line on stderr every few seconds.
    Terminal,
    /// A line on stderr every few seconds, never a bar (the server, whose log is stderr).
    Lines,
}

/// Seconds between progress lines when no bar is shown.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// Shows where a long prefill is (`Event::Prefill`): layer, pass, positions, bytes read, rate
/// and ETA. Attach it to a model with `Model::observe`; it ignores every other event.
pub struct PrefillProgress {
    mode: ProgressMode,
    run: Mutex<Option<Run>>,
}

struct Run {
    start: Instant,
    bar: Bar,
    last_line: Instant,
}

impl PrefillProgress {
    /// A progress display in `mode`.
    pub fn new(mode: ProgressMode) -> Self {
        PrefillProgress {
            mode,
            run: Mutex::new(None),
        }
    }

    fn begin(&self, s: &PrefillStep) -> Run {
        let total = (s.passes * s.layers) as u64;
        let bar = Bar::new(
            total,
            "prefill [{bar:30}] {pos}/{len} layer steps, {msg}, eta {eta}",
            self.mode == ProgressMode::Terminal,
        );
        let now = Instant::now();
        Run {
            start: now,
            bar,
            last_line: now,
        }
    }
}

/// One line of a prefill's progress.
pub fn describe(s: &PrefillStep, elapsed: Duration) -> String {
    let read = s.read_now.saturating_sub(s.read_before) as f64 / 1e9;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let f = s.fraction();
    let eta = secs * (1.0 - f) / f.max(1e-9);
    format!(
        "layer {}/{}, pass {}/{} (positions {}..{} of {}), {read:.2} GB read at {:.2} GB/s, {:.0}% in {secs:.0} s, eta {eta:.0} s",
        s.layer + 1,
        s.layers,
        s.pass + 1,
        s.passes,
        s.pass_first,
        s.pass_first + s.pass_tokens,
        s.positions,
        read / secs,
        100.0 * f,
    )
}

impl Observer for PrefillProgress {
    fn on(&self, _layer: usize, event: &Event<'_>) {
        let Event::Prefill(s) = event else {
            return;
        };
        let Ok(mut run) = self.run.lock() else {
            return;
        };
        if s.pass == 0 && s.layer == 0 {
            if let Some(old) = run.take() {
                old.bar.abandon();
            }
        }
        let r = run.get_or_insert_with(|| self.begin(s));
        let done = (s.pass * s.layers + s.layer + 1) as u64;
        let line = describe(s, r.start.elapsed());
        r.bar.set_position(done);
        let read = s.read_now.saturating_sub(s.read_before) as f64 / 1e9;
        r.bar.set_message(format!(
            "layer {}/{} pass {}/{}, {read:.1} GB read",
            s.layer + 1,
            s.layers,
            s.pass + 1,
            s.passes
        ));
        let finished = done >= (s.passes * s.layers) as u64;
        if r.bar.is_hidden() && (r.last_line.elapsed() >= LINE_EVERY || finished) {
            r.last_line = Instant::now();
            eprintln!("prefill: {line}");
        }
        if finished {
            r.bar.finish_and_clear();
            *run = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_lines_say_where_the_prefill_is() {
        let s = PrefillStep {
            layer: 45,
            layers: 93,
            pass: 1,
            passes: 2,
            pass_first: 4096,
            pass_tokens: 1000,
            positions: 5096,
            read_before: 10_000_000_000,
            read_now: 110_000_000_000,
        };
        // (93 + 46) of 186 layer steps.
        assert!((s.fraction() - 139.0 / 186.0).abs() < 1e-12);
        let line = describe(&s, Duration::from_secs(100));
        assert!(line.starts_with("layer 46/93, pass 2/2 (positions 4096..5096 of 5096), 100.00 GB read at 1.00 GB/s, 75% in 100 s, eta 34 s"), "{line}");
    }
}
