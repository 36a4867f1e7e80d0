//! `dmc sample`: text from a byte-level sequence model (one input `int[T]`, logits `[T, 256]`,
//! causal attention), one byte at a time.
//!
//! A fixed-window recompute: every new byte runs the whole predict step (batch 1) on the last `T`
//! bytes of the text so far (the prompt and what was sampled), placed at positions `0..len` with
//! zeros after them, which a causal model never reads, and draws the next byte from the logits of
//! position `len - 1`. No key/value cache: each byte costs one forward pass of `T` positions.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use dmc_compiler::plan::Mode;
use dmc_grammar::model::{Layer, Model};
use dmc_runtime::{Backend, InputData};
use rand::{Rng, SeedableRng};

use super::args::Device;
use super::setup::{init_params, resolve_device};
use crate::commands::kernels::CodegenArgs;
use crate::commands::plan_args::PlanArgs;
use crate::commands::program::load_model;
use crate::report::CliError;

/// The symbols of a byte-level model.
const BYTES: usize = 256;

#[derive(Debug, Clone, Args)]
pub struct SampleArgs {
    /// The .dm program: a byte-level model (input `int[T]`, logits `[T, 256]`, causal attention).
    pub file: PathBuf,
    /// Its trained weights (`dmc run --save`).
    #[arg(long, value_name = "FILE")]
    pub init: PathBuf,
    /// The text to continue.
    #[arg(long)]
    pub prompt: String,
    /// How many bytes to generate.
    #[arg(long, default_value_t = 200)]
    pub tokens: usize,
    /// Softmax temperature: 1 samples the model's distribution, lower is more conservative, 0
    /// always takes the most likely byte.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Seed of the draws (the same seed, weights and prompt give the same text).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// cpu, cuda, cuda-emu or auto.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    #[command(flatten)]
    pub codegen: CodegenArgs,
}

/// `T`, the input's name, and a check that `model` is a causal byte-level model.
fn byte_model(model: &Model) -> Result<(usize, String), CliError> {
    let bad = |why: String| {
        Err(CliError::Usage(format!(
            "`dmc sample` generates bytes from a byte-level sequence model (one input `int[T]`, logits [T, 256], causal attention): {why}"
        )))
    };
    let [input] = &model.inputs[..] else {
        return bad(format!("the program has {} inputs", model.inputs.len()));
    };
    let t = match (input.dtype, input.shape.as_slice()) {
        (dmc_grammar::model::DType::I32, &[t]) => t,
        _ => return bad(format!("its input `{}` is not `int[T]`", input.name)),
    };
    let out = model.shape(model.output);
    if *out != [t, BYTES] {
        return bad(format!("its output is {out:?}, not [{t}, {BYTES}]"));
    }
    if let Some(n) = model
        .nodes
        .iter()
        .find(|n| matches!(n.layer, Layer::Attention { causal: false, .. }))
    {
        return bad(format!(
            "attention `{}` is not causal: each position would see the bytes after it",
            n.name
        ));
    }
    Ok((t, input.name.clone()))
}

/// The next byte from `logits` (one row of 256): the argmax at temperature 0, else a draw from
/// softmax(logits / temperature).
fn draw(logits: &[f32], temperature: f64, rng: &mut impl Rng) -> usize {
    let best = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
    if temperature <= 0.0 {
        return best;
    }
    let m = logits[best] as f64;
    let w: Vec<f64> = logits
        .iter()
        .map(|&v| ((v as f64 - m) / temperature).exp())
        .collect();
    let mut u = rng.random::<f64>() * w.iter().sum::<f64>();
    for (i, &p) in w.iter().enumerate() {
        if u < p {
            return i;
        }
        u -= p;
    }
    best
}

/// `dmc sample`.
pub fn run(args: &SampleArgs) -> Result<(), CliError> {
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        return Err(CliError::Usage(format!(
            "--temperature {}: give a finite number >= 0 (1 samples the model, 0 takes the most likely byte)",
            args.temperature
        )));
    }
    if args.prompt.is_empty() {
        return Err(CliError::Usage(
            "--prompt is empty: give the text to continue (at least one byte)".into(),
        ));
    }
    let model = load_model(&args.file)?;
    let (t, input) = byte_model(&model)?;
    let kind = resolve_device(args.device, true)?;
    let mut plan_args = PlanArgs::default();
    plan_args.step.batch = Some(1);
    let opts = plan_args.options(Mode::Predict, dmc_compiler::CHECKED_BUILD)?;
    let plan = dmc_compiler::compile(&model, &opts)?;
    let mut be = dmc_runtime::open_backend(kind, plan.clone(), &args.codegen.options(&plan))?;
    init_params(&mut be, Some(&args.init), 0, &args.file)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let mut text: Vec<u8> = args.prompt.as_bytes().to_vec();
    let mut window = vec![0i32; t];
    let mut out = std::io::stdout().lock();
    let werr = |e: std::io::Error| CliError::Message(format!("writing the sample to stdout: {e}"));
    out.write_all(&text).map_err(werr)?;
    for _ in 0..args.tokens {
        let ctx = &text[text.len().saturating_sub(t)..];
        window.fill(0);
        for (w, &b) in window.iter_mut().zip(ctx) {
            *w = i32::from(b);
        }
        be.set_input(&input, InputData::I32(&window))?;
        be.run(1, args.seed)?;
        let logits = be.output()?;
        let row = &logits[(ctx.len() - 1) * BYTES..ctx.len() * BYTES];
        let byte = draw(row, args.temperature, &mut rng) as u8;
        text.push(byte);
        out.write_all(&[byte]).map_err(werr)?;
        out.flush().map_err(werr)?;
    }
    writeln!(out).map_err(werr)?;
    Ok(())
}
