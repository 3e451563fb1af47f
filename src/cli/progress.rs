//! The batch command's progress display.

use std::io::Write as _;
use std::time::{Duration, Instant};

/// Shows progress on stderr: a redrawn bar on a terminal, a line every few seconds otherwise.
pub struct ProgressBar {
    started: Instant,
    last_line: Option<Instant>,
    tty: bool,
}

impl ProgressBar {
    pub fn new() -> Self {
        use std::io::IsTerminal as _;
        Self {
            started: Instant::now(),
            last_line: None,
            tty: std::io::stderr().is_terminal(),
        }
    }

    pub fn show(&mut self, done: usize, total: usize, failed: usize, running: usize, force: bool) {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = done as f64 / secs;
        let width = 30usize;
        let filled = (done * width)
            .checked_div(total)
            .unwrap_or(width)
            .min(width);
        let bar = format!("{}{}", "#".repeat(filled), ".".repeat(width - filled));
        let text = format!(
            "[{bar}] {done}/{total} done, {failed} failed, {running} running, {rate:.1}/s, {secs:.0}s"
        );
        let mut err = std::io::stderr();
        if self.tty {
            let _ = write!(err, "\r{text}");
            if force {
                let _ = writeln!(err);
            }
        } else if force
            || self
                .last_line
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(2))
        {
            let _ = writeln!(err, "{text}");
            self.last_line = Some(Instant::now());
        }
        let _ = err.flush();
    }
}
