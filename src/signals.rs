//! SIGINT (Ctrl-C), SIGTERM and SIGHUP, handled in one place for every command.
//!
//! By default a signal ends the process at once with exit code 130, after removing the temp files
//! of atomic writes in progress (`dmc_runtime::io::remove_temp_files_in_flight`), so an interrupted
//! `compile -o` or `predict -o` leaves the old file untouched and nothing behind. `dmc run` asks for
//! a graceful stop instead ([`graceful`]): the first signal only sets a flag that the training loop
//! reads after each step, so it can save the weights; a second signal ends the process as above
//! (a save in progress is abandoned, its temp file removed, the old file kept).

use std::sync::atomic::{AtomicBool, Ordering};

static GRACEFUL: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

/// Installs the handler (once, at startup). If it cannot be installed the default actions stay.
pub fn install() {
    let _ = ctrlc::set_handler(|| {
        if GRACEFUL.load(Ordering::SeqCst) && !STOP.swap(true, Ordering::SeqCst) {
            eprintln!("\nstopping: training ends after the current step and saves with --save (signal again to quit at once)");
            return;
        }
        dmc_runtime::io::remove_temp_files_in_flight();
        std::process::exit(130);
    });
}

/// From now on the first signal only requests a stop ([`stop_requested`]).
pub fn graceful() {
    GRACEFUL.store(true, Ordering::SeqCst);
}

/// Whether a signal asked the command to stop.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
