//! `dmc`: the command-line driver. Each subcommand lives in `src/commands/<name>.rs`.
mod commands;
mod report;

use clap::Parser;

fn main() {
    report::install();
    let cli = commands::Cli::parse();
    if let Err(e) = commands::run(cli) {
        report::print_error(&e);
        std::process::exit(1);
    }
}
