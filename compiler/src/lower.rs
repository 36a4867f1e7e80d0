//! Lowering: a checked [`Model`] (per-sample shapes) plus a batch size becomes the forward IR
//! graph (full shapes, batch first), ending in the loss node.

use dmc_grammar::model::{self, Layer, LossKind, Model, Padding, ValueRef};

use crate::error::CompileError;
use crate::ir::{Graph, ParamMeta, Phase, TensorType, Value};
use crate::op::{
    ConvGeom, ConvOp, DType, DenseOp, ElementwiseOp, Epilogue, LossOp, NormOp, Op, PoolOp, SeqOp,
};
use crate::plan::Init;
use dmc_plan::unary::Coef;

fn dtype(d: model::DType) -> DType {
    match d {
        model::DType::F32 => DType::F32,
        model::DType::I32 => DType::I32,
    }
}

fn full(batch: usize, shape: &[usize]) -> Vec<usize> {
    let mut s = Vec::with_capacity(shape.len() + 1);
    s.push(batch);
    s.extend_from_slice(shape);
    s
}

/// The padding before the input along the height (TF/Keras 'same': of
/// `max((out-1)*stride + k - in, 0)` in total, the smaller half on top; see [`Padding::axis`]).
pub fn pad_before(padding: Padding, input: usize, k: usize, stride: usize) -> usize {
    padding.axis(true, input, k, stride).0
}

/// The convolution geometry of a `conv2d` layer over an `[N, H, W, C]` input (of a
/// `conv_transpose2d`: of the convolution it transposes, the padding explicit).
fn conv_geom(
    (kernel, stride, dilation): ((usize, usize), (usize, usize), (usize, usize)),
    padding: Padding,
    groups: usize,
    xs: &[usize],
) -> ConvGeom {
    let span = |k: usize, d: usize| d * (k - 1) + 1;
    let (pad_top, pad_bottom) = padding.axis(true, xs[1], span(kernel.0, dilation.0), stride.0);
    let (pad_left, pad_right) = padding.axis(false, xs[2], span(kernel.1, dilation.1), stride.1);
    ConvGeom {
        kh: kernel.0,
        kw: kernel.1,
        stride_h: stride.0,
        stride_w: stride.1,
        pad_top,
        pad_bottom,
        pad_left,
        pad_right,
        dil_h: dilation.0,
        dil_w: dilation.1,
        groups,
    }
}

/// A stable 64-bit FNV-1a hash of a layer name: the dropout salt.
pub fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The most bytes the forward values (inputs, targets, every layer's output) and parameters of one
/// step may need: 4 PiB. Every byte count the planner derives from them (gradients, workspaces,
/// offsets, the arena) then stays far from `u64` overflow.
pub const MAX_FORWARD_BYTES: u64 = 1 << 52;

/// Refuses a batch whose forward values exceed [`MAX_FORWARD_BYTES`] (counted without overflow).
fn check_size(model: &Model, batch: usize) -> Result<(), CompileError> {
    let elems = |s: &[usize]| s.iter().fold(1u128, |a, &d| a.saturating_mul(d as u128));
    let per_sample = model
        .inputs
        .iter()
        .chain(&model.targets)
        .map(|d| elems(&d.shape))
        .chain(model.nodes.iter().map(|n| elems(&n.shape)))
        .fold(0u128, u128::saturating_add);
    let params = model
        .params()
        .map(|p| elems(&p.shape))
        .fold(0u128, u128::saturating_add);
    let bytes = per_sample
        .saturating_mul(batch as u128)
        .saturating_add(params)
        .saturating_mul(4);
    if bytes > MAX_FORWARD_BYTES as u128 {
        return Err(CompileError::TooLarge {
            batch,
            bytes,
            limit: MAX_FORWARD_BYTES,
        });
    }
    Ok(())
}

/// Builds the forward graph of `model` for `batch` samples per step.
pub fn lower(model: &Model, batch: usize) -> Result<Graph, CompileError> {
    if batch == 0 {
        return Err(CompileError::InvalidModel(
            "batch size must be positive".into(),
        ));
    }
    check_size(model, batch)?;
    let mut g = Graph::new(batch);
    // A node per layer, parameter, input and target (and the loss); about two edges a node.
    let nleaves = model.inputs.len() + model.targets.len() + model.params().count();
    g.reserve(
        model.nodes.len() + nleaves + 1,
        2 * model.nodes.len() + nleaves + 2,
    );
    // Inputs (forward) and targets (read by the loss) are both fed by the runtime: `Op::Input` leaves.
    let mut leaves =
        |decls: &[model::TensorDecl], phase: Phase| -> Vec<petgraph::stable_graph::NodeIndex> {
            decls
                .iter()
                .map(|d| {
                    g.add_leaf(
                        Op::Input {
                            name: d.name.clone(),
                        },
                        TensorType::new(full(batch, &d.shape), dtype(d.dtype)),
                        d.name.clone(),
                        phase,
                    )
                })
                .collect()
        };
    let input_nodes = leaves(&model.inputs, Phase::Forward);
    let target_nodes = leaves(&model.targets, Phase::Loss);
    let inputs: Vec<Value> = input_nodes.iter().map(|&n| (n, 0)).collect();
    let targets: Vec<Value> = target_nodes.iter().map(|&n| (n, 0)).collect();
    g.inputs.extend(input_nodes);
    g.targets.extend(target_nodes);
    let mut nodes: Vec<Value> = Vec::with_capacity(model.nodes.len());
    let resolve = |nodes: &[Value], r: ValueRef| -> Result<Value, CompileError> {
        let v = match r {
            ValueRef::Input(i) => inputs.get(i),
            ValueRef::Target(i) => targets.get(i),
            ValueRef::Node(i) => nodes.get(i),
        };
        v.copied()
            .ok_or_else(|| CompileError::InvalidModel(format!("dangling reference {r:?}")))
    };

    // Layers read by a ReLU-like activation (their weights get He initialisation).
    // (A flag per model node: a set would hash every node's index.)
    let mut feeds_relu: Vec<bool> = vec![false; model.nodes.len()];
    for i in model
        .nodes
        .iter()
        .filter(|m| matches!(m.layer, Layer::Act(a) if a.he_init()))
        .flat_map(|m| &m.inputs)
        .filter_map(|r| match r {
            ValueRef::Node(i) => Some(*i),
            _ => None,
        })
    {
        if let Some(f) = feeds_relu.get_mut(i) {
            *f = true;
        }
    }
    for (idx, node) in model.nodes.iter().enumerate() {
        let ins: Vec<Value> = node
            .inputs
            .iter()
            .map(|r| resolve(&nodes, *r))
            .collect::<Result<_, _>>()?;
        let arity = match node.layer {
            Layer::Add | Layer::Mul => 2,
            Layer::Concat => ins.len().max(2),
            _ => 1,
        };
        if ins.len() != arity {
            return Err(CompileError::InvalidModel(format!(
                "layer `{}` takes {arity} input(s), got {}",
                node.name,
                ins.len()
            )));
        }
        // Parameter leaves: weight first, then bias.
        let feeds_relu = feeds_relu.get(idx).copied().unwrap_or(false);
        let mut weight = None;
        let mut bias = None;
        // every parameter in declaration order (a layer of several weights: attention's)
        let mut pvals: Vec<Value> = Vec::with_capacity(node.params.len());
        for p in &node.params {
            let init = if let Some(i) = p.init {
                i.to_plan(p.fan_in, p.fan_out)
            } else if p.is_bias {
                Init::Zeros
            } else if matches!(node.layer, Layer::Embedding { .. } | Layer::PosEmbedding) {
                // GPT-2's (PyTorch's `nn.Embedding` draws N(0, 1))
                Init::Normal { std: 0.02 }
            } else if matches!(
                node.layer,
                Layer::BatchNorm { .. } | Layer::LayerNorm { .. }
            ) {
                // PyTorch's: scale 1 (and shift 0)
                Init::Ones
            } else if feeds_relu {
                Init::HeUniform { fan_in: p.fan_in }
            } else {
                Init::GlorotUniform {
                    fan_in: p.fan_in,
                    fan_out: p.fan_out,
                }
            };
            let n = g.add_leaf(
                Op::Param {
                    name: p.name.clone(),
                },
                TensorType::f32(p.shape.clone()),
                p.name.clone(),
                Phase::Forward,
            );
            g.params.push((
                n,
                ParamMeta {
                    name: p.name.clone(),
                    shape: p.shape.clone(),
                    init,
                },
            ));
            if p.is_bias {
                bias = Some((n, 0));
            } else {
                weight = Some((n, 0));
            }
            pvals.push((n, 0));
        }
        if let Layer::Dense { tied: Some(e), .. } = node.layer {
            // the tied embedding's table [V, D], read as the weight [D, V]
            weight = Some(tied_weight(&mut g, model, e, &node.name)?);
        }
        let want = |has_bias: bool| -> Result<Vec<Value>, CompileError> {
            let w = weight.ok_or_else(|| {
                CompileError::InvalidModel(format!("layer `{}` has no weight", node.name))
            })?;
            let mut v = vec![ins[0], w];
            match (has_bias, bias) {
                (true, Some(b)) => v.push(b),
                (false, None) => {}
                _ => {
                    return Err(CompileError::InvalidModel(format!(
                        "layer `{}`: bias flag and params disagree",
                        node.name
                    )))
                }
            }
            Ok(v)
        };
        let hint = TensorType::f32(full(batch, &node.shape));
        let name = node.name.clone();
        let ph = Phase::Forward;
        let n = match &node.layer {
            Layer::Conv2d {
                kernel,
                stride,
                padding,
                dilation,
                groups,
                bias: has_bias,
                ..
            } => {
                let xs = g.ty(ins[0]).shape.clone();
                let positive = [
                    kernel.0, kernel.1, stride.0, stride.1, dilation.0, dilation.1,
                ];
                if xs.len() != 4 || positive.contains(&0) || *groups == 0 {
                    return Err(CompileError::InvalidModel(format!(
                        "conv `{name}` needs an NHWC input and kernel, stride, dilation, groups > 0"
                    )));
                }
                let geom = conv_geom((*kernel, *stride, *dilation), *padding, *groups, &xs);
                g.add_node(
                    Op::Conv(ConvOp::Conv2d {
                        geom,
                        bias: *has_bias,
                        epi: Epilogue::NONE,
                    }),
                    &want(*has_bias)?,
                    name,
                    ph,
                    Some(&hint),
                )?
            }
            Layer::ConvTranspose2d {
                kernel,
                stride,
                padding: (top, bottom, left, right),
                output_padding,
                dilation,
                groups,
                bias: has_bias,
                ..
            } => {
                let xs = g.ty(ins[0]).shape.clone();
                let positive = [
                    kernel.0, kernel.1, stride.0, stride.1, dilation.0, dilation.1,
                ];
                if xs.len() != 4 || positive.contains(&0) || *groups == 0 {
                    return Err(CompileError::InvalidModel(format!(
                        "conv_transpose2d `{name}` needs an NHWC input and kernel, stride, dilation, groups > 0"
                    )));
                }
                let padding = Padding::Explicit {
                    top: *top,
                    bottom: *bottom,
                    left: *left,
                    right: *right,
                };
                let geom = conv_geom((*kernel, *stride, *dilation), padding, *groups, &xs);
                g.add_node(
                    Op::Conv(ConvOp::ConvTranspose2d {
                        geom,
                        out_pad: *output_padding,
                        bias: *has_bias,
                    }),
                    &want(*has_bias)?,
                    name,
                    ph,
                    Some(&hint),
                )?
            }
            // (a tied layer's weight is its embedding's table, transposed: `tied_weight` above)
            Layer::Dense { bias: has_bias, .. } => {
                let mut ins = want(*has_bias)?;
                let op = Op::Dense(DenseOp::Dense {
                    bias: *has_bias,
                    epi: Epilogue::NONE,
                });
                if g.ty(ins[0]).shape.len() > 2 {
                    // a sequence [B, T, K]: one GEMM over every position's row
                    ins[0] = rows(&mut g, ins[0], &name)?;
                    let y = g.add_node(op, &ins, [name.as_str(), " (rows)"].concat(), ph, None)?;
                    g.add_node(Op::Reshape, &[(y, 0)], name, ph, Some(&hint))?
                } else {
                    g.add_node(op, &ins, name, ph, None)?
                }
            }
            Layer::MaxPool { geom } => g.add_node(
                Op::Pool(PoolOp::MaxPool { geom: *geom }),
                &ins,
                name,
                ph,
                None,
            )?,
            Layer::AvgPool { geom } => g.add_node(
                Op::Pool(PoolOp::AvgPool { geom: *geom }),
                &ins,
                name,
                ph,
                None,
            )?,
            Layer::GlobalAvgPool => {
                g.add_node(Op::Pool(PoolOp::GlobalAvgPool), &ins, name, ph, None)?
            }
            Layer::GlobalMaxPool => {
                g.add_node(Op::Pool(PoolOp::GlobalMaxPool), &ins, name, ph, None)?
            }
            Layer::Upsample { factor } => {
                let op = Op::Pool(PoolOp::Upsample { factor: *factor });
                g.add_node(op, &ins, name, ph, None)?
            }
            // views: the output shares the input's buffer (row-major, no copy)
            Layer::Flatten | Layer::Reshape => {
                g.add_node(Op::Reshape, &ins, name, ph, Some(&hint))?
            }
            // On a sequence whose values are the rows of a GEMM (a dense layer's output seen as
            // [B, T, M]), an activation or a sum runs on the rows and is seen as [B, T, M] after
            // it: `fuse_epilogues` then finds it right after the GEMM that produced its input (and
            // its backward right after the data gradient) and folds it in.
            Layer::Act(k) => {
                let op = Op::Elementwise(ElementwiseOp::Unary(*k));
                match seen_as_rows(&g, ins[0]) {
                    Some(r) => on_rows(&mut g, op, &[r], name, &hint)?,
                    None => g.add_node(op, &ins, name, ph, None)?,
                }
            }
            Layer::Add => {
                let op = Op::Elementwise(ElementwiseOp::Add);
                let rank = g.ty(ins[0]).shape.len();
                if rank > 2 && ins.iter().any(|v| seen_as_rows(&g, *v).is_some()) {
                    let a = rows(&mut g, ins[0], &name)?;
                    let b = rows(&mut g, ins[1], &name)?;
                    on_rows(&mut g, op, &[a, b], name, &hint)?
                } else {
                    g.add_node(op, &ins, name, ph, None)?
                }
            }
            Layer::Mul => g.add_node(Op::Elementwise(ElementwiseOp::Mul), &ins, name, ph, None)?,
            // n values: a chain of n - 1 binary joins, the last one named as the layer
            Layer::Concat => {
                let op = Op::Elementwise(ElementwiseOp::Concat);
                let mut acc = ins[0];
                for (k, v) in ins.iter().enumerate().skip(1) {
                    let part = if k + 1 == ins.len() {
                        name.clone()
                    } else {
                        format!("{name} (part {k})")
                    };
                    acc = (g.add_node(op.clone(), &[acc, *v], part, ph, None)?, 0);
                }
                acc.0
            }
            Layer::Softmax => g.add_node(
                Op::Elementwise(ElementwiseOp::Softmax),
                &ins,
                name,
                ph,
                None,
            )?,
            Layer::BatchNorm { momentum, eps } => {
                let ins = want(true)?;
                let c = node.shape.last().copied().unwrap_or(0);
                let count = g.ty(ins[0]).numel() / c.max(1);
                let op = Op::Norm(NormOp::BatchNorm {
                    eps: Coef(*eps),
                    ranks: 1,
                });
                let bn = g.add_node(op, &ins, name.clone(), ph, None)?;
                // The running statistics (PyTorch's names and initial values): persistent, saved
                // with the weights, updated once per step by an update-phase op that remat never
                // recomputes (eval and predict read them instead: `batchnorm_to_inference`).
                let mut stats = vec![];
                for (suffix, init) in [("running_mean", Init::Zeros), ("running_var", Init::Ones)] {
                    let sname = [name.as_str(), ".", suffix].concat();
                    let leaf = g.add_leaf(
                        Op::RunStat {
                            name: sname.clone(),
                        },
                        TensorType::f32(vec![c]),
                        sname.clone(),
                        Phase::Forward,
                    );
                    g.params.push((
                        leaf,
                        ParamMeta {
                            name: sname,
                            shape: vec![c],
                            init,
                        },
                    ));
                    stats.push((leaf, 0));
                }
                g.add_node(
                    Op::Norm(NormOp::BatchNormStats {
                        momentum: Coef(*momentum),
                        count,
                    }),
                    &[stats[0], stats[1], (bn, 1), (bn, 2)],
                    [name.as_str(), " running stats"].concat(),
                    Phase::Update,
                    None,
                )?;
                bn
            }
            Layer::LayerNorm { eps } => {
                // weight (scale) and bias (shift) as batchnorm's; no running statistics
                let ins = want(true)?;
                let op = Op::Norm(NormOp::LayerNorm { eps: Coef(*eps) });
                g.add_node(op, &ins, name, ph, None)?
            }
            Layer::Embedding { .. } => {
                let op = Op::Seq(SeqOp::Embedding);
                g.add_node(op, &want(false)?, name, ph, None)?
            }
            Layer::PosEmbedding => {
                let op = Op::Seq(SeqOp::AddPositions);
                g.add_node(op, &want(false)?, name, ph, None)?
            }
            Layer::Attention {
                heads,
                causal,
                bias: has_bias,
            } => attention(
                &mut g,
                ins[0],
                &pvals,
                (*heads, *causal, *has_bias),
                &name,
                &hint,
            )?,
            Layer::Dropout { p } => g.add_node(
                Op::Elementwise(ElementwiseOp::Dropout {
                    p: *p,
                    salt: stable_hash(&node.name),
                }),
                &ins,
                name,
                ph,
                None,
            )?,
        };
        if g.node(n).outputs[0].shape != hint.shape {
            return Err(CompileError::InvalidModel(format!(
                "layer `{}`: computed shape {} differs from the checked shape {}",
                node.name,
                g.node(n).outputs[0],
                hint
            )));
        }
        nodes.push((n, 0));
    }

    // The loss: each term's op (weighted), their sum by `Add`s of the scalars, in term order.
    let mut loss: Option<Value> = None;
    let many = model.loss.terms.len() > 1;
    let mut reshaped: Vec<(Value, TensorType, Value)> = vec![];
    for (i, term) in model.loss.terms.iter().enumerate() {
        let pred = resolve(&nodes, term.pred)?;
        let target = resolve(&nodes, term.target)?;
        let weight = term.weight;
        let loss_op = match term.kind {
            LossKind::Mse => LossOp::MseLoss { weight },
            LossKind::Mae => LossOp::MaeLoss { weight },
            LossKind::Huber { delta } => LossOp::HuberLoss { delta, weight },
            LossKind::BceWithLogits => LossOp::BceWithLogitsLoss { weight },
            LossKind::CrossEntropy { label_smoothing } => LossOp::CrossEntropyLoss {
                label_smoothing,
                weight,
            },
        };
        // logits per position [B, T, C] (labels [B, T]): one row per position
        let pred =
            if matches!(loss_op, LossOp::CrossEntropyLoss { .. }) && g.ty(pred).shape.len() > 2 {
                let pname = g.node(pred.0).name.clone();
                rows(&mut g, pred, &pname)?
            } else {
                pred
            };
        let target = loss_target(&mut g, &loss_op, pred, target, &mut reshaped)?;
        let name = if many {
            format!("loss {} ({})", i + 1, term.kind.name())
        } else {
            "loss".to_string()
        };
        let l = (
            g.add_node(Op::Loss(loss_op), &[pred, target], name, Phase::Loss, None)?,
            0,
        );
        loss = Some(match loss {
            None => l,
            Some(prev) => (
                g.add_node(
                    Op::Elementwise(ElementwiseOp::Add),
                    &[prev, l],
                    format!("loss (sum of terms 1..{})", i + 1),
                    Phase::Loss,
                    None,
                )?,
                0,
            ),
        });
    }
    g.loss = loss;
    g.output = resolve(&nodes, model.output)?;
    Ok(g)
}

/// The target as a loss op reads it: the prediction's shape, or one label per row of logits (a reshape
/// of the declared target, made once per target and shape and shared by the terms).
fn loss_target(
    g: &mut Graph,
    op: &LossOp,
    pred: Value,
    target: Value,
    reshaped: &mut Vec<(Value, TensorType, Value)>,
) -> Result<Value, CompileError> {
    let pt = g.ty(pred).clone();
    let tt = g.ty(target).clone();
    let want = if op.elementwise_target() {
        TensorType::new(pt.shape.clone(), tt.dtype)
    } else {
        TensorType::new(vec![pt.shape[0]], tt.dtype)
    };
    if tt.shape == want.shape {
        return Ok(target);
    }
    if let Some((_, _, r)) = reshaped.iter().find(|(t, w, _)| *t == target && *w == want) {
        return Ok(*r);
    }
    let tname = g.node(target.0).name.clone();
    let r = (
        g.add_node(
            Op::Reshape,
            &[target],
            format!("{tname} (as {})", want),
            Phase::Loss,
            Some(&want),
        )?,
        0,
    );
    reshaped.push((target, want, r));
    Ok(r)
}

/// The weight of a dense layer tied to the embedding whose output is model node `e`: that
/// embedding's table, transposed (a `Transpose` node named after the dense layer).
fn tied_weight(g: &mut Graph, model: &Model, e: usize, name: &str) -> Result<Value, CompileError> {
    let table = model
        .nodes
        .get(e)
        .and_then(|n| n.params.first())
        .map(|p| p.name.as_str())
        .ok_or_else(|| {
            CompileError::InvalidModel(format!("dense `{name}`: its tie is not an embedding"))
        })?;
    let leaf = g
        .params
        .iter()
        .find(|(_, m)| m.name == table)
        .map(|(n, _)| *n)
        .ok_or_else(|| {
            CompileError::InvalidModel(format!("dense `{name}`: no parameter `{table}`"))
        })?;
    let op = Op::Seq(SeqOp::Transpose);
    let t = g.add_node(
        op,
        &[(leaf, 0)],
        [name, " (tied weight)"].concat(),
        Phase::Forward,
        None,
    )?;
    Ok((t, 0))
}

/// `v` `[B, .., K]` seen as rows `[B * .., K]` (a view), named after `name`.
fn rows(g: &mut Graph, v: Value, name: &str) -> Result<Value, CompileError> {
    if let Some(r) = seen_as_rows(g, v) {
        return Ok(r);
    }
    let s = &g.ty(v).shape;
    let k = s.last().copied().unwrap_or(1);
    let flat = TensorType::f32(vec![s.iter().product::<usize>() / k.max(1), k]);
    let n = g.add_node(
        Op::Reshape,
        &[v],
        [name, " (as rows)"].concat(),
        Phase::Forward,
        Some(&flat),
    )?;
    Ok((n, 0))
}

/// The rows `[B * T, M]` that `v` `[B, T, M]` is a view of (a `Reshape` of them), if it is one.
fn seen_as_rows(g: &Graph, v: Value) -> Option<Value> {
    let t = g.ty(v);
    if t.shape.len() < 3 || !matches!(g.node(v.0).op, Op::Reshape) {
        return None;
    }
    let src = *g.inputs(v.0).first()?;
    let k = *t.shape.last()?;
    let s = &g.ty(src).shape;
    (s.len() == 2 && s[1] == k && s[0] * k == t.numel()).then_some(src)
}

/// `op` on the rows `ins` (each `[B * T, M]`), then seen as `hint` `[B, T, M]` (the node named
/// `name`, the layer's).
fn on_rows(
    g: &mut Graph,
    op: Op,
    ins: &[Value],
    name: String,
    hint: &TensorType,
) -> Result<petgraph::stable_graph::NodeIndex, CompileError> {
    let y = g.add_node(
        op,
        ins,
        [name.as_str(), " (rows)"].concat(),
        Phase::Forward,
        None,
    )?;
    g.add_node(Op::Reshape, &[(y, 0)], name, Phase::Forward, Some(hint))
}

/// Multi-head self-attention over `x` `[B, T, D]` with the parameters `ps` (qkv weight, its bias,
/// out weight, its bias; without the biases when `bias` is false): the packed projection (one
/// GEMM over every position), the fused attention, the output projection.
fn attention(
    g: &mut Graph,
    x: Value,
    ps: &[Value],
    (heads, causal, bias): (usize, bool, bool),
    name: &str,
    hint: &TensorType,
) -> Result<petgraph::stable_graph::NodeIndex, CompileError> {
    let ph = Phase::Forward;
    let (wqkv, wout) = match (bias, ps) {
        (true, [w, b, wo, bo]) => (vec![*w, *b], vec![*wo, *bo]),
        (false, [w, wo]) => (vec![*w], vec![*wo]),
        _ => {
            return Err(CompileError::InvalidModel(format!(
                "attention `{name}`: bias flag and params disagree"
            )))
        }
    };
    let &[b, t, d] = g.ty(x).shape.as_slice() else {
        return Err(CompileError::InvalidModel(format!(
            "attention `{name}` needs [batch, T, D], got {}",
            g.ty(x)
        )));
    };
    let dense = Op::Dense(DenseOp::Dense {
        bias,
        epi: Epilogue::NONE,
    });
    let xr = rows(g, x, name)?;
    let mut qi = vec![xr];
    qi.extend(wqkv);
    let qkv = g.add_node(dense.clone(), &qi, [name, " (qkv)"].concat(), ph, None)?;
    let packed = TensorType::f32(vec![b, t, 3 * d]);
    let qkv = g.add_node(
        Op::Reshape,
        &[(qkv, 0)],
        [name, " (qkv heads)"].concat(),
        ph,
        Some(&packed),
    )?;
    let att = Op::Seq(SeqOp::Attention { heads, causal });
    let o = g.add_node(att, &[(qkv, 0)], [name, " (heads)"].concat(), ph, None)?;
    let orows = rows(g, (o, 0), &[name, " (heads)"].concat())?;
    let mut oi = vec![orows];
    oi.extend(wout);
    let y = g.add_node(dense, &oi, [name, " (out)"].concat(), ph, None)?;
    g.add_node(Op::Reshape, &[(y, 0)], name.to_string(), ph, Some(hint))
}
