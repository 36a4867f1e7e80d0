//! A bounded run of the fuzz driver (`fuzz/`, `dmc-fuzz`) on every `cargo test`: mutated programs
//! through the checker and, when accepted, through the compiler in train, eval and predict modes
//! and both plan checkers; mutated data and weights files through the readers; random flags
//! through this build's `dmc` binary. Nothing may panic, abort, crash or fail silently.
//!
//! Seeded and deterministic (the same cases every run); `DMC_FUZZ_SEED` picks other ones.
//! Longer runs: `cargo run --release -p dmc-fuzz -- all --cases 1000000 --plans 10000`.

use std::path::Path;
use std::time::Duration;

use dmc_fuzz::{cli, programs, readers, CaseFile, Report};

#[test]
fn bounded_fuzz_finds_no_panic_abort_or_silent_failure() {
    let seed: u64 = std::env::var("DMC_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026);
    let dir = tempfile::tempdir().expect("tempdir");
    dmc_fuzz::quiet_panics();
    let mut total = Report::default();
    let p = programs::run(
        30_000,
        300,
        seed,
        &mut CaseFile::new(Some(dir.path()), "programs"),
    );
    let r = readers::run(4_000, seed, &mut CaseFile::new(Some(dir.path()), "readers"));
    let c = cli::run(
        Path::new(env!("CARGO_BIN_EXE_dmc")),
        60,
        seed,
        Duration::from_secs(60),
        &mut CaseFile::new(Some(dir.path()), "cli"),
    );
    // Back to the default hook, so that the assertions below print.
    let _ = std::panic::take_hook();
    eprintln!(
        "programs: {} cases, {} accepted, {} planned; readers: {} cases, {} accepted; cli: {} cases, {} exited 0",
        p.cases, p.accepted, p.planned, r.cases, r.accepted, c.cases, c.accepted
    );
    // The targets were exercised, not skipped.
    assert!(p.accepted >= 300 && p.planned == 300, "{p:?}");
    assert!(r.accepted > 0 && c.accepted > 0, "{r:?} {c:?}");
    total.merge(p);
    total.merge(r);
    total.merge(c);
    let msgs: Vec<String> = total
        .failures
        .iter()
        .take(5)
        .map(|f| format!("[{}] {}\n{}", f.target, f.what, f.short_case()))
        .collect();
    assert!(
        total.failures.is_empty(),
        "{} failures:\n{}",
        total.failures.len(),
        msgs.join("\n\n")
    );
}
