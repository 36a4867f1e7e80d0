//! The IR: a dataflow graph of [`Op`] nodes over a petgraph `StableGraph`.
//!
//! A node has one or more typed outputs (full shapes, batch first); an edge carries one output of
//! its source into one input slot of its target. A value is `(NodeIndex, output index)`.
//! [`infer_outputs`] is the ONE shape-inference function, used by lowering, autodiff and the
//! verifier alike.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::{EdgeRef, NodeIndexable};
use petgraph::Direction;

use crate::error::{CompileError, ShapeError};
use crate::op::{DType, Op, ParamKind, PoolGeom};
use crate::plan::Init;
pub use crate::tensor::{fmt_types, TensorType};

/// A value of the dataflow: output `.1` of node `.0`.
pub type Value = (NodeIndex, usize);

/// Which part of the training step a node belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Forward,
    Loss,
    Backward,
    Update,
}

impl From<Phase> for crate::plan::StepPhase {
    fn from(p: Phase) -> Self {
        match p {
            Phase::Forward => crate::plan::StepPhase::Forward,
            Phase::Loss => crate::plan::StepPhase::Loss,
            Phase::Backward => crate::plan::StepPhase::Backward,
            Phase::Update => crate::plan::StepPhase::Update,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub op: Op,
    pub outputs: Vec<TensorType>,
    /// e.g. `conv2d_3`, `conv2d_3.weight`, `grad conv2d_3`.
    pub name: String,
    pub phase: Phase,
}

/// Output `src_output` of the source feeds input slot `dst_input` of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Edge {
    pub src_output: usize,
    pub dst_input: usize,
}

/// What the runtime needs to know about a parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamMeta {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

/// The IR graph plus its distinguished values.
#[derive(Debug, Clone)]
pub struct Graph {
    pub g: StableGraph<Node, Edge>,
    pub batch: usize,
    /// Model inputs, in declaration order.
    pub inputs: Vec<NodeIndex>,
    /// Model targets, in declaration order (empty once a predict pipeline drops the loss).
    pub targets: Vec<NodeIndex>,
    /// Parameter leaves, in model order.
    pub params: Vec<(NodeIndex, ParamMeta)>,
    /// Optimizer state leaves: (leaf, its full name e.g. `dense_1.weight.momentum`, the param leaf).
    pub opt_state: Vec<(NodeIndex, String, NodeIndex)>,
    /// The scalar loss (absent in predict mode).
    pub loss: Option<Value>,
    /// The network's output (the loss' prediction).
    pub output: Value,
    /// Gradient of each parameter leaf (filled by autodiff).
    pub grads: BTreeMap<NodeIndex, Value>,
    /// Scheduling hints (set by rematerialization): a node runs only after all these nodes ran,
    /// so that a recomputation happens right before the backward that needs it.
    pub not_before: BTreeMap<NodeIndex, BTreeSet<NodeIndex>>,
    /// Scratch for [`Graph::add_node`]: the input types of the node being added (reused, so that
    /// adding a node does not allocate its inputs' shapes again).
    scratch: Vec<TensorType>,
}

impl Graph {
    pub fn new(batch: usize) -> Self {
        Graph {
            g: StableGraph::new(),
            batch,
            inputs: vec![],
            targets: vec![],
            params: vec![],
            opt_state: vec![],
            loss: None,
            output: (NodeIndex::new(0), 0),
            grads: BTreeMap::new(),
            not_before: BTreeMap::new(),
            scratch: vec![],
        }
    }

    pub fn node(&self, n: NodeIndex) -> &Node {
        &self.g[n]
    }

    /// Type of a value. Panics only on a dangling value, which the verifier rules out.
    pub fn ty(&self, v: Value) -> &TensorType {
        &self.g[v.0].outputs[v.1]
    }

    /// Adds a leaf (input, parameter, optimizer state) of the given type.
    pub fn add_leaf(
        &mut self,
        op: Op,
        ty: TensorType,
        name: impl Into<String>,
        phase: Phase,
    ) -> NodeIndex {
        self.g.add_node(Node {
            op,
            outputs: vec![ty],
            name: name.into(),
            phase,
        })
    }

    /// Adds a kernel node consuming `inputs` (in slot order); its output types come from
    /// [`infer_outputs`]. `hint` is the expected type of output 0, needed by the ops whose output
    /// shape is not a function of the inputs (see [`infer_outputs`]).
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: &[Value],
        name: impl Into<String>,
        phase: Phase,
        hint: Option<&TensorType>,
    ) -> Result<NodeIndex, CompileError> {
        let name = name.into();
        for v in inputs {
            if !self.g.contains_node(v.0) || v.1 >= self.g[v.0].outputs.len() {
                return Err(CompileError::Internal(format!(
                    "node `{name}`: dangling input value {v:?}"
                )));
            }
        }
        let mut in_types = std::mem::take(&mut self.scratch);
        in_types.truncate(inputs.len());
        for (i, v) in inputs.iter().enumerate() {
            let t = self.ty(*v);
            match in_types.get_mut(i) {
                Some(d) => {
                    d.shape.clone_from(&t.shape);
                    d.dtype = t.dtype;
                }
                None => in_types.push(t.clone()),
            }
        }
        let outputs = infer_outputs(&op, &in_types, hint).map_err(|e| CompileError::Shape {
            node: name.clone(),
            op: op.kind_name(),
            inputs: fmt_types(&in_types),
            source: e,
        })?;
        self.scratch = in_types;
        let n = self.g.add_node(Node {
            op,
            outputs,
            name,
            phase,
        });
        for (i, v) in inputs.iter().enumerate() {
            self.g.add_edge(
                v.0,
                n,
                Edge {
                    src_output: v.1,
                    dst_input: i,
                },
            );
        }
        Ok(n)
    }

    /// The producer of input slot `i` of `n`, if connected.
    pub fn input(&self, n: NodeIndex, i: usize) -> Option<Value> {
        self.g
            .edges_directed(n, Direction::Incoming)
            .find(|e| e.weight().dst_input == i)
            .map(|e| (e.source(), e.weight().src_output))
    }

    /// The values feeding `n`, in slot order (slots without an edge are skipped).
    pub fn inputs(&self, n: NodeIndex) -> Vec<Value> {
        // A node has a handful of inputs: sorted by insertion on the stack, one allocation (the
        // result); more than `SMALL` take the general path.
        const SMALL: usize = 8;
        let mut keyed = [(0usize, 0usize, 0usize); SMALL];
        let mut k = 0;
        for e in self.g.edges_directed(n, Direction::Incoming) {
            if k == SMALL {
                return self.inputs_general(n);
            }
            let key = (
                e.weight().dst_input,
                e.source().index(),
                e.weight().src_output,
            );
            let mut i = k;
            while i > 0 && keyed[i - 1] > key {
                keyed[i] = keyed[i - 1];
                i -= 1;
            }
            keyed[i] = key;
            k += 1;
        }
        keyed[..k]
            .iter()
            .map(|&(_, src, o)| (NodeIndex::new(src), o))
            .collect()
    }

    /// [`Graph::inputs`] for any number of inputs.
    fn inputs_general(&self, n: NodeIndex) -> Vec<Value> {
        let mut es: Vec<(usize, Value)> = self
            .g
            .edges_directed(n, Direction::Incoming)
            .map(|e| (e.weight().dst_input, (e.source(), e.weight().src_output)))
            .collect();
        es.sort_by_key(|(slot, v)| (*slot, v.0.index(), v.1));
        es.into_iter().map(|(_, v)| v).collect()
    }

    /// Consumers of a value: `(node, input slot)`, sorted.
    pub fn consumers(&self, v: Value) -> Vec<(NodeIndex, usize)> {
        let mut cs: Vec<(NodeIndex, usize)> = self
            .g
            .edges_directed(v.0, Direction::Outgoing)
            .filter(|e| e.weight().src_output == v.1)
            .map(|e| (e.target(), e.weight().dst_input))
            .collect();
        cs.sort();
        cs
    }

    /// Distinct nodes consuming any output of `n`.
    pub fn successors(&self, n: NodeIndex) -> BTreeSet<NodeIndex> {
        self.g
            .edges_directed(n, Direction::Outgoing)
            .map(|e| e.target())
            .collect()
    }

    /// Distinct producers of `n`'s inputs.
    pub fn predecessors(&self, n: NodeIndex) -> BTreeSet<NodeIndex> {
        self.g
            .edges_directed(n, Direction::Incoming)
            .map(|e| e.source())
            .collect()
    }

    /// Topological order (Kahn, smallest index first, so it follows creation order where it
    /// can). Errors with a node on a cycle.
    pub fn topo_order(&self) -> Result<Vec<NodeIndex>, NodeIndex> {
        // Incoming edges not yet satisfied, by node index (a node is ready once every edge into
        // it comes from a node already ordered, i.e. once all its predecessors are).
        let mut indeg: Vec<usize> = vec![0; self.node_bound()];
        let mut count = 0;
        for n in self.g.node_indices() {
            indeg[n.index()] = self.g.edges_directed(n, Direction::Incoming).count();
            count += 1;
        }
        let mut ready: BinaryHeap<Reverse<NodeIndex>> = self
            .g
            .node_indices()
            .filter(|n| indeg[n.index()] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(count);
        while let Some(Reverse(n)) = ready.pop() {
            order.push(n);
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                let d = &mut indeg[e.target().index()];
                *d -= 1;
                if *d == 0 {
                    ready.push(Reverse(e.target()));
                }
            }
        }
        if order.len() == count {
            Ok(order)
        } else {
            Err(self
                .g
                .node_indices()
                .find(|n| indeg[n.index()] > 0)
                .unwrap_or(NodeIndex::new(0)))
        }
    }

    /// The value whose buffer `v` lives in: follows `Reshape` views and aliased (in-place) outputs
    /// back to the value that owns the buffer.
    pub fn buffer_root(&self, mut v: Value) -> Value {
        loop {
            let op = &self.node(v.0).op;
            let alias = op.aliased_outputs().into_iter().find(|(o, _)| *o == v.1);
            match alias.and_then(|(_, i)| self.input(v.0, i)) {
                Some(src) => v = src,
                None => return v,
            }
        }
    }

    /// Whether `n` launches a kernel (leaves and `Reshape` views do not).
    pub fn is_kernel(&self, n: NodeIndex) -> bool {
        let op = &self.node(n).op;
        !op.is_leaf() && !matches!(op, Op::Reshape)
    }

    /// One more than the largest node index: the length of a vector indexed by node.
    pub fn node_bound(&self) -> usize {
        self.g.node_bound()
    }

    /// Every node (in index order).
    pub fn nodes(&self) -> Vec<NodeIndex> {
        self.g.node_indices().collect()
    }

    /// The name of the parameter leaf `n`, if it is one.
    pub fn param_meta(&self, n: NodeIndex) -> Option<&ParamMeta> {
        self.params.iter().find(|(p, _)| *p == n).map(|(_, m)| m)
    }
}

// ---------------------------------------------------------------------------------------------
// Shape inference
// ---------------------------------------------------------------------------------------------

fn err<T>(msg: impl Into<String>) -> Result<T, ShapeError> {
    Err(ShapeError(msg.into()))
}

fn rank(t: &TensorType, r: usize, what: &str) -> Result<(), ShapeError> {
    if t.shape.len() != r {
        return err(format!("{what} must have rank {r}, got {t}"));
    }
    Ok(())
}

fn same(a: &TensorType, b: &TensorType, what: &str) -> Result<(), ShapeError> {
    if a.shape != b.shape {
        return err(format!("{what}: shapes differ ({a} vs {b})"));
    }
    Ok(())
}

fn need_hint<'a>(hint: Option<&'a TensorType>, op: &Op) -> Result<&'a TensorType, ShapeError> {
    hint.ok_or_else(|| {
        ShapeError(format!(
            "{} needs the expected output shape",
            op.kind_name()
        ))
    })
}

/// Output extents a convolution may have along one axis: with explicit top padding `pad`, the
/// bottom padding is `pad` or `pad + 1` (TF 'same' puts the odd pixel at the bottom).
fn conv_extent_ok(input: usize, k: usize, stride: usize, pad: usize, out: usize) -> bool {
    let lo = (input + 2 * pad).checked_sub(k).map(|r| r / stride + 1);
    let hi = (input + 2 * pad + 1).checked_sub(k).map(|r| r / stride + 1);
    out >= 1 && (lo == Some(out) || hi == Some(out))
}

/// The default (symmetric padding) output extent of a convolution.
fn conv_extent(input: usize, k: usize, stride: usize, pad: usize) -> Result<usize, ShapeError> {
    match (input + 2 * pad).checked_sub(k) {
        Some(r) => Ok(r / stride + 1),
        None => err(format!(
            "kernel {k} larger than padded input {}",
            input + 2 * pad
        )),
    }
}

fn pool_extent(input: usize, g: &PoolGeom) -> Result<usize, ShapeError> {
    if g.stride == 0 || g.size == 0 {
        return err("pool size and stride must be positive");
    }
    match input.checked_sub(g.size) {
        Some(r) => Ok(r / g.stride + 1),
        None => err(format!("pool window {} larger than input {input}", g.size)),
    }
}

fn pooled(x: &[usize], g: &PoolGeom) -> Result<Vec<usize>, ShapeError> {
    Ok(vec![
        x[0],
        pool_extent(x[1], g)?,
        pool_extent(x[2], g)?,
        x[3],
    ])
}

/// Output types of `op` applied to values of types `inputs`.
///
/// `hint` is the expected type of output 0. Most ops ignore it; it is required by the ops whose
/// output shape is not a function of their inputs (leaves, `Reshape`, the pooling/conv backward-data
/// ops, whose input extent is lost by the floor division, and `Conv2d`, whose bottom padding is
/// implicit) — for those, the hint is checked for consistency with the inputs and returned.
/// The verifier passes the stored output type, so it checks exactly what lowering/autodiff built.
pub fn infer_outputs(
    op: &Op,
    inputs: &[TensorType],
    hint: Option<&TensorType>,
) -> Result<Vec<TensorType>, ShapeError> {
    infer_outputs_with(op, &op.params(), inputs, hint)
}

/// [`infer_outputs`], given the op's signature parameters [`Op::params`] (for the verifier, which
/// builds them once per node for the arity checks too).
pub fn infer_outputs_with(
    op: &Op,
    params: &[ParamKind],
    inputs: &[TensorType],
    hint: Option<&TensorType>,
) -> Result<Vec<TensorType>, ShapeError> {
    // Arity and dtypes from the signature (the single source of truth for both).
    if !op.is_leaf() && !matches!(op, Op::Reshape) {
        let ins: Vec<_> = params
            .iter()
            .filter(|(_, role, _)| matches!(role, crate::op::Role::In | crate::op::Role::InOut))
            .collect();
        if ins.len() != inputs.len() {
            return err(format!(
                "expects {} inputs, got {}",
                ins.len(),
                inputs.len()
            ));
        }
        for ((name, _, dtype), t) in ins.iter().zip(inputs) {
            if *dtype != t.dtype {
                return err(format!("input `{name}` must be {dtype:?}, got {t}"));
            }
        }
    }
    let f = |s: Vec<usize>| TensorType::f32(s);
    let out = match op {
        Op::Input { .. } | Op::Param { .. } | Op::OptState { .. } => {
            if !inputs.is_empty() {
                return err("a leaf has no inputs");
            }
            vec![need_hint(hint, op)?.clone()]
        }
        Op::Conv2d { geom, bias } => {
            let (x, w) = (&inputs[0], &inputs[1]);
            rank(x, 4, "x")?;
            rank(w, 4, "w")?;
            if w.shape[0] != geom.kh || w.shape[1] != geom.kw || w.shape[2] != x.shape[3] {
                return err(format!(
                    "w {w} does not match kernel {}x{} over {} channels",
                    geom.kh, geom.kw, x.shape[3]
                ));
            }
            if *bias && inputs[2].shape != [w.shape[3]] {
                return err(format!("bias {} must be [{}]", inputs[2], w.shape[3]));
            }
            let y = match hint {
                Some(h) => {
                    rank(h, 4, "y")?;
                    let ok = h.shape[0] == x.shape[0]
                        && h.shape[3] == w.shape[3]
                        && conv_extent_ok(
                            x.shape[1],
                            geom.kh,
                            geom.stride,
                            geom.pad_top,
                            h.shape[1],
                        )
                        && conv_extent_ok(
                            x.shape[2],
                            geom.kw,
                            geom.stride,
                            geom.pad_left,
                            h.shape[2],
                        );
                    if !ok {
                        return err(format!(
                            "output {h} inconsistent with x {x}, w {w}, {geom:?}"
                        ));
                    }
                    h.shape.clone()
                }
                None => vec![
                    x.shape[0],
                    conv_extent(x.shape[1], geom.kh, geom.stride, geom.pad_top)?,
                    conv_extent(x.shape[2], geom.kw, geom.stride, geom.pad_left)?,
                    w.shape[3],
                ],
            };
            vec![f(y)]
        }
        Op::Dense { bias } => {
            let (x, w) = (&inputs[0], &inputs[1]);
            rank(x, 2, "x")?;
            rank(w, 2, "w")?;
            if x.shape[1] != w.shape[0] {
                return err(format!("x {x} and w {w}: inner dimensions differ"));
            }
            if *bias && inputs[2].shape != [w.shape[1]] {
                return err(format!("bias {} must be [{}]", inputs[2], w.shape[1]));
            }
            vec![f(vec![x.shape[0], w.shape[1]])]
        }
        Op::MaxPool { geom } => {
            rank(&inputs[0], 4, "x")?;
            let y = pooled(&inputs[0].shape, geom)?;
            vec![f(y.clone()), TensorType::new(y, DType::U8)]
        }
        Op::AvgPool { geom } => {
            rank(&inputs[0], 4, "x")?;
            vec![f(pooled(&inputs[0].shape, geom)?)]
        }
        Op::GlobalAvgPool => {
            rank(&inputs[0], 4, "x")?;
            vec![f(vec![inputs[0].shape[0], inputs[0].shape[3]])]
        }
        Op::Reshape => {
            if inputs.len() != 1 {
                return err(format!("expects 1 input, got {}", inputs.len()));
            }
            let h = need_hint(hint, op)?;
            if h.numel() != inputs[0].numel() || h.dtype != inputs[0].dtype {
                return err(format!("cannot reshape {} to {h}", inputs[0]));
            }
            vec![h.clone()]
        }
        Op::Unary(_) | Op::Dropout { .. } => vec![inputs[0].clone()],
        Op::Add => {
            same(&inputs[0], &inputs[1], "a, b")?;
            vec![inputs[0].clone()]
        }
        Op::MseLoss => {
            same(&inputs[0], &inputs[1], "pred, target")?;
            vec![f(vec![1])]
        }
        Op::CrossEntropyLoss | Op::CrossEntropyLossBwd => {
            let (l, y) = (&inputs[0], &inputs[1]);
            rank(l, 2, "logits")?;
            if y.shape != [l.shape[0]] {
                return err(format!(
                    "labels {y} must be [{}] for logits {l}",
                    l.shape[0]
                ));
            }
            if matches!(op, Op::CrossEntropyLoss) {
                vec![f(vec![1])]
            } else {
                vec![l.clone()]
            }
        }
        Op::Conv2dBwdData { geom } => {
            let (dy, w) = (&inputs[0], &inputs[1]);
            rank(dy, 4, "dy")?;
            rank(w, 4, "w")?;
            let h = need_hint(hint, op)?;
            rank(h, 4, "dx")?;
            let ok = w.shape[0] == geom.kh
                && w.shape[1] == geom.kw
                && dy.shape[3] == w.shape[3]
                && h.shape[0] == dy.shape[0]
                && h.shape[3] == w.shape[2]
                && conv_extent_ok(h.shape[1], geom.kh, geom.stride, geom.pad_top, dy.shape[1])
                && conv_extent_ok(h.shape[2], geom.kw, geom.stride, geom.pad_left, dy.shape[2]);
            if !ok {
                return err(format!("dx {h} inconsistent with dy {dy}, w {w}, {geom:?}"));
            }
            vec![f(h.shape.clone())]
        }
        Op::Conv2dBwdWeight { geom } => {
            let (x, dy) = (&inputs[0], &inputs[1]);
            rank(x, 4, "x")?;
            rank(dy, 4, "dy")?;
            let ok = x.shape[0] == dy.shape[0]
                && conv_extent_ok(x.shape[1], geom.kh, geom.stride, geom.pad_top, dy.shape[1])
                && conv_extent_ok(x.shape[2], geom.kw, geom.stride, geom.pad_left, dy.shape[2]);
            if !ok {
                return err(format!("x {x} and dy {dy} inconsistent with {geom:?}"));
            }
            vec![f(vec![geom.kh, geom.kw, x.shape[3], dy.shape[3]])]
        }
        Op::BiasGrad => match inputs[0].shape.last() {
            Some(c) => vec![f(vec![*c])],
            None => return err("dy must have rank >= 1"),
        },
        Op::DenseBwdData => {
            let (dy, w) = (&inputs[0], &inputs[1]);
            rank(dy, 2, "dy")?;
            rank(w, 2, "w")?;
            if dy.shape[1] != w.shape[1] {
                return err(format!("dy {dy} and w {w}: output dimensions differ"));
            }
            vec![f(vec![dy.shape[0], w.shape[0]])]
        }
        Op::DenseBwdWeight => {
            let (x, dy) = (&inputs[0], &inputs[1]);
            rank(x, 2, "x")?;
            rank(dy, 2, "dy")?;
            if x.shape[0] != dy.shape[0] {
                return err(format!("x {x} and dy {dy}: batch differs"));
            }
            vec![f(vec![x.shape[1], dy.shape[1]])]
        }
        Op::MaxPoolBwd { geom } | Op::AvgPoolBwd { geom } => {
            let dy = &inputs[0];
            rank(dy, 4, "dy")?;
            if let Op::MaxPoolBwd { .. } = op {
                same(dy, &inputs[1], "dy, argmax")?;
            }
            let h = need_hint(hint, op)?;
            rank(h, 4, "dx")?;
            if pooled(&h.shape, geom)? != dy.shape {
                return err(format!("dx {h} does not pool to dy {dy}"));
            }
            vec![f(h.shape.clone())]
        }
        Op::GlobalAvgPoolBwd => {
            let dy = &inputs[0];
            rank(dy, 2, "dy")?;
            let h = need_hint(hint, op)?;
            rank(h, 4, "dx")?;
            if h.shape[0] != dy.shape[0] || h.shape[3] != dy.shape[1] {
                return err(format!("dx {h} inconsistent with dy {dy}"));
            }
            vec![f(h.shape.clone())]
        }
        Op::UnaryBwd(_) => {
            same(&inputs[0], &inputs[1], "saved, dy")?;
            vec![inputs[0].clone()]
        }
        Op::DropoutBwd { .. } => vec![inputs[0].clone()],
        Op::MseLossBwd => {
            same(&inputs[0], &inputs[1], "pred, target")?;
            vec![inputs[0].clone()]
        }
        Op::UnaryInPlace(_) | Op::DropoutInPlace { .. } | Op::DropoutBwdInPlace { .. } => {
            vec![inputs[0].clone()]
        }
        Op::AddInPlace | Op::UnaryBwdInPlace(_) => {
            same(&inputs[0], &inputs[1], "inputs")?;
            vec![inputs[0].clone()]
        }
        Op::Conv2dBwdWeightUpdate { geom, chunk, .. } => {
            let (x, dy, w) = (&inputs[0], &inputs[1], &inputs[2]);
            rank(x, 4, "x")?;
            rank(dy, 4, "dy")?;
            let ok = x.shape[0] == dy.shape[0]
                && conv_extent_ok(x.shape[1], geom.kh, geom.stride, geom.pad_top, dy.shape[1])
                && conv_extent_ok(x.shape[2], geom.kw, geom.stride, geom.pad_left, dy.shape[2])
                && w.shape == [geom.kh, geom.kw, x.shape[3], dy.shape[3]];
            if !ok {
                return err(format!("x {x}, dy {dy}, w {w} inconsistent with {geom:?}"));
            }
            if *chunk == 0 || *chunk > dy.shape[3] {
                return err(format!("chunk {chunk} outside 1..={}", dy.shape[3]));
            }
            for (i, t) in inputs.iter().enumerate().skip(3) {
                same(w, t, &format!("w, state {i}"))?;
            }
            inputs[2..].to_vec()
        }
        Op::DenseBwdWeightUpdate { chunk, .. } => {
            let (x, dy, w) = (&inputs[0], &inputs[1], &inputs[2]);
            rank(x, 2, "x")?;
            rank(dy, 2, "dy")?;
            if x.shape[0] != dy.shape[0] || w.shape != [x.shape[1], dy.shape[1]] {
                return err(format!("x {x}, dy {dy}, w {w} inconsistent"));
            }
            if *chunk == 0 || *chunk > dy.shape[1] {
                return err(format!("chunk {chunk} outside 1..={}", dy.shape[1]));
            }
            for (i, t) in inputs.iter().enumerate().skip(3) {
                same(w, t, &format!("w, state {i}"))?;
            }
            inputs[2..].to_vec()
        }
        Op::BiasGradUpdate { .. } => {
            let (dy, b) = (&inputs[0], &inputs[1]);
            if dy.shape.last().map(|c| vec![*c]) != Some(b.shape.clone()) {
                return err(format!("dy {dy} and bias {b} inconsistent"));
            }
            for (i, t) in inputs.iter().enumerate().skip(2) {
                same(b, t, &format!("b, state {i}"))?;
            }
            inputs[1..].to_vec()
        }
        Op::Update { .. } => {
            for (i, t) in inputs.iter().enumerate().skip(1) {
                same(&inputs[0], t, &format!("w, input {i}"))?;
            }
            let n = op.num_outputs_of(params);
            op.aliased_outputs()
                .iter()
                .take(n)
                .map(|(_, i)| inputs[*i].clone())
                .collect()
        }
    };
    Ok(out)
}
