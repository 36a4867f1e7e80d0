//! dmc's fuzz driver, without libFuzzer (stable Rust, no instrumentation): seeded, reproducible
//! mutation of real inputs, run in-process with panics caught, each case written to a file before
//! it runs so that an abort (which cannot be caught) leaves its reproducer on disk.
//!
//! Targets:
//! * [`programs`]: mutated `.dm` programs through parse + check + diagnostic rendering; every
//!   accepted program (up to a size) compiled in train, eval and predict modes with the IR verifier,
//!   and each plan held to both plan checkers (the compiler's and the runtime's);
//! * [`readers`]: mutated `.safetensors` and `.npy` files through the data and weights loaders;
//! * [`cli`]: random flags and values through the `dmc` binary (a crash is a signal or exit 101).
//!
//! `dmc-fuzz all` runs them (see `--help`); tests/it/fuzz.rs runs a bounded amount on every
//! `cargo test`.

pub mod cli;
pub mod programs;
pub mod readers;

use std::io::{Seek, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One failure: which target, the case (a program's text, a file's bytes as hex, a command
/// line), and what happened.
#[derive(Debug, Clone)]
pub struct Failure {
    pub target: &'static str,
    pub case: String,
    pub what: String,
}

impl Failure {
    /// The case, cut to 2,000 characters for printing (long lines are a mutation of their own).
    pub fn short_case(&self) -> String {
        if self.case.chars().count() <= 2000 {
            return self.case.clone();
        }
        let head: String = self.case.chars().take(1000).collect();
        let tail: String = {
            let v: Vec<char> = self.case.chars().collect();
            v[v.len() - 1000..].iter().collect()
        };
        format!(
            "{head}\n[... {} characters ...]\n{tail}",
            self.case.chars().count() - 2000
        )
    }
}

/// Counts of one run of a target.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub cases: u64,
    /// Cases the target accepted (programs that checked; files that loaded; commands that exited 0).
    pub accepted: u64,
    /// Accepted programs compiled in all three modes.
    pub planned: u64,
    pub failures: Vec<Failure>,
}

impl Report {
    pub fn merge(&mut self, o: Report) {
        self.cases += o.cases;
        self.accepted += o.accepted;
        self.planned += o.planned;
        self.failures.extend(o.failures);
    }
}

static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Replaces the panic hook with one that records the message (printed with the failure instead).
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut l) = LAST_PANIC.lock() {
            *l = Some(info.to_string());
        }
    }));
}

/// Runs `f`, turning a panic into `Err(message)`.
pub fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| {
        LAST_PANIC
            .lock()
            .ok()
            .and_then(|mut l| l.take())
            .unwrap_or_else(|| "panic".into())
    })
}

/// The file each case is written to before it runs (`<dir>/current-<target>`): after an abort
/// it holds the reproducer.
pub struct CaseFile {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl CaseFile {
    pub fn new(dir: Option<&Path>, target: &str) -> CaseFile {
        let path = dir
            .map(|d| d.join(format!("current-{target}")))
            .unwrap_or_default();
        let file = dir.and_then(|_| std::fs::File::create(&path).ok());
        CaseFile { path, file }
    }

    /// Records the case about to run (best effort).
    pub fn record(&mut self, bytes: &[u8]) {
        if let Some(f) = self.file.as_mut() {
            let _ = f.set_len(0);
            let _ = f.rewind();
            let _ = f.write_all(bytes);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
