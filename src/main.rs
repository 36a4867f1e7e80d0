//! `dmc`: the command-line driver. Each subcommand lives in `src/commands/<name>.rs`.
mod commands;
mod report;
mod signals;
mod size;

/// Counts every heap allocation, so `dmc run` can report the measured peak next to the planned arena.
/// Over mimalloc: compiling a deep network allocates and frees millions of small names and shapes
/// (about a fifth fewer instructions than over the system allocator at 5,000 layers).
#[global_allocator]
static ALLOC: dmc_runtime::alloc::CountingOver<mimalloc::MiMalloc> =
    dmc_runtime::alloc::CountingOver(mimalloc::MiMalloc);

use clap::Parser;

fn main() {
    // Behave like a Unix tool when the reader of stdout goes away (`dmc plan x.dm | head`): end
    // quietly instead of panicking on a broken pipe.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE at startup, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    report::install();
    signals::install();
    let cli = commands::Cli::parse();
    if let Err(e) = commands::run(cli) {
        report::print_error(&e);
        std::process::exit(e.exit_code());
    }
}
