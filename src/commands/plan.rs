//! `dmc plan FILE`: compile the training step and explain its memory: first a verdict of a few lines
//! (fits the cap or not, the peak, what recomputation chose), then with `--verbose` the details: the
//! peak by category, the arena against its lower bound, the keep-everything baseline for comparison,
//! per layer what is kept for backward; with `--timeline` an SVG of live bytes over the step.
//! Under a `--vram-cap` the plan needs rematerialization for, it explains the choice (what is
//! recomputed, at what cost, what it saves). `--sweep` prints (and with `--svg` draws) the
//! memory / recompute trade-off; `--max-batch` finds the largest batch that fits the cap.

use std::path::PathBuf;

use dmc_compiler::plan::Mode;
use dmc_compiler::report::{
    memory_report, render_svg, render_sweep_svg, render_sweep_text, render_text, write_json,
    RematSummary,
};
use dmc_runtime::io::write_file_atomic;
use std::io::Write;

use super::perf::{predict, step_line, GpuArg, ResourceSource};
use super::plan_args::{PlanArgs, RematArg, VERIFY};
use super::program::load_model;
use crate::report::CliError;
use crate::size::human;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The .dm program.
    pub file: PathBuf,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// The report as JSON (for tools): everything `--verbose` prints, and more.
    #[arg(long)]
    pub json: bool,
    /// After the verdict, the details: the peak's categories and buffers, the arena, the
    /// keep-everything baseline, views, recomputation, per layer, per step.
    #[arg(long, short, conflicts_with = "json")]
    pub verbose: bool,
    /// Draw live bytes over the step, stacked by category, with the cap, to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
    /// Print the memory / recompute trade-off from the smallest feasible cap to the arena without
    /// recomputation, against sqrt(n) and checkpoint-all checkpointing (every cap, with and without
    /// recomputation: so not with `--vram-cap` or `--remat`; `--svg` draws it, not `--timeline`).
    #[arg(long, conflicts_with_all = ["vram_cap", "remat", "timeline"])]
    pub sweep: bool,
    /// With `--sweep`: draw the trade-off curve to this SVG file.
    #[arg(long, value_name = "FILE.svg", requires = "sweep")]
    pub svg: Option<PathBuf>,
    /// Points of the sweep.
    #[arg(long, default_value_t = 12, requires = "sweep")]
    pub points: usize,
    /// The largest batch whose training step fits `--vram-cap` (one line: not with `--batch`,
    /// `--json` or `--timeline`).
    #[arg(long, requires = "vram_cap", conflicts_with_all = ["batch", "sweep", "json", "timeline"])]
    pub max_batch: bool,
    #[command(flatten)]
    pub gpu: GpuArg,
}

/// Plans with more kernels than this are not compiled a second time without fusion for the
/// report's comparison line.
const UNFUSED_COMPARISON_MAX_STEPS: usize = 5_000;

pub fn run(args: Args) -> Result<(), CliError> {
    let model = load_model(&args.file)?;
    let gpu = args.gpu.gpu()?;
    let opts = args.plan.options(Mode::Train, VERIFY)?;
    if args.max_batch {
        let cap = args.plan.step.vram_cap.unwrap_or(u64::MAX);
        let found = dmc_compiler::max_batch(&model, &opts)?;
        match found {
            Some((b, arena)) => println!(
                "{}: the largest batch that fits {} is {b} (arena {}, remat {})",
                args.file.display(),
                human(cap),
                human(arena),
                if args.plan.train.remat == RematArg::Off {
                    "off"
                } else {
                    "auto"
                }
            ),
            None => {
                return Err(CliError::Message(format!(
                    "{}: not even batch 1 fits {}",
                    args.file.display(),
                    human(cap)
                )))
            }
        }
        return Ok(());
    }
    if args.sweep {
        let sw_opts = dmc_compiler::CompileOptions {
            rates: super::plan_args::cpu_rates()?,
            ..args.plan.options(Mode::Train, false)?
        };
        let sw = dmc_compiler::sweep(&model, &sw_opts, args.points)?;
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&sw)
                    .map_err(|e| CliError::Message(format!("cannot serialise the sweep: {e}")))?
            );
        } else {
            print!("{}", render_sweep_text(&sw));
        }
        if let Some(path) = &args.svg {
            let svg = render_sweep_svg(&sw)
                .map_err(|e| CliError::Message(format!("cannot draw the sweep: {e}")))?;
            write_file_atomic(path, svg.as_bytes())?;
            if !args.json {
                println!("trade-off curve written to {}", path.display());
            }
        }
        return Ok(());
    }
    // The memory report is built while the plan checker checks the plan.
    let (plan, info, mut report) =
        dmc_compiler::compile_explained_alongside(&model, &opts, memory_report)?;
    report.remat = info.map(|i| RematSummary {
        no_remat_arena: i.no_remat_arena,
        saved_bytes: i.no_remat_arena.saturating_sub(plan.arena_bytes),
        stages: i.stages,
        strategy: i.strategy,
        sequence: i.sequence,
    });
    // The same program without fusion, for the comparison line (kernels and bytes moved); not
    // for huge programs, whose plans take seconds each.
    if opts.fuse && plan.steps.len() <= UNFUSED_COMPARISON_MAX_STEPS {
        let unfused = dmc_compiler::CompileOptions {
            fuse: false,
            cap: None,
            ..opts.clone()
        };
        if let Ok(p) = dmc_compiler::compile(&model, &unfused) {
            report.unfused_traffic = Some(dmc_compiler::report::traffic(&p));
        }
    }
    if args.json {
        // Serialised straight to stdout: a deep network's report is hundreds of MB of JSON.
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        write_json(&mut out, &mut report)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush())
            .map_err(|e| CliError::Message(format!("cannot write the report: {e}")))?;
    } else {
        print!(
            "{}",
            render_text(&report, args.plan.step.vram_cap, args.verbose)
        );
        // The performance model's line (registers estimated: NVRTC's are `dmc compile --perf`'s);
        // not for huge programs, whose kernels take seconds to render.
        if plan.steps.len() <= UNFUSED_COMPARISON_MAX_STEPS {
            {
                // the program's precision: TF32 tensor cores predicted as such (a data-parallel
                // plan's: one rank's step, its collectives at NVLink's rate)
                let cg = dmc_codegen::CodegenOptions {
                    gpu: gpu.name,
                    tf32: plan.precision == dmc_compiler::plan::Precision::Tf32,
                    ..Default::default()
                };
                let p = predict(&plan, &cg, &Default::default(), gpu)?;
                let src =
                    ResourceSource::Estimated("per kind; `dmc compile --perf` uses NVRTC's".into());
                println!("{}", step_line(&p, &src));
                if plan.streams() {
                    let copies =
                        dmc_plan::link::transfer_seconds(&plan.transfer_totals(), &gpu.link);
                    println!(
                        "  its copies: {:.3} ms on the {}'s {} (one copy stream), beside {:.3} ms of kernels: the streamed step takes at least {:.3} ms ({} bound)",
                        copies * 1e3,
                        gpu.name,
                        gpu.link.name,
                        p.predicted_s * 1e3,
                        copies.max(p.predicted_s) * 1e3,
                        if copies > p.predicted_s { "copy" } else { "compute" }
                    );
                    if let Some(line) = measured_link_line(&plan) {
                        println!("{line}");
                    }
                }
            }
            let rates = super::plan_args::cpu_rates()?;
            let t = dmc_plan::cpu::plan_time(&plan, &rates);
            println!(
                "CPU step: {} predicted by the CPU time model at {}",
                cpu_ms(t.step_s),
                rates.source
            );
        }
    }
    if let Some(path) = &args.timeline {
        let svg = render_svg(&report, args.plan.step.vram_cap)
            .map_err(|e| CliError::Message(format!("cannot draw the timeline: {e}")))?;
        write_file_atomic(path, svg.as_bytes())?;
        if !args.json {
            println!("timeline written to {}", path.display());
        }
    }
    // The process ends next: freeing the plan's, the report's and the model's millions of
    // allocations (a deep network's) one by one would only cost time.
    std::mem::forget(report);
    std::mem::forget(plan);
    std::mem::forget(model);
    Ok(())
}

/// Seconds as milliseconds with 3 significant digits, e.g. `2.92 ms`, `2920 ms`.
fn cpu_ms(s: f64) -> String {
    let ms = s * 1e3;
    if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// With a GPU here, the streamed plan's copies at this machine's measured pinned-copy bandwidth
/// (`dmc_runtime::cuda::measure_link`); `None` without one (or when it cannot be measured).
fn measured_link_line(plan: &dmc_compiler::plan::Plan) -> Option<String> {
    if !dmc_runtime::cuda::driver_present() {
        return None;
    }
    let dev = dmc_runtime::cuda::open_device().ok()?;
    let (up, down) = dmc_runtime::cuda::measure_link(&dev).ok()?;
    let t = plan.transfer_totals();
    let s = t.host_to_device as f64 / up + t.device_to_host as f64 / down;
    Some(format!(
        "  its copies on this machine's {} ({}): {:.3} ms at the measured {:.1} GB/s host->device, {:.1} GB/s device->host",
        dev.name,
        dev.arch,
        s * 1e3,
        up / 1e9,
        down / 1e9
    ))
}
