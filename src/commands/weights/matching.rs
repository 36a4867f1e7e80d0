//! Which tensor of another framework's file is which dmc parameter. The file's tensors are grouped
//! into modules by name (`features.0.weight` and `features.0.bias` are module `features.0`;
//! `dense_1/kernel:0` is `dense_1`; Keras 3's `layers/dense/vars/0` is `layers/dense`; an
//! `nn.MultiheadAttention`'s `attn.in_proj_weight` and `attn.out_proj.weight` are module `attn`,
//! and so are a Keras `MultiHeadAttention`'s `attn/query/kernel` ... `attn/attention_output/bias`;
//! a bare parameter such as `pos_embed` is a module of its own). Then
//!
//! 1. if every layer of the program has a module of its own name that fits, and the file has no
//!    other module (a file dmc exported, or a model written with dmc's layer names), by name;
//! 2. else every layer, in program order, takes the first unused module, in natural name order
//!    (`2` before `10`), whose tensors have the shapes the layer needs in that framework's
//!    layout. Names are never matched one by one here: Keras numbers its layers `conv2d`,
//!    `conv2d_1`, ... where dmc has `conv2d_1`, `conv2d_2`, ..., so a shared name need not be the
//!    same layer. Only the tables of equal shapes (token and position embeddings, a tied head's
//!    copy of the table) are told apart by their names first (`wpe`, `pos_embed`, `lm_head`).
//!
//! Layers of distinct shapes are thus matched by shape alone, whatever the names; layers of equal
//! shapes by the order of their names (the order of an `nn.Sequential`, of `layer1`, `layer2`).

use std::cmp::Ordering;

use dmc_runtime::io::NamedArray;

use super::layers::{Framework, Kind, ParamLayer, Role};
use crate::report::CliError;

/// The tensors of one module of the file, each with its role.
#[derive(Debug)]
pub struct Module {
    pub name: String,
    pub tensors: Vec<(Role, NamedArray)>,
}

impl Module {
    pub fn get(&self, role: Role) -> Option<&NamedArray> {
        self.tensors.iter().find(|t| t.0 == role).map(|t| &t.1)
    }
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
    /// One of several modules of its shapes, told apart by its name: `wpe`, `pos_embed`,
    /// `position_embedding` for a pos_embedding, `lm_head` for a tied head.
    Hint,
    /// An embedding's table, found as the weight of the head tied to it (the file holds the
    /// shared tensor once, under the head's name).
    Tied,
}

impl MatchedBy {
    pub fn describe(self) -> &'static str {
        match self {
            MatchedBy::Name => "name",
            MatchedBy::Shape => "shape",
            MatchedBy::Order => "shape + name order",
            MatchedBy::Hint => "shape + name hint",
            MatchedBy::Tied => "tied head's weight",
        }
    }
}

/// What a file tensor's name says.
enum Split {
    /// (module, role)
    Known(String, Role),
    /// Not a name dmc knows the role of (`pos_embed`, `1.lookup`).
    Unknown,
    /// A tensor of a PyTorch module dmc has no equivalent of: why.
    Refused(&'static str),
}

/// A (module, tensor role) of a file tensor name. Keras 3's `vars/0..3` are a layer's kernel
/// (batchnorm: gamma), bias (beta), and a batchnorm's moving mean and variance.
fn split_name(name: &str) -> Split {
    let name = name.strip_suffix(":0").unwrap_or(name);
    if let Some((module, index)) = name.rsplit_once("/vars/") {
        let role = match index {
            "0" => Role::Weight,
            "1" => Role::Bias,
            "2" => Role::RunningMean,
            "3" => Role::RunningVar,
            _ => return Split::Unknown,
        };
        return Split::Known(module.to_string(), role);
    }
    let (module, leaf) = match name.rfind(['.', '/']) {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => ("", name),
    };
    let role = match leaf {
        "weight" | "kernel" | "gamma" | "embeddings" => Role::Weight,
        "bias" | "beta" => Role::Bias,
        "running_mean" | "moving_mean" => Role::RunningMean,
        "running_var" | "moving_variance" => Role::RunningVar,
        "in_proj_weight" => Role::InProjWeight,
        "in_proj_bias" => Role::InProjBias,
        "q_proj_weight" | "k_proj_weight" | "v_proj_weight" => {
            return Split::Refused("separate query / key / value projections (`nn.MultiheadAttention` with `kdim` or `vdim` other than the model width): dmc's attention is self-attention with one `in_proj_weight`")
        }
        "bias_k" | "bias_v" => {
            return Split::Refused("`nn.MultiheadAttention(add_bias_kv=True)`: dmc's attention has no extra key / value biases")
        }
        _ => return Split::Unknown,
    };
    Split::Known(module.to_string(), role)
}

/// Keras `MultiHeadAttention`'s sub-layers (Keras 3 `v.path` names, then its `.weights.h5`
/// names) and the roles of their kernel and bias.
const KERAS_ATTENTION: [(&[&str], Role, Role); 4] = [
    (
        &["query", "query_dense", "_query_dense"],
        Role::QueryKernel,
        Role::QueryBias,
    ),
    (
        &["key", "key_dense", "_key_dense"],
        Role::KeyKernel,
        Role::KeyBias,
    ),
    (
        &["value", "value_dense", "_value_dense"],
        Role::ValueKernel,
        Role::ValueBias,
    ),
    (
        &["attention_output", "output_dense", "_output_dense"],
        Role::OutputKernel,
        Role::OutputBias,
    ),
];

/// Joins the modules of one attention layer: PyTorch's `P.out_proj` (a `Linear`) into `P` (which
/// has the `in_proj_weight`); Keras's `P/query`, `P/key`, `P/value` and `P/attention_output`
/// (all four) into `P`.
fn join_attention(mods: &mut Vec<Module>) {
    let plain = |m: &Module| {
        m.tensors
            .iter()
            .all(|t| matches!(t.0, Role::Weight | Role::Bias))
    };
    // PyTorch
    let mut i = 0;
    while i < mods.len() {
        let parent = mods[i].name.strip_suffix(".out_proj").map(str::to_string);
        let p = parent.and_then(|p| {
            mods.iter()
                .position(|m| m.name == p && m.get(Role::InProjWeight).is_some())
        });
        match p {
            Some(p) if plain(&mods[i]) => {
                let m = mods.remove(i);
                let p = if p > i { p - 1 } else { p };
                for (role, t) in m.tensors {
                    let role = match role {
                        Role::Weight => Role::OutProjWeight,
                        _ => Role::OutProjBias,
                    };
                    mods[p].tensors.push((role, t));
                }
            }
            _ => i += 1,
        }
    }
    // Keras
    let parent_of = |m: &Module| -> Option<(String, usize)> {
        let (parent, sub) = m.name.rsplit_once('/')?;
        let k = KERAS_ATTENTION
            .iter()
            .position(|(names, _, _)| names.contains(&sub))?;
        (!parent.is_empty() && plain(m)).then(|| (parent.to_string(), k))
    };
    let mut parents: Vec<String> = mods
        .iter()
        .filter_map(|m| parent_of(m).map(|p| p.0))
        .collect();
    parents.sort();
    parents.dedup();
    for parent in parents {
        let subs: Vec<Option<usize>> = (0..KERAS_ATTENTION.len())
            .map(|k| {
                mods.iter()
                    .position(|m| parent_of(m).is_some_and(|(p, j)| p == parent && j == k))
            })
            .collect();
        if subs.iter().any(Option::is_none) {
            continue;
        }
        let mut tensors = Vec::new();
        for (k, (_, kernel, bias)) in KERAS_ATTENTION.iter().enumerate() {
            let j = mods
                .iter()
                .position(|m| parent_of(m).is_some_and(|(p, j)| p == parent && j == k))
                .expect("found above");
            for (role, t) in mods.remove(j).tensors {
                tensors.push((if role == Role::Weight { *kernel } else { *bias }, t));
            }
        }
        match mods.iter().position(|m| m.name == parent) {
            Some(p) => mods[p].tensors.extend(tensors),
            None => mods.push(Module {
                name: parent,
                tensors,
            }),
        }
    }
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

/// Groups the file's tensors into modules, in natural name order. A tensor whose name has no
/// role dmc knows (`pos_embed`, an `nn.Parameter`) is a module of its own, its weight, when it
/// could be a position table (`[t, d]` or `[1, t, d]`).
pub fn modules(tensors: Vec<NamedArray>, file: &str) -> Result<Vec<Module>, CliError> {
    let mut out: Vec<Module> = Vec::new();
    let mut unknown = Vec::new();
    for t in tensors {
        let (module, role) = match split_name(&t.0) {
            Split::Known(m, r) => (m, r),
            Split::Unknown if t.1.len() == 2 || (t.1.len() == 3 && t.1[0] == 1) => {
                (t.0.clone(), Role::Weight)
            }
            Split::Unknown => {
                unknown.push(t.0);
                continue;
            }
            Split::Refused(why) => {
                return Err(CliError::Usage(format!(
                    "{file}: tensor `{}` belongs to {why}; dmc cannot import it",
                    t.0
                )))
            }
        };
        let i = match out.iter().position(|m| m.name == module) {
            Some(i) => i,
            None => {
                out.push(Module {
                    name: module,
                    tensors: Vec::new(),
                });
                out.len() - 1
            }
        };
        if let Some(first) = out[i].get(role) {
            return Err(CliError::Usage(format!(
                "{file}: module `{}` has two {} tensors (`{}` and `{}`); dmc takes one of each per layer",
                out[i].name,
                role.describe(),
                first.0,
                t.0
            )));
        }
        out[i].tensors.push((role, t));
    }
    if !unknown.is_empty() {
        return Err(CliError::Usage(format!(
            "{file}: tensor(s) {} are neither a weight (`.weight`, `kernel`, `gamma`, `embeddings`), a bias (`bias`, `beta`), a batchnorm statistic (`running_mean`, `running_var`, `moving_mean`, `moving_variance`), an attention projection (`in_proj_weight`, `in_proj_bias`, `out_proj`) nor a position table ([t, d] or [1, t, d]): dmc's layers hold only those (conv2d, conv_transpose2d, dense, batchnorm, layernorm, embedding, pos_embedding, attention); remove them from the file (e.g. drop the keys from the state_dict before saving) if the model is otherwise the program's",
            quoted(&unknown)
        )));
    }
    join_attention(&mut out);
    if let Some(m) = out.iter().find(|m| {
        m.get(Role::Weight).is_none()
            && (m.get(Role::RunningMean).is_some() || m.get(Role::RunningVar).is_some())
    }) {
        return Err(CliError::Usage(format!(
            "{file}: module `{}` has running statistics but no weight; dmc's layers with those have a weight too",
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

/// Whether module `m` has the tensors `layer` needs in `fw`'s layout, and no others.
pub fn fits(m: &Module, layer: &ParamLayer, fw: Framework) -> bool {
    let mut used: Vec<Role> = Vec::new();
    for slot in layer.slots(fw) {
        for (i, &role) in slot.roles.iter().enumerate() {
            match m.get(role) {
                Some(t) if slot.layout.accepts(&slot.param.shape, i, &t.1) => used.push(role),
                _ => return false,
            }
        }
    }
    // A tied head may hold the other framework's copy of the table.
    if let Some((role, shape, _)) = layer.tied_weight(fw) {
        match m.get(role) {
            Some(t) if t.1 == shape => used.push(role),
            Some(_) => return false,
            None => {}
        }
    }
    !m.tensors.is_empty() && m.tensors.iter().all(|t| used.contains(&t.0))
}

/// Whether a layer of this kind has no bias when it could have one (said as `no bias`).
fn biasless(layer: &ParamLayer) -> bool {
    matches!(
        layer.kind,
        Kind::Conv2d | Kind::ConvTranspose2d | Kind::Dense | Kind::TiedDense
    ) && layer.params.iter().all(|p| !p.is_bias)
}

/// Expected shapes in words: `weight [256,784], bias [256]`.
fn wanted(layer: &ParamLayer, fw: Framework) -> String {
    let mut parts: Vec<String> = Vec::new();
    for slot in layer.slots(fw) {
        let shapes = slot.layout.foreign_shapes(&slot.param.shape);
        for (role, shape) in slot.roles.iter().zip(&shapes) {
            let alt = match (&slot.layout, shape.as_slice()) {
                (super::layers::Layout::Positions, &[t, d]) => format!(" (or [1,{t},{d}])"),
                _ => String::new(),
            };
            parts.push(format!("{} {}{alt}", role.describe(), shape_str(shape)));
        }
        if slot.roles == [Role::Weight] && biasless(layer) {
            parts.push("no bias".to_string());
        }
    }
    if let Some((role, shape, _)) = layer.tied_weight(fw) {
        if biasless(layer) {
            parts.push("no bias".to_string());
        }
        let t = layer.tied.as_ref().map_or("", |t| t.embedding.as_str());
        parts.push(format!(
            "optionally a {} {} equal to `{t}`'s table (tied)",
            role.describe(),
            shape_str(&shape)
        ));
    }
    parts.join(", ")
}

fn has(m: &Module) -> String {
    let mut roles: Vec<&(Role, NamedArray)> = m.tensors.iter().collect();
    roles.sort_by_key(|t| t.0);
    let mut parts: Vec<String> = Vec::new();
    let attention = roles.iter().any(|t| t.0 > Role::RunningVar);
    for (role, t) in roles.iter().map(|t| (t.0, &t.1)) {
        let only = match role {
            Role::RunningMean if m.get(Role::RunningVar).is_none() => " only",
            Role::RunningVar if m.get(Role::RunningMean).is_none() => " only",
            _ => "",
        };
        parts.push(format!("{} {}{only}", role.describe(), shape_str(&t.1)));
        if role == Role::Weight && m.get(Role::Bias).is_none() && !attention {
            parts.push("no bias".to_string());
        }
    }
    format!("`{}` ({})", m.name, parts.join(", "))
}

/// What the name of module `m` says it is (its last part): 1 a position table (`wpe`,
/// `pos_embed`, `position_embedding`), 2 an output head (`lm_head`), else 0.
fn name_hint(m: &Module) -> u8 {
    let last = m
        .name
        .rsplit(['.', '/'])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    if last == "wpe" || last.starts_with("pos") || last.contains("position") {
        1
    } else if last.contains("head") {
        2
    } else {
        0
    }
}

/// How well a module's name suits `layer` (lower is better): layers of equal shapes (a token
/// table, a position table of as many rows, a tied head's copy of the table) are told apart by
/// their names before their order.
fn rank(layer: &ParamLayer, m: &Module) -> u8 {
    let h = name_hint(m);
    match layer.kind {
        Kind::Embedding => [0, 2, 1][h as usize],
        Kind::PosEmbedding => [1, 0, 2][h as usize],
        Kind::TiedDense => [1, 2, 0][h as usize],
        _ => 0,
    }
}

/// Matches every layer to a module: `result[i]` is (module index, how) for `layers[i]`, `None`
/// for a layer without tensors of its own in the file (a tied head without bias). Every module
/// must be taken.
pub fn match_layers(
    layers: &[ParamLayer],
    mods: &[Module],
    fw: Framework,
    file: &str,
) -> Result<Vec<Option<(usize, MatchedBy)>>, CliError> {
    let by_name: Option<Vec<Option<(usize, MatchedBy)>>> = layers
        .iter()
        .map(|l| match mods.iter().position(|m| m.name == l.name) {
            Some(i) => fits(&mods[i], l, fw).then_some(Some((i, MatchedBy::Name))),
            None if l.optional() => Some(None),
            None => None,
        })
        .collect();
    if let Some(v) = by_name {
        if v.iter().flatten().count() == mods.len() {
            return Ok(v);
        }
    }
    let mut used = vec![false; mods.len()];
    let mut out = Vec::with_capacity(layers.len());
    for layer in layers {
        let candidates: Vec<usize> = (0..mods.len())
            .filter(|&i| !used[i] && fits(&mods[i], layer, fw))
            .collect();
        let Some(&best) = candidates.iter().min_by_key(|&&i| rank(layer, &mods[i])) else {
            if layer.optional() || heads_of(layers, layer).next().is_some() {
                // An embedding may find its table in its tied head's module (below).
                out.push(None);
                continue;
            }
            return Err(no_fit(layer, mods, &used, fw, file));
        };
        used[best] = true;
        let hinted = candidates
            .iter()
            .any(|&i| rank(layer, &mods[i]) != rank(layer, &mods[best]));
        // Several modules of these shapes among the unused: the names decided.
        let how = if hinted {
            MatchedBy::Hint
        } else if candidates.len() > 1 || layers_of_same_shape(layers, layer, fw) > 1 {
            MatchedBy::Order
        } else {
            MatchedBy::Shape
        };
        out.push(Some((best, how)));
    }
    // An embedding without a module of its own whose table the file holds only as its tied head's
    // weight (`safetensors.torch.save_model` keeps one name of a shared tensor: `lm_head.weight`
    // with `lm_head.bias`): that weight is the table.
    for (li, layer) in layers.iter().enumerate() {
        if out[li].is_some() || layer.kind != Kind::Embedding {
            continue;
        }
        let shared = heads_of(layers, layer).find_map(|hi| {
            let (mi, _) = out[hi]?;
            let w = mods[mi].get(Role::Weight)?;
            let slot = layer.slots(fw).into_iter().next()?;
            slot.layout
                .accepts(&slot.param.shape, 0, &w.1)
                .then_some(mi)
        });
        match shared {
            Some(mi) => out[li] = Some((mi, MatchedBy::Tied)),
            None => return Err(no_fit(layer, mods, &used, fw, file)),
        }
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

/// The indices of the dense layers tied to embedding `layer`.
fn heads_of<'a>(
    layers: &'a [ParamLayer],
    layer: &'a ParamLayer,
) -> impl Iterator<Item = usize> + 'a {
    layers.iter().enumerate().filter_map(move |(i, l)| {
        (layer.kind == Kind::Embedding
            && l.tied.as_ref().is_some_and(|t| t.embedding == layer.name))
        .then_some(i)
    })
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
    let other = fw.other();
    let mut hint = if unused.iter().any(|m| fits(m, layer, other)) {
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
    if layer.kind == Kind::Attention {
        hint.push_str(match fw {
            Framework::Torch => "; dmc's attention is PyTorch's `nn.MultiheadAttention(d, heads, batch_first=True)` (`in_proj_weight [3d, d]`, `in_proj_bias`, `out_proj.weight`, `out_proj.bias`); an attention written with its own Linear layers has the same layouts when its query, key and value come out of one `Linear(d, 3d)` in that order (nanoGPT's `c_attn`, then `c_proj`): rename those tensors to `<attn>.in_proj_weight`, `<attn>.in_proj_bias`, `<attn>.out_proj.weight`, `<attn>.out_proj.bias`; separate query / key / value Linear layers need `in_proj_weight = torch.cat([q.weight, k.weight, v.weight])` (and their biases likewise)",
            Framework::Keras => "; dmc's attention is Keras's `MultiHeadAttention(heads, key_dim=d // heads)` (`query`, `key`, `value` and `attention_output` kernels and biases); other key or value widths have no dmc equivalent",
        });
    }
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
