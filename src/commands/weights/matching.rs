//! Which tensor of another framework's file is which dmc parameter. The file's tensors are grouped
//! into modules by name (`features.0.weight` and `features.0.bias` are module `features.0`;
//! `dense_1/kernel:0` is `dense_1`; Keras 3's `layers/dense/vars/0` is `layers/dense`). Then
//!
//! 1. if every layer of the program has a module of its own name that fits, and the file has no
//!    other module (a file dmc exported, or a model written with dmc's layer names), by name;
//! 2. else every layer, in program order, takes the first unused module, in natural name order
//!    (`2` before `10`), whose weight and bias have the shapes the layer needs in that
//!    framework's layout. Names are never matched one by one here: Keras numbers its layers
//!    `conv2d`, `conv2d_1`, ... where dmc has `conv2d_1`, `conv2d_2`, ..., so a shared name
//!    need not be the same layer.
//!
//! Layers of distinct shapes are thus matched by shape alone, whatever the names; layers of equal
//! shapes by the order of their names (the order of an `nn.Sequential`, of `layer1`, `layer2`).

use std::cmp::Ordering;

use dmc_runtime::io::NamedArray;

use super::layers::{Framework, ParamLayer};
use crate::report::CliError;

/// The role of a tensor in its module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Weight,
    Bias,
    RunningMean,
    RunningVar,
}

/// The tensors of one module of the file.
#[derive(Debug)]
pub struct Module {
    pub name: String,
    pub weight: Option<NamedArray>,
    pub bias: Option<NamedArray>,
    /// A batchnorm's running statistics (PyTorch `running_mean` / `running_var`, Keras
    /// `moving_mean` / `moving_variance`).
    pub running_mean: Option<NamedArray>,
    pub running_var: Option<NamedArray>,
}

/// How a layer was matched to its module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedBy {
    /// The module has the layer's name.
    Name,
    /// The only module of its shapes.
    Shape,
    /// One of several modules of its shapes, taken in name order.
    Order,
}

impl MatchedBy {
    pub fn describe(self) -> &'static str {
        match self {
            MatchedBy::Name => "name",
            MatchedBy::Shape => "shape",
            MatchedBy::Order => "shape + name order",
        }
    }
}

/// A (module, tensor role) of a file tensor name, or `None` for a name that is no weight, bias or
/// running statistic. Keras 3's `vars/0..3` are a layer's kernel (batchnorm: gamma), bias (beta),
/// and a batchnorm's moving mean and variance.
fn split_name(name: &str) -> Option<(String, Role)> {
    let name = name.strip_suffix(":0").unwrap_or(name);
    if let Some((module, index)) = name.rsplit_once("/vars/") {
        return match index {
            "0" => Some((module.to_string(), Role::Weight)),
            "1" => Some((module.to_string(), Role::Bias)),
            "2" => Some((module.to_string(), Role::RunningMean)),
            "3" => Some((module.to_string(), Role::RunningVar)),
            _ => None,
        };
    }
    let (module, leaf) = match name.rfind(['.', '/']) {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => ("", name),
    };
    let role = match leaf {
        "weight" | "kernel" | "gamma" => Role::Weight,
        "bias" | "beta" => Role::Bias,
        "running_mean" | "moving_mean" => Role::RunningMean,
        "running_var" | "moving_variance" => Role::RunningVar,
        _ => return None,
    };
    Some((module.to_string(), role))
}

/// Natural order: runs of digits compare as numbers (`layer2` < `layer10`).
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn runs(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ra, rb) = (runs(a), runs(b));
    for (x, y) in ra.iter().zip(&rb) {
        let o = match (x, y) {
            ((true, p), (true, q)) => {
                let (p, q) = (p.trim_start_matches('0'), q.trim_start_matches('0'));
                p.len().cmp(&q.len()).then_with(|| p.cmp(q))
            }
            ((_, p), (_, q)) => p.cmp(q),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    ra.len().cmp(&rb.len()).then_with(|| a.cmp(b))
}

/// Groups the file's tensors into modules, in natural name order.
pub fn modules(tensors: Vec<NamedArray>, file: &str) -> Result<Vec<Module>, CliError> {
    let mut out: Vec<Module> = Vec::new();
    let mut unknown = Vec::new();
    for t in tensors {
        let Some((module, role)) = split_name(&t.0) else {
            unknown.push(t.0);
            continue;
        };
        let i = match out.iter().position(|m| m.name == module) {
            Some(i) => i,
            None => {
                out.push(Module {
                    name: module,
                    weight: None,
                    bias: None,
                    running_mean: None,
                    running_var: None,
                });
                out.len() - 1
            }
        };
        let slot = match role {
            Role::Weight => &mut out[i].weight,
            Role::Bias => &mut out[i].bias,
            Role::RunningMean => &mut out[i].running_mean,
            Role::RunningVar => &mut out[i].running_var,
        };
        if let Some(first) = slot.replace(t) {
            return Err(CliError::Usage(format!(
                "{file}: module `{}` has two {} tensors (`{}` and another); dmc takes one of each per layer",
                out[i].name,
                match role {
                    Role::Weight => "weight",
                    Role::Bias => "bias",
                    Role::RunningMean => "running mean",
                    Role::RunningVar => "running variance",
                },
                first.0
            )));
        }
    }
    if !unknown.is_empty() {
        return Err(CliError::Usage(format!(
            "{file}: tensor(s) {} are neither a weight (`.weight`, `kernel`, `gamma`), a bias (`bias`, `beta`) nor a batchnorm statistic (`running_mean`, `running_var`, `moving_mean`, `moving_variance`): dmc's layers hold only those (conv2d, conv_transpose2d, dense, batchnorm, layernorm; no embeddings); remove them from the file (e.g. drop the keys from the state_dict before saving) if the model is otherwise the program's",
            quoted(&unknown)
        )));
    }
    if let Some(m) = out.iter().find(|m| m.weight.is_none()) {
        return Err(CliError::Usage(format!(
            "{file}: module `{}` has a bias or running statistics but no weight; dmc's layers with those have a weight too",
            m.name
        )));
    }
    out.sort_by(|a, b| natural_cmp(&a.name, &b.name));
    Ok(out)
}

/// The first names of `v`, quoted.
fn quoted(v: &[String]) -> String {
    let mut s: Vec<String> = v.iter().take(8).map(|n| format!("`{n}`")).collect();
    if v.len() > 8 {
        s.push(format!("... ({} more)", v.len() - 8));
    }
    s.join(", ")
}

fn shape_str(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// Whether module `m` has the tensors `layer` needs in `fw`'s layout.
fn fits(m: &Module, layer: &ParamLayer, fw: Framework) -> bool {
    let want_w = layer
        .weight_conversion(fw)
        .foreign_shape(&layer.weight.shape);
    let w_ok = m.weight.as_ref().is_some_and(|w| w.1 == want_w);
    let b_ok = match (&layer.bias, &m.bias) {
        (Some(b), Some(mb)) => mb.1 == b.shape,
        (None, None) => true,
        _ => false,
    };
    let stats_ok = match (&layer.stats, &m.running_mean, &m.running_var) {
        (Some([mean, var]), Some(mm), Some(mv)) => mm.1 == mean.shape && mv.1 == var.shape,
        (None, None, None) => true,
        _ => false,
    };
    w_ok && b_ok && stats_ok
}

/// Expected shapes in words: `weight [256,784], bias [256]`.
fn wanted(layer: &ParamLayer, fw: Framework) -> String {
    let w = layer
        .weight_conversion(fw)
        .foreign_shape(&layer.weight.shape);
    let stats = match &layer.stats {
        Some([m, v]) => format!(
            ", running mean {}, running variance {}",
            shape_str(&m.shape),
            shape_str(&v.shape)
        ),
        None => String::new(),
    };
    match &layer.bias {
        Some(b) => format!(
            "weight {}, bias {}{stats}",
            shape_str(&w),
            shape_str(&b.shape)
        ),
        None => format!("weight {}, no bias{stats}", shape_str(&w)),
    }
}

fn has(m: &Module) -> String {
    let w = m
        .weight
        .as_ref()
        .map(|w| shape_str(&w.1))
        .unwrap_or_default();
    let stats = match (&m.running_mean, &m.running_var) {
        (Some(a), Some(b)) => format!(
            ", running mean {}, running variance {}",
            shape_str(&a.1),
            shape_str(&b.1)
        ),
        (Some(a), None) => format!(", running mean {} only", shape_str(&a.1)),
        (None, Some(b)) => format!(", running variance {} only", shape_str(&b.1)),
        (None, None) => String::new(),
    };
    match &m.bias {
        Some(b) => format!("`{}` (weight {w}, bias {}{stats})", m.name, shape_str(&b.1)),
        None => format!("`{}` (weight {w}, no bias{stats})", m.name),
    }
}

/// Matches every layer to a module: `result[i]` is (module index, how) for `layers[i]`. Every
/// module must be taken.
pub fn match_layers(
    layers: &[ParamLayer],
    mods: &[Module],
    fw: Framework,
    file: &str,
) -> Result<Vec<(usize, MatchedBy)>, CliError> {
    if mods.len() == layers.len() {
        let by_name: Option<Vec<(usize, MatchedBy)>> = layers
            .iter()
            .map(|l| {
                let i = mods.iter().position(|m| m.name == l.name)?;
                fits(&mods[i], l, fw).then_some((i, MatchedBy::Name))
            })
            .collect();
        if let Some(v) = by_name {
            return Ok(v);
        }
    }
    let mut used = vec![false; mods.len()];
    let mut out = Vec::with_capacity(layers.len());
    for layer in layers {
        let candidates: Vec<usize> = (0..mods.len())
            .filter(|&i| !used[i] && fits(&mods[i], layer, fw))
            .collect();
        let Some(&first) = candidates.first() else {
            return Err(no_fit(layer, mods, &used, fw, file));
        };
        used[first] = true;
        // Several modules of these shapes among the unused: the name order decided.
        let how = if candidates.len() > 1 || layers_of_same_shape(layers, layer, fw) > 1 {
            MatchedBy::Order
        } else {
            MatchedBy::Shape
        };
        out.push((first, how));
    }
    let left: Vec<String> = (0..mods.len())
        .filter(|&i| !used[i])
        .map(|i| has(&mods[i]))
        .collect();
    if !left.is_empty() {
        return Err(CliError::Usage(format!(
            "{file}: {} module(s) fit no layer of the program: {}; the file holds a different (larger) network: pass the file of the program's equivalent",
            left.len(),
            left.join(", ")
        )));
    }
    Ok(out)
}

fn layers_of_same_shape(layers: &[ParamLayer], layer: &ParamLayer, fw: Framework) -> usize {
    let key = |l: &ParamLayer| (wanted(l, fw), l.kind);
    let k = key(layer);
    layers.iter().filter(|l| key(l) == k).count()
}

/// The error for a layer no unused module fits, with the closest explanation.
fn no_fit(
    layer: &ParamLayer,
    mods: &[Module],
    used: &[bool],
    fw: Framework,
    file: &str,
) -> CliError {
    let unused: Vec<&Module> = (0..mods.len())
        .filter(|&i| !used[i])
        .map(|i| &mods[i])
        .collect();
    let other = match fw {
        Framework::Torch => Framework::Keras,
        Framework::Keras => Framework::Torch,
    };
    let hint = if unused.iter().any(|m| fits(m, layer, other)) {
        format!(
            "; a module fits it in {}'s layout: is the file from {}? (--from {}{})",
            other.name(),
            other.name(),
            other.name(),
            if other == Framework::Keras {
                "; a dmc weights file, in the same layouts, needs no import: pass it to --init"
            } else {
                ""
            }
        )
    } else {
        String::new()
    };
    CliError::Usage(format!(
        "{file}: no module fits layer `{}` ({}: {} in {}'s layout){hint}; unused modules: {}; the file holds a different network, or its layers are in another order or shape",
        layer.name,
        layer.describe(),
        wanted(layer, fw),
        fw.name(),
        if unused.is_empty() {
            "none".to_string()
        } else {
            unused.iter().map(|m| has(m)).collect::<Vec<_>>().join(", ")
        }
    ))
}
