//! `dmc weights import|export`: weights from and to PyTorch and Keras. Import matches a file's
//! tensors to the program's layers (`matching`: by name, else by order and shape) and converts
//! their layouts (`layers`: which conversion each parameter needs; the conversions themselves are
//! `dmc_runtime::io::interop`); export writes the program's weights in the other framework's
//! layouts under its naming (`<layer>.weight` / `<layer>/kernel`). Both print the mapping as a
//! table. docs/INTEROP.md describes it.

mod layers;
mod matching;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use dmc_runtime::io::{self, Conversion};

use self::layers::{param_layers, Framework, Kind, ParamLayer};
use self::matching::{match_layers, modules, MatchedBy};
use crate::commands::program::load_model;
use crate::report::CliError;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Convert a PyTorch state_dict or Keras weights (.safetensors) into the program's weights
    /// (names matched to its layers by name, else by order and shape; layouts converted).
    Import(ImportArgs),
    /// Write the program's weights in PyTorch's or Keras's layouts and names (.safetensors).
    Export(ExportArgs),
}

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The program (.dm) whose layers the weights are for.
    pub program: PathBuf,
    /// The other framework's weights (.safetensors; for PyTorch
    /// `safetensors.torch.save_file(model.state_dict(), FILE)`).
    pub file: PathBuf,
    /// Which framework wrote FILE: its layouts and names.
    #[arg(long, value_enum)]
    pub from: Framework,
    /// Where to write the converted weights (.safetensors; for --init).
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
    /// No table.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The program (.dm) the weights belong to.
    pub program: PathBuf,
    /// The program's weights (.safetensors, as `dmc run --save` writes them).
    #[arg(long, value_name = "FILE")]
    pub init: PathBuf,
    /// The framework to write for: its layouts and names.
    #[arg(long, value_enum)]
    pub to: Framework,
    /// Name the tensors as in this file of the equivalent model (e.g. the state_dict of your
    /// `nn.Sequential`, saved once), matched to the layers as `import` matches them; without it,
    /// the names are dmc's layer names (`hidden1.weight`, `hidden1/kernel`).
    #[arg(long, value_name = "FILE")]
    pub like: Option<PathBuf>,
    /// Where to write (.safetensors).
    #[arg(long, short, value_name = "FILE")]
    pub output: PathBuf,
    /// No table.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(cmd: Command) -> Result<(), CliError> {
    match cmd {
        Command::Import(a) => import(a),
        Command::Export(a) => export(a),
    }
}

/// The program and the other file, in either order (`import FILE net.dm` as well): the one
/// whose name ends in `.dm` is the program.
fn program_first(a: PathBuf, b: PathBuf) -> (PathBuf, PathBuf) {
    let is_dm = |p: &Path| p.extension().is_some_and(|e| e == "dm");
    if !is_dm(&a) && is_dm(&b) {
        (b, a)
    } else {
        (a, b)
    }
}

/// One row of the printed mapping.
struct Row {
    from: String,
    from_shape: Vec<usize>,
    to: String,
    to_shape: Vec<usize>,
    conversion: Conversion,
    how: &'static str,
}

fn shape_str(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

fn print_table(head: [&str; 5], rows: &[Row]) {
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.from.clone(),
                shape_str(&r.from_shape),
                r.to.clone(),
                shape_str(&r.to_shape),
                r.conversion.to_string(),
                r.how.to_string(),
            ]
        })
        .collect();
    let titles = [head[0], "shape", head[1], "shape", head[2], head[3]];
    let mut width = titles.map(str::len);
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let line = |c: [&str; 6]| {
        let mut s = String::new();
        for (i, (cell, w)) in c.iter().zip(width).enumerate() {
            if i == 2 {
                s.push_str(" -> ");
            } else if i > 0 {
                s.push_str("  ");
            }
            s.push_str(&format!("{cell:w$}"));
        }
        println!("{}", s.trim_end());
    };
    line(titles);
    for c in &cells {
        line([&c[0], &c[1], &c[2], &c[3], &c[4], &c[5]]);
    }
    if !head[4].is_empty() {
        println!("{}", head[4]);
    }
}

/// `dmc weights import`.
fn import(a: ImportArgs) -> Result<(), CliError> {
    let (program, file) = program_first(a.program, a.file);
    let model = load_model(&program)?;
    let layers = param_layers(&model)?;
    io::check_writable(&a.output)?;
    let fname = file.display().to_string();
    let mods = modules(io::read_tensors(&file, "weights file")?.tensors, &fname)?;
    let matched = match_layers(&layers, &mods, a.from, &fname)?;
    let mut rows = Vec::new();
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (layer, &(mi, how)) in layers.iter().zip(&matched) {
        let m = &mods[mi];
        let [mean, var] = match &layer.stats {
            Some([mean, var]) => [Some(mean), Some(var)],
            None => [None, None],
        };
        let pairs = [
            (
                m.weight.as_ref(),
                Some(&layer.weight),
                layer.weight_conversion(a.from),
            ),
            (m.bias.as_ref(), layer.bias.as_ref(), Conversion::Same),
            (m.running_mean.as_ref(), mean, Conversion::Same),
            (m.running_var.as_ref(), var, Conversion::Same),
        ];
        for (tensor, param, conv) in pairs {
            let (Some((fname_t, fshape, data)), Some(param)) = (tensor, param) else {
                continue;
            };
            let (shape, values) = conv
                .to_dmc(fshape, data)
                .map_err(|e| CliError::Message(format!("{}: `{fname_t}`: {e}", file.display())))?;
            if shape != param.shape {
                return Err(CliError::Message(format!(
                    "{}: `{fname_t}` converts to {} but `{}` is {} (internal error: a bug in dmc)",
                    file.display(),
                    shape_str(&shape),
                    param.name,
                    shape_str(&param.shape)
                )));
            }
            rows.push(Row {
                from: fname_t.clone(),
                from_shape: fshape.clone(),
                to: param.name.clone(),
                to_shape: shape.clone(),
                conversion: conv,
                how: how.describe(),
            });
            out.push((param.name.clone(), shape, values));
        }
    }
    let tensors: Vec<(String, Vec<usize>, &[f32])> = out
        .iter()
        .map(|(n, s, v)| (n.clone(), s.clone(), v.as_slice()))
        .collect();
    io::save_weights(&a.output, &tensors)?;
    if !a.quiet {
        let note = if matched.iter().any(|(_, h)| *h == MatchedBy::Order) {
            "(layers of equal shapes were matched in the order of the file's names, `2` before `10`: check the rows above)"
        } else {
            ""
        };
        print_table(
            [a.from.name(), "dmc", "conversion", "matched by", note],
            &rows,
        );
    }
    let stats: std::collections::HashSet<&str> = layers
        .iter()
        .flat_map(|l| l.stats.iter().flatten())
        .map(|p| p.name.as_str())
        .collect();
    let count = |running: bool| -> usize {
        out.iter()
            .filter(|t| stats.contains(t.0.as_str()) == running)
            .map(|t| t.2.len())
            .sum()
    };
    let running = match count(true) {
        0 => String::new(),
        n => format!(" + {n} running statistics"),
    };
    println!(
        "wrote {} tensors ({} layers, {} parameters{running}) from {} to {}; use it with --init {}",
        out.len(),
        layers.len(),
        count(false),
        file.display(),
        a.output.display(),
        a.output.display()
    );
    Ok(())
}

/// The other framework's name of tensor `slot` of `layer` (0 weight, 1 bias, 2 running mean,
/// 3 running variance).
fn foreign_name(layer: &ParamLayer, slot: usize, fw: Framework) -> String {
    let norm = matches!(layer.kind, Kind::BatchNorm | Kind::LayerNorm);
    let leaf = match (fw, slot) {
        (Framework::Torch, 0) => "weight",
        (Framework::Torch, 1) => "bias",
        (Framework::Torch, 2) => "running_mean",
        (Framework::Torch, _) => "running_var",
        (Framework::Keras, 0) if norm => "gamma",
        (Framework::Keras, 0) => "kernel",
        (Framework::Keras, 1) if norm => "beta",
        (Framework::Keras, 1) => "bias",
        (Framework::Keras, 2) => "moving_mean",
        (Framework::Keras, _) => "moving_variance",
    };
    match fw {
        Framework::Torch => format!("{}.{leaf}", layer.name),
        Framework::Keras => format!("{}/{leaf}", layer.name),
    }
}

/// `dmc weights export`.
fn export(a: ExportArgs) -> Result<(), CliError> {
    let model = load_model(&a.program)?;
    let layers = param_layers(&model)?;
    io::check_writable(&a.output)?;
    // The parameters and the running statistics, as `dmc run --save` writes them.
    let stats = layers.iter().flat_map(|l| l.stats.iter().flatten());
    let expected: Vec<(String, Vec<usize>)> = model
        .params()
        .chain(stats)
        .map(|p| (p.name.clone(), p.shape.clone()))
        .collect();
    let weights: HashMap<String, Vec<f32>> = io::load_weights(&a.init, &expected)
        .map_err(|e| e.for_program(&a.program))?
        .into_iter()
        .collect();
    // The names of --like's tensors, per layer (weight, bias, running mean, running variance).
    let like_names: Option<Vec<[Option<String>; 4]>> = match &a.like {
        None => None,
        Some(like) => {
            let lname = like.display().to_string();
            let mods = modules(io::read_tensors(like, "weights file")?.tensors, &lname)?;
            let matched = match_layers(&layers, &mods, a.to, &lname)?;
            Some(
                matched
                    .iter()
                    .map(|&(i, _)| {
                        let m = &mods[i];
                        [&m.weight, &m.bias, &m.running_mean, &m.running_var]
                            .map(|t| t.as_ref().map(|t| t.0.clone()))
                    })
                    .collect(),
            )
        }
    };
    let mut rows = Vec::new();
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut counters: Vec<(String, i64)> = Vec::new();
    for (li, layer) in layers.iter().enumerate() {
        let [mean, var] = match &layer.stats {
            Some([mean, var]) => [Some(mean), Some(var)],
            None => [None, None],
        };
        let pairs = [
            (Some(&layer.weight), layer.weight_conversion(a.to)),
            (layer.bias.as_ref(), Conversion::Same),
            (mean, Conversion::Same),
            (var, Conversion::Same),
        ];
        for (slot, (param, conv)) in pairs.into_iter().enumerate() {
            let Some(param) = param else { continue };
            let Some(data) = weights.get(&param.name) else {
                return Err(CliError::Message(format!(
                    "{}: `{}` was not loaded (internal error: a bug in dmc)",
                    a.init.display(),
                    param.name
                )));
            };
            let (shape, values) = conv
                .from_dmc(&param.shape, data)
                .map_err(|e| CliError::Message(format!("`{}`: {e}", param.name)))?;
            let name = match like_names.as_ref().and_then(|v| v[li][slot].clone()) {
                Some(n) => n,
                None => foreign_name(layer, slot, a.to),
            };
            rows.push(Row {
                from: param.name.clone(),
                from_shape: param.shape.clone(),
                to: name.clone(),
                to_shape: shape.clone(),
                conversion: conv,
                how: "",
            });
            out.push((name, shape, values));
        }
        // PyTorch's `BatchNorm` has a step counter its `load_state_dict(strict=True)` requires;
        // dmc keeps none (it only matters for `momentum=None`), so it is written as 0.
        if layer.kind == Kind::BatchNorm && a.to == Framework::Torch {
            let base = match like_names.as_ref().and_then(|v| v[li][0].clone()) {
                Some(w) => w.strip_suffix("weight").map(str::to_string),
                None => Some(format!("{}.", layer.name)),
            };
            if let Some(base) = base {
                counters.push((format!("{base}num_batches_tracked"), 0));
            }
        }
    }
    let tensors: Vec<(String, Vec<usize>, &[f32])> = out
        .iter()
        .map(|(n, s, v)| (n.clone(), s.clone(), v.as_slice()))
        .collect();
    // PyTorch's safetensors helpers mark their files so; a plain dict for Keras.
    let meta = (a.to == Framework::Torch)
        .then(|| HashMap::from([("format".to_string(), "pt".to_string())]));
    io::save_tensors_and_counters(&a.output, &tensors, &counters, meta)?;
    if !a.quiet {
        print_table(["dmc", a.to.name(), "conversion", "", ""], &rows);
    }
    println!(
        "wrote {} tensors ({} layers) from {} to {} in {} layout (docs/INTEROP.md: loading them)",
        out.len() + counters.len(),
        layers.len(),
        a.init.display(),
        a.output.display(),
        a.to.name()
    );
    Ok(())
}
