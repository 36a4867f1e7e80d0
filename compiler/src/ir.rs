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
use crate::op::{Op, ParamKind};
use crate::plan::Init;
pub use crate::tensor::{fmt_types, TensorType};

/// A value of the dataflow: output `.1` of node `.0`.
pub type Value = (NodeIndex, usize);

/// The values feeding one node ([`Graph::inputs`]): held inline up to 4 (almost every node), so
/// that asking for them allocates nothing.
pub type Inputs = smallvec::SmallVec<[Value; 4]>;

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
    /// Leaves saved with the weights, in model order: the parameters (`Op::Param`) and the
    /// running statistics (`Op::RunStat`, which get no gradient and no optimizer state).
    pub params: Vec<(NodeIndex, ParamMeta)>,
    /// Optimizer state leaves: (leaf, its full name e.g. `dense_1.weight.momentum`, the param leaf).
    pub opt_state: Vec<(NodeIndex, String, NodeIndex)>,
    /// Data parallel: how each optimizer-state leaf is split among the ranks (set by
    /// [`crate::data_parallel::shard_optimizer_state`]; empty with one rank).
    pub state_layouts: BTreeMap<NodeIndex, dmc_plan::shard::Layout>,
    /// Accumulated-gradient leaves (`accumulate: N`), one per parameter with a gradient.
    pub grad_bufs: Vec<NodeIndex>,
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
            state_layouts: BTreeMap::new(),
            grad_bufs: vec![],
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

    /// Reserves room for `nodes` more nodes and `edges` more edges (a pass that is about to add
    /// many: the graph's vectors are then not grown, copied and faulted in again by doubling).
    pub fn reserve(&mut self, nodes: usize, edges: usize) {
        self.g.reserve_nodes(nodes);
        self.g.reserve_edges(edges);
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
    pub fn inputs(&self, n: NodeIndex) -> Inputs {
        // A node has a handful of inputs: sorted by insertion on the stack, no allocation for up
        // to 4 (the result's inline capacity); more than `SMALL` take the general path.
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
    fn inputs_general(&self, n: NodeIndex) -> Inputs {
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
// Shape inference: the ops' one shape rule is in dmc-plan (`Op::infer_outputs`).
// ---------------------------------------------------------------------------------------------

/// Output types of `op` applied to values of types `inputs` ([`Op::infer_outputs`]; `hint` is
/// the expected type of output 0, see there).
pub fn infer_outputs(
    op: &Op,
    inputs: &[TensorType],
    hint: Option<&TensorType>,
) -> Result<Vec<TensorType>, ShapeError> {
    op.infer_outputs(inputs, hint)
}

/// [`infer_outputs`], given the op's signature parameters [`Op::params`] (for the verifier, which
/// builds them once per node for the arity checks too).
pub fn infer_outputs_with(
    op: &Op,
    params: &[ParamKind],
    inputs: &[TensorType],
    hint: Option<&TensorType>,
) -> Result<Vec<TensorType>, ShapeError> {
    op.infer_outputs_with(params, inputs, hint)
}
