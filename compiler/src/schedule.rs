//! Scheduling: a topological order of the kernel nodes (leaves and `Reshape` views excluded).
//!
//! (a) In-place hazards are explicit constraints ([`hazard_order`]): when a node overwrites an
//! input in place (an `InOut` argument: the optimizer updates, the fused weight-gradient +
//! update ops, in-place elementwise ops), every OTHER reader of that value
//! (through views too) must run before it — e.g. a dense layer's `dx = dy w^T` before `w` is
//! updated. (b) Memory: a greedy list scheduler; among the ready kernels it runs the one that frees
//! the most bytes net of what it allocates when that is non-negative (an update right after its
//! gradient is complete, so gradients die early), and otherwise the oldest node (forward in
//! program order, backward in creation order, i.e. reverse program order). (c) Rematerialization
//! hints ([`Graph::not_before`]) are extra constraints: a recomputed node waits for the backward
//! step the strategy puts before it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use petgraph::stable_graph::NodeIndex;

use crate::error::CompileError;
use crate::ir::{Graph, Value};
use crate::op::Op;

/// Values that share a buffer with `v` without an in-place write in between: `v` and every
/// `Reshape` view of it, up and down.
pub fn view_closure(g: &Graph, v: Value) -> BTreeSet<Value> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![v];
    while let Some(w) = stack.pop() {
        if !seen.insert(w) {
            continue;
        }
        if matches!(g.node(w.0).op, Op::Reshape) {
            if let Some(src) = g.input(w.0, 0) {
                stack.push(src);
            }
        }
        for (c, _) in g.consumers(w) {
            if matches!(g.node(c).op, Op::Reshape) {
                stack.push((c, 0));
            }
        }
    }
    seen
}

/// The in-place hazard constraints `(reader, writer)`: `reader` must run before `writer`, which
/// overwrites a value `reader` reads. Errors if these constraints and the data dependencies
/// together form a cycle (no valid order exists).
pub fn hazard_order(g: &Graph) -> Result<Vec<(NodeIndex, NodeIndex)>, String> {
    let mut cons = vec![];
    for u in g.g.node_indices() {
        let op = &g.node(u).op;
        if matches!(op, Op::Reshape) {
            continue;
        }
        for (_, i) in op.aliased_outputs() {
            let Some(v) = g.input(u, i) else { continue };
            for w in view_closure(g, v) {
                for (r, _) in g.consumers(w) {
                    if r != u && !matches!(g.node(r).op, Op::Reshape) {
                        cons.push((r, u));
                    }
                }
            }
        }
    }
    cons.sort();
    cons.dedup();
    // Acyclicity of data + hazard edges (Kahn).
    let mut preds: BTreeMap<NodeIndex, BTreeSet<NodeIndex>> = BTreeMap::new();
    for n in g.g.node_indices() {
        preds.insert(n, g.predecessors(n));
    }
    for (r, u) in &cons {
        preds.entry(*u).or_default().insert(*r);
    }
    let mut succs: BTreeMap<NodeIndex, Vec<NodeIndex>> = BTreeMap::new();
    for (n, ps) in &preds {
        for p in ps {
            succs.entry(*p).or_default().push(*n);
        }
    }
    let mut indeg: BTreeMap<NodeIndex, usize> = preds.iter().map(|(n, p)| (*n, p.len())).collect();
    let mut ready: Vec<NodeIndex> = indeg
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(n, _)| *n)
        .collect();
    let mut done = 0;
    while let Some(n) = ready.pop() {
        done += 1;
        for s in succs.get(&n).into_iter().flatten() {
            if let Some(d) = indeg.get_mut(s) {
                *d -= 1;
                if *d == 0 {
                    ready.push(*s);
                }
            }
        }
    }
    if done != indeg.len() {
        let stuck: Vec<String> = indeg
            .iter()
            .filter(|(_, d)| **d > 0)
            .take(4)
            .map(|(n, _)| format!("`{}`", g.node(*n).name))
            .collect();
        return Err(format!(
            "in-place hazard: no order reads every value before it is overwritten (involving {})",
            stuck.join(", ")
        ));
    }
    Ok(cons)
}

/// The kernel that produces the buffer contents of `v` (through views), if any.
fn kernel_producer(g: &Graph, mut v: Value) -> Option<NodeIndex> {
    loop {
        if matches!(g.node(v.0).op, Op::Reshape) {
            v = g.input(v.0, 0)?;
        } else if g.node(v.0).op.is_leaf() {
            return None;
        } else {
            return Some(v.0);
        }
    }
}

/// Orders the kernel nodes of `g` (see the module doc).
pub fn schedule(g: &Graph) -> Result<Vec<NodeIndex>, CompileError> {
    let hazards = hazard_order(g).map_err(CompileError::Schedule)?;
    let kernels: Vec<NodeIndex> = g.g.node_indices().filter(|n| g.is_kernel(*n)).collect();
    let mut preds: BTreeMap<NodeIndex, BTreeSet<NodeIndex>> =
        kernels.iter().map(|n| (*n, BTreeSet::new())).collect();
    for &n in &kernels {
        for v in g.inputs(n) {
            if let Some(p) = kernel_producer(g, v) {
                preds.entry(n).or_default().insert(p);
            }
        }
    }
    for (r, u) in hazards {
        if g.is_kernel(r) && g.is_kernel(u) {
            preds.entry(u).or_default().insert(r);
        }
    }
    // Rematerialization hints: a recomputation waits for the backward step before it.
    for (n, after) in &g.not_before {
        if !g.g.contains_node(*n) || !g.is_kernel(*n) {
            continue;
        }
        for a in after {
            if g.g.contains_node(*a) && g.is_kernel(*a) {
                preds.entry(*n).or_default().insert(*a);
            }
        }
    }
    let mut succs: BTreeMap<NodeIndex, Vec<NodeIndex>> = BTreeMap::new();
    for (n, ps) in &preds {
        for p in ps {
            succs.entry(*p).or_default().push(*n);
        }
    }

    // Memory bookkeeping per buffer (root value): bytes, remaining distinct kernel readers.
    let pinned: BTreeSet<Value> = g
        .loss
        .iter()
        .chain(std::iter::once(&g.output))
        .map(|v| g.buffer_root(*v))
        .collect();
    let mut reads: HashMap<NodeIndex, BTreeSet<Value>> = HashMap::new();
    let mut readers: HashMap<Value, usize> = HashMap::new();
    for &n in &kernels {
        let rs: BTreeSet<Value> = g.inputs(n).into_iter().map(|v| g.buffer_root(v)).collect();
        for r in &rs {
            *readers.entry(*r).or_default() += 1;
        }
        reads.insert(n, rs);
    }
    let freeable = |r: &Value| g.is_kernel(r.0) && !pinned.contains(r);
    let alloc = |n: NodeIndex| -> i64 {
        let aliased: Vec<usize> = g
            .node(n)
            .op
            .aliased_outputs()
            .iter()
            .map(|(o, _)| *o)
            .collect();
        g.node(n)
            .outputs
            .iter()
            .enumerate()
            .filter(|(o, _)| !aliased.contains(o))
            .map(|(_, t)| t.bytes() as i64)
            .sum()
    };

    let mut indeg: BTreeMap<NodeIndex, usize> = preds.iter().map(|(n, p)| (*n, p.len())).collect();
    let mut ready: BTreeSet<NodeIndex> = indeg
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(n, _)| *n)
        .collect();
    let mut order = Vec::with_capacity(kernels.len());
    while !ready.is_empty() {
        let mut best: Option<(i64, NodeIndex)> = None;
        for &n in &ready {
            let freed: i64 = reads[&n]
                .iter()
                .filter(|r| freeable(r) && readers.get(r) == Some(&1))
                .map(|r| g.ty(*r).bytes() as i64)
                .sum();
            let net = freed - alloc(n);
            if freed > 0 && net >= 0 && !matches!(best, Some((b, _)) if net <= b) {
                best = Some((net, n));
            }
        }
        let n = match best {
            Some((_, n)) => n,
            None => *ready
                .iter()
                .next()
                .ok_or_else(|| CompileError::Internal("empty ready set".into()))?,
        };
        ready.remove(&n);
        order.push(n);
        for r in &reads[&n] {
            if let Some(c) = readers.get_mut(r) {
                *c -= 1;
            }
        }
        for s in succs.get(&n).into_iter().flatten() {
            if let Some(d) = indeg.get_mut(s) {
                *d -= 1;
                if *d == 0 {
                    ready.insert(*s);
                }
            }
        }
    }
    if order.len() != kernels.len() {
        return Err(CompileError::Schedule(
            "the kernel graph has a cycle".into(),
        ));
    }
    Ok(order)
}
