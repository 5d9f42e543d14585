//! User-facing progress bars (hidden automatically when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressStyle};

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
