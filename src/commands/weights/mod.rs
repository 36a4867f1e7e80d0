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

use dmc_grammar::model::ParamSpec;
use dmc_runtime::io::{self, Conversion};

use self::layers::{param_layers, Framework, Kind, Layout, ParamLayer, Role};
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
    conversion: String,
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
                r.conversion.clone(),
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
    let internal = |what: String| {
        CliError::Message(format!(
            "{}: {what} (internal error: a bug in dmc)",
            file.display()
        ))
    };
    let mut rows = Vec::new();
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut stats = std::collections::HashSet::new();
    // Tied heads' copies of their tables: (head, the file's tensor, conversion, how matched).
    let mut tied: Vec<(&ParamLayer, &io::NamedArray, Conversion, &'static str)> = Vec::new();
    for (layer, m) in layers.iter().zip(&matched) {
        let Some((mi, how)) = *m else { continue };
        let m = &mods[mi];
        for slot in layer.slots(a.from) {
            let parts: Vec<&io::NamedArray> = slot
                .roles
                .iter()
                .map(|&r| m.get(r))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    internal(format!(
                        "module `{}` matched layer `{}` without its tensors",
                        m.name, layer.name
                    ))
                })?;
            let refs: Vec<(&[usize], &[f32])> = parts
                .iter()
                .map(|t| (t.1.as_slice(), t.2.as_slice()))
                .collect();
            let values = slot.layout.to_dmc(&slot.param.shape, &refs).map_err(|e| {
                CliError::Message(format!("{}: `{}`: {e}", file.display(), parts[0].0))
            })?;
            for (i, t) in parts.iter().enumerate() {
                rows.push(Row {
                    from: t.0.clone(),
                    from_shape: t.1.clone(),
                    to: slot.param.name.clone(),
                    to_shape: slot.param.shape.clone(),
                    conversion: slot.layout.describe(&slot.param.shape, i, &t.1),
                    how: how.describe(),
                });
            }
            if slot.stat {
                stats.insert(slot.param.name.clone());
            }
            out.push((slot.param.name.clone(), slot.param.shape.clone(), values));
        }
        if let Some((role, _, conv)) = layer.tied_weight(a.from) {
            if let Some(t) = m.get(role) {
                tied.push((layer, t, conv, how.describe()));
            }
        }
    }
    // A tied head's weight in the file must be the table the program reads: then it is the
    // same tensor written twice (PyTorch's state_dict holds `lm_head.weight` and `wte.weight`).
    for (layer, t, conv, how) in tied {
        let Some(tie) = &layer.tied else { continue };
        // the file's only copy, already imported as the table
        if rows.iter().any(|r| r.from == t.0 && r.to == tie.table.name) {
            continue;
        }
        let table = out
            .iter()
            .find(|o| o.0 == tie.table.name)
            .ok_or_else(|| internal(format!("`{}` was not imported", tie.table.name)))?;
        let (_, values) = conv
            .to_dmc(&t.1, &t.2)
            .map_err(|e| CliError::Message(format!("{}: `{}`: {e}", file.display(), t.0)))?;
        if values != table.2 {
            let from = rows
                .iter()
                .find(|r| r.to == tie.table.name)
                .filter(|r| r.from != tie.table.name)
                .map_or(String::new(), |r| format!(" (from `{}`)", r.from));
            return Err(CliError::Usage(format!(
                "{}: `{}` is the weight of the output head `{}`, but it differs from the embedding table `{}`{from}: the program ties them (`dense({}, tie: ...)` reads the embedding's table), so it holds one table for both; drop `tie:` from `{}` to give it a weight of its own, or import a model whose head shares the embedding's weight",
                file.display(),
                t.0,
                layer.name,
                tie.table.name,
                tie.table.shape[0],
                layer.name
            )));
        }
        rows.push(Row {
            from: t.0.clone(),
            from_shape: t.1.clone(),
            to: tie.table.name.clone(),
            to_shape: tie.table.shape.clone(),
            conversion: format!(
                "tied head `{}`: equal to the table, not stored twice",
                layer.name
            ),
            how,
        });
    }
    // Every parameter (and running statistic) of the program is filled.
    let written: std::collections::HashSet<&str> = out.iter().map(|o| o.0.as_str()).collect();
    let expected: Vec<&ParamSpec> = model
        .params()
        .chain(layers.iter().flat_map(|l| l.stats.iter().flatten()))
        .collect();
    if let Some(p) = expected.iter().find(|p| !written.contains(p.name.as_str())) {
        return Err(internal(format!(
            "no tensor of the file became `{}`",
            p.name
        )));
    }
    let tensors: Vec<(String, Vec<usize>, &[f32])> = out
        .iter()
        .map(|(n, s, v)| (n.clone(), s.clone(), v.as_slice()))
        .collect();
    io::save_weights(&a.output, &tensors)?;
    if !a.quiet {
        let note = if matched
            .iter()
            .flatten()
            .any(|(_, h)| matches!(h, MatchedBy::Order | MatchedBy::Hint))
        {
            "(layers of equal shapes were matched in the order of the file's names, `2` before `10`, or by their names (`wpe`, `pos_embed`, `lm_head`): check the rows above)"
        } else {
            ""
        };
        print_table(
            [a.from.name(), "dmc", "conversion", "matched by", note],
            &rows,
        );
    }
    let count = |running: bool| -> usize {
        out.iter()
            .filter(|t| stats.contains(&t.0) == running)
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

/// The other framework's name of the tensor of `layer` with role `role`.
fn foreign_name(layer: &ParamLayer, role: Role, fw: Framework) -> String {
    let norm = matches!(layer.kind, Kind::BatchNorm | Kind::LayerNorm);
    let table = matches!(layer.kind, Kind::Embedding | Kind::PosEmbedding);
    let leaf = match (fw, role) {
        (Framework::Torch, Role::Weight) => "weight",
        (Framework::Torch, Role::Bias) => "bias",
        (Framework::Torch, Role::RunningMean) => "running_mean",
        (Framework::Torch, Role::RunningVar) => "running_var",
        (_, Role::InProjWeight) => "in_proj_weight",
        (_, Role::InProjBias) => "in_proj_bias",
        (_, Role::OutProjWeight) => "out_proj.weight",
        (_, Role::OutProjBias) => "out_proj.bias",
        (Framework::Keras, Role::Weight) if norm => "gamma",
        (Framework::Keras, Role::Weight) if table => "embeddings",
        (Framework::Keras, Role::Weight) => "kernel",
        (Framework::Keras, Role::Bias) if norm => "beta",
        (Framework::Keras, Role::Bias) => "bias",
        (Framework::Keras, Role::RunningMean) => "moving_mean",
        (Framework::Keras, Role::RunningVar) => "moving_variance",
        (_, Role::QueryKernel) => "query/kernel",
        (_, Role::QueryBias) => "query/bias",
        (_, Role::KeyKernel) => "key/kernel",
        (_, Role::KeyBias) => "key/bias",
        (_, Role::ValueKernel) => "value/kernel",
        (_, Role::ValueBias) => "value/bias",
        (_, Role::OutputKernel) => "attention_output/kernel",
        (_, Role::OutputBias) => "attention_output/bias",
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
    // The names (and shapes) of --like's tensors, per layer and role; `None` for a layer without
    // a module there (a tied head without bias whose table the file does not repeat).
    type Like = HashMap<Role, (String, Vec<usize>)>;
    let like_names: Option<Vec<Option<Like>>> = match &a.like {
        None => None,
        Some(like) => {
            let lname = like.display().to_string();
            let mods = modules(io::read_tensors(like, "weights file")?.tensors, &lname)?;
            let matched = match_layers(&layers, &mods, a.to, &lname)?;
            Some(
                matched
                    .iter()
                    .map(|m| {
                        m.map(|(i, _)| {
                            mods[i]
                                .tensors
                                .iter()
                                .map(|(r, t)| (*r, (t.0.clone(), t.1.clone())))
                                .collect()
                        })
                    })
                    .collect(),
            )
        }
    };
    let internal = |name: &str| {
        CliError::Message(format!(
            "{}: `{name}` was not loaded (internal error: a bug in dmc)",
            a.init.display()
        ))
    };
    let mut rows = Vec::new();
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut counters: Vec<(String, i64)> = Vec::new();
    let mut exported = std::collections::HashSet::new();
    for (li, layer) in layers.iter().enumerate() {
        let like = like_names.as_ref().map(|v| v[li].as_ref());
        let like_of = |role: Role| like.flatten().and_then(|m| m.get(&role));
        let name_of = |role: Role| match like_of(role) {
            Some((n, _)) => n.clone(),
            None => foreign_name(layer, role, a.to),
        };
        for slot in layer.slots(a.to) {
            let param = &slot.param;
            let data = weights
                .get(&param.name)
                .ok_or_else(|| internal(&param.name))?;
            let parts = slot
                .layout
                .to_foreign(&param.shape, data)
                .map_err(|e| CliError::Message(format!("`{}`: {e}", param.name)))?;
            for (i, (role, (shape, values))) in slot.roles.iter().zip(parts).enumerate() {
                let name = name_of(*role);
                // a position table as --like holds it: an `nn.Parameter` `[1, t, d]`
                let shape = match (&slot.layout, like_of(*role)) {
                    (Layout::Positions, Some((_, s)))
                        if slot.layout.accepts(&param.shape, i, s) =>
                    {
                        s.clone()
                    }
                    _ => shape,
                };
                rows.push(Row {
                    from: param.name.clone(),
                    from_shape: param.shape.clone(),
                    to: name.clone(),
                    to_shape: shape.clone(),
                    conversion: slot.layout.describe(&param.shape, i, &shape),
                    how: "",
                });
                out.push((name, shape, values));
            }
            exported.insert(param.name.clone());
        }
        // A tied head in PyTorch: `lm_head.weight` is the embedding's weight, and the
        // state_dict holds it under both names, which `load_state_dict(strict=True)` wants
        // (Keras keeps a tied table once, in the embedding). With --like, as that file has it.
        if let (Some(tie), Framework::Torch) = (&layer.tied, a.to) {
            let name = match like {
                None => Some(foreign_name(layer, Role::Weight, a.to)),
                Some(m) => m.and_then(|m| m.get(&Role::Weight)).map(|w| w.0.clone()),
            };
            // (not twice: with --like of a file that holds the table only as the head's weight)
            if let Some(name) = name.filter(|n| out.iter().all(|o| &o.0 != n)) {
                let data = weights
                    .get(&tie.table.name)
                    .ok_or_else(|| internal(&tie.table.name))?;
                rows.push(Row {
                    from: tie.table.name.clone(),
                    from_shape: tie.table.shape.clone(),
                    to: name.clone(),
                    to_shape: tie.table.shape.clone(),
                    conversion: format!("tied head `{}`: the table again", layer.name),
                    how: "",
                });
                out.push((name, tie.table.shape.clone(), data.clone()));
            }
        }
        // PyTorch's `BatchNorm` has a step counter its `load_state_dict(strict=True)` requires;
        // dmc keeps none (it only matters for `momentum=None`), so it is written as 0.
        if layer.kind == Kind::BatchNorm && a.to == Framework::Torch {
            let base = match like {
                Some(m) => m
                    .and_then(|m| m.get(&Role::Weight))
                    .and_then(|w| w.0.strip_suffix("weight").map(str::to_string)),
                None => Some(format!("{}.", layer.name)),
            };
            if let Some(base) = base {
                counters.push((format!("{base}num_batches_tracked"), 0));
            }
        }
    }
    // Every parameter (and running statistic) of the program is in the file.
    if let Some((name, _)) = expected.iter().find(|(n, _)| !exported.contains(n)) {
        return Err(CliError::Message(format!(
            "`{name}` has no tensor in {}'s layout (internal error: a bug in dmc)",
            a.to.name()
        )));
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
