//! What `dmc run` shows and writes while it trains: the progress bar and the `--loss-log` file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::report::CliError;

/// A bar of `total_steps` steps (hidden with `--quiet`).
pub fn bar(total_steps: usize, quiet: bool) -> ProgressBar {
    let pb = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total_steps as u64)
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// Set on a data-parallel rank other than 0: [`say`] prints nothing (rank 0 reports for all).
static SILENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Silences [`say`] for the rest of the process.
pub fn silence() {
    SILENT.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Prints `line` above the bar, or to stderr when the bar is hidden.
pub fn say(pb: &ProgressBar, line: String) {
    if SILENT.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// `--loss-log FILE`: one line per step, `step loss ms`. A write error does not stop training: the
/// first one is kept (and shown above the bar), nothing more is written, and [`LossLog::finish`]
/// returns it.
pub struct LossLog {
    file: Option<BufWriter<File>>,
    error: Option<String>,
}

impl LossLog {
    /// Creates the file (none without `--loss-log`); for a run resumed after step `resumed_at`,
    /// keeps the lines of the steps up to it (a killed run may have logged steps past its last
    /// saved state, which the resumed run runs again) and goes on after them.
    pub fn create(path: Option<&Path>, resumed_at: Option<usize>) -> Result<LossLog, CliError> {
        let Some(p) = path else {
            return Ok(LossLog {
                file: None,
                error: None,
            });
        };
        let err = |e: std::io::Error| CliError::Usage(format!("--loss-log {}: {e}", p.display()));
        // Only a regular file is read back (not a FIFO or /dev/zero).
        let regular = std::fs::metadata(p).is_ok_and(|m| m.is_file());
        let kept: String = match resumed_at {
            Some(at) if regular => std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    l.split_whitespace()
                        .next()
                        .and_then(|s| s.parse::<usize>().ok())
                        .is_some_and(|step| step <= at)
                })
                .map(|l| format!("{l}\n"))
                .collect(),
            _ => String::new(),
        };
        let mut w = BufWriter::new(File::create(p).map_err(err)?);
        w.write_all(kept.as_bytes()).map_err(err)?;
        let file = Some(w);
        Ok(LossLog { file, error: None })
    }

    /// Appends the line of step `step` (from 1): its loss as the shortest round-trip decimal and
    /// its wall time in milliseconds.
    pub fn record(&mut self, step: usize, loss: f32, time: Duration, pb: &ProgressBar) {
        let (Some(w), None) = (self.file.as_mut(), &self.error) else {
            return;
        };
        let line = format!("{step} {loss} {:.3}\n", time.as_secs_f64() * 1e3);
        if let Err(e) = w.write_all(line.as_bytes()) {
            pb.println(format!("warning: --loss-log: {e}; training goes on"));
            self.error = Some(e.to_string());
        }
    }

    /// Flushes the file; the first write error, if any.
    pub fn finish(mut self) -> Option<String> {
        if let Some(mut w) = self.file.take() {
            if let Err(e) = w.flush() {
                self.error.get_or_insert(e.to_string());
            }
        }
        self.error
    }
}
