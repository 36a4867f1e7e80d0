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

/// Prints `line` above the bar, or to stderr when the bar is hidden.
pub fn say(pb: &ProgressBar, line: String) {
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
    /// Creates the file (none without `--loss-log`), or appends to it (`append`: a resumed run,
    /// whose steps go on from the last one logged).
    pub fn create(path: Option<&Path>, append: bool) -> Result<LossLog, CliError> {
        let file = match path {
            Some(p) => {
                let f = if append {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(p)
                } else {
                    File::create(p)
                };
                Some(BufWriter::new(f.map_err(|e| {
                    CliError::Usage(format!("--loss-log {}: {e}", p.display()))
                })?))
            }
            None => None,
        };
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
