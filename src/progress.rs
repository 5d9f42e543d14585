//! User-facing progress: byte-count bars (hidden automatically when stderr is not a terminal)
//! and `PrefillProgress`, the observer that shows where a long prefill is. Owns no model state.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::models::k3::{Event, Observer, PrefillStep};

/// A byte-count progress bar with a message.
pub fn bytes_bar(total: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    pb.set_style(style);
    pb.set_message(msg.to_string());
    pb
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
/// and ETA. Attach it to a model with `K3Model::observe`; it ignores every other event.
pub struct PrefillProgress {
    mode: ProgressMode,
    run: Mutex<Option<Run>>,
}

struct Run {
    start: Instant,
    bar: ProgressBar,
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
        let bar = match self.mode {
            ProgressMode::Terminal => ProgressBar::new(total),
            ProgressMode::Lines => ProgressBar::hidden(),
        };
        let style = ProgressStyle::with_template(
            "prefill [{bar:30}] {pos}/{len} layer steps, {msg}, eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
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
