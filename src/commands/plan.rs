//! `dmc plan FILE`: compile the training step and explain its memory: the peak by category, the moment
//! of the peak, the arena against its lower bound, a conventional framework's step for comparison, per
//! layer what is kept for backward, and (with `--timeline`) an SVG of live bytes over the step.

use std::path::PathBuf;

use dmc_compiler::plan::Mode;
use dmc_compiler::report::{memory_report, render_json, render_svg, render_text};
use dmc_compiler::CompileOptions;

use super::compile::write_atomic;
use crate::report::CliError;
use crate::size::parse_size;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The .dm program.
    pub file: PathBuf,
    /// Memory cap for the planned arena, e.g. `900MB`, `1GiB`, `1.5G` or bytes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub vram_cap: Option<u64>,
    /// Keep whole per-layer weight gradients (no optimizer update fused into the backward), for
    /// comparison with the default fused, chunked update.
    #[arg(long)]
    pub no_fuse: bool,
    /// Batch size (overrides the program's).
    #[arg(long)]
    pub batch: Option<usize>,
    /// The report as JSON (for tools).
    #[arg(long)]
    pub json: bool,
    /// Draw live bytes over the step, stacked by category, with the cap, to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let model = super::load_model(&args.file)?;
    let opts = CompileOptions {
        mode: Mode::Train,
        batch: args.batch,
        cap: args.vram_cap,
        fuse: !args.no_fuse,
        verify: true,
        ..CompileOptions::default()
    };
    let plan = dmc_compiler::compile(&model, &opts)?;
    let report = memory_report(&plan);
    if args.json {
        println!("{}", render_json(&report));
    } else {
        print!("{}", render_text(&report, args.vram_cap));
    }
    if let Some(path) = &args.timeline {
        let svg = render_svg(&report, args.vram_cap)
            .map_err(|e| CliError::Message(format!("cannot draw the timeline: {e}")))?;
        write_atomic(path, svg.as_bytes())?;
        if !args.json {
            println!("timeline written to {}", path.display());
        }
    }
    Ok(())
}
