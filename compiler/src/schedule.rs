//! Scheduling: a topological order of the kernel nodes (leaves and `Reshape` views excluded).
//!
//! (a) In-place hazards are explicit constraints ([`hazard_order`]): when a node overwrites an
//! input in place (an `InOut` argument: the optimizer updates, the fused weight-gradient +
//! update ops, in-place elementwise ops), every OTHER reader of that value
//! (through views too) must run before it — e.g. a dense layer's `dx = dy w^T` before `w` is
//! updated. (b) Memory: a greedy list scheduler; among the ready kernels it runs the one that frees
//! the most bytes net of what it allocates when that is non-negative (an update right after its
//! gradient is complete, so gradients die early), else the oldest one that allocates nothing (it
//! costs no memory and may let a later reader free a value: `clip_norm`'s norm-pass link reads a
//! gradient its update frees), and otherwise the oldest node (forward in program order, backward
//! in creation order, i.e. reverse program order). (c) Rematerialization
//! hints ([`Graph::not_before`]) are extra constraints: a recomputed node waits for the backward
//! step the strategy puts before it.

use std::collections::BTreeSet;

use petgraph::stable_graph::NodeIndex;
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use petgraph::Direction;

use crate::alias::{BufferRoots, ValueMap};
use crate::error::CompileError;
use crate::ir::{Graph, Value};
use crate::op::Op;

/// Values that share a buffer with `v` without an in-place write in between: `v` and every
/// `Reshape` view of it, up and down (sorted, without duplicates).
pub fn view_closure(g: &Graph, v: Value) -> Vec<Value> {
    let mut seen: Vec<Value> = Vec::new();
    let mut stack = vec![v];
    while let Some(w) = stack.pop() {
        if seen.contains(&w) {
            continue;
        }
        seen.push(w);
        if matches!(g.node(w.0).op, Op::Reshape) {
            if let Some(src) = g.input(w.0, 0) {
                stack.push(src);
            }
        }
        for e in g.g.edges_directed(w.0, Direction::Outgoing) {
            if e.weight().src_output == w.1 && matches!(g.node(e.target()).op, Op::Reshape) {
                stack.push((e.target(), 0));
            }
        }
    }
    seen.sort();
    seen
}

/// The in-place hazard constraints `(reader, writer)`: `reader` must run before `writer`, which
/// overwrites a value `reader` reads. Errors if these constraints and the data dependencies
/// together form a cycle (no valid order exists).
pub fn hazard_order(g: &Graph) -> Result<Vec<(NodeIndex, NodeIndex)>, String> {
    let cons = hazard_constraints(g);
    check_acyclic(g, &cons)?;
    Ok(cons)
}

/// The in-place hazard constraints of [`hazard_order`], sorted, without checking that an order
/// exists (the scheduler finds out by itself, and only then asks [`hazard_order`] why).
fn hazard_constraints(g: &Graph) -> Vec<(NodeIndex, NodeIndex)> {
    let mut cons = vec![];
    for u in g.g.node_indices() {
        let op = &g.node(u).op;
        if matches!(op, Op::Reshape) {
            continue;
        }
        for (_, i) in op.aliased_outputs() {
            let Some(v) = g.input(u, i) else { continue };
            for w in view_closure(g, v) {
                for e in g.g.edges_directed(w.0, Direction::Outgoing) {
                    let r = e.target();
                    if e.weight().src_output == w.1
                        && r != u
                        && !matches!(g.node(r).op, Op::Reshape)
                    {
                        cons.push((r, u));
                    }
                }
            }
        }
    }
    cons.sort();
    cons.dedup();
    cons
}

/// Errors if the data edges of `g` and the constraints `cons` together form a cycle.
fn check_acyclic(g: &Graph, cons: &[(NodeIndex, NodeIndex)]) -> Result<(), String> {
    // Acyclicity of data + hazard edges (Kahn, over node indices; the edges as one sorted
    // (source, target) list, a predecessor counting once however many edges it has to a node).
    // Kahn over the data and hazard edges in one adjacency array built by counting (a node's
    // in-degree counts every edge into it, parallel ones too; each edge is taken once).
    let bound = g.node_bound();
    let all_edges = || {
        g.g.edge_references()
            .map(|e| (e.source().index(), e.target().index()))
            .chain(cons.iter().map(|(r, u)| (r.index(), u.index())))
    };
    // Successors of node n: succ[first[n]..first[n + 1]].
    let mut first = vec![0usize; bound + 1];
    let mut indeg = vec![0usize; bound];
    for (a, b) in all_edges() {
        first[a + 1] += 1;
        indeg[b] += 1;
    }
    for n in 0..bound {
        first[n + 1] += first[n];
    }
    let mut fill = first.clone();
    let mut succ = vec![0usize; first[bound]];
    for (a, b) in all_edges() {
        succ[fill[a]] = b;
        fill[a] += 1;
    }
    let mut ready: Vec<usize> =
        g.g.node_indices()
            .map(|n| n.index())
            .filter(|&n| indeg[n] == 0)
            .collect();
    let mut done = 0;
    while let Some(n) = ready.pop() {
        done += 1;
        for &s in &succ[first[n]..first[n + 1]] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(s);
            }
        }
    }
    if done != g.g.node_count() {
        let stuck: Vec<String> =
            g.g.node_indices()
                .filter(|n| indeg[n.index()] > 0)
                .take(4)
                .map(|n| format!("`{}`", g.node(n).name))
                .collect();
        return Err(format!(
            "in-place hazard: no order reads every value before it is overwritten (involving {})",
            stuck.join(", ")
        ));
    }
    Ok(())
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
    // Not `hazard_order`: its acyclicity check is a second pass over the graph (the verifier
    // already made it); an order that cannot be completed below is diagnosed by it instead.
    let hazards = hazard_constraints(g);
    let kernels: Vec<NodeIndex> = g.g.node_indices().filter(|n| g.is_kernel(*n)).collect();
    // Everything per node is indexed by node index (only kernels have entries); lists per node
    // are flat arrays ([`Lists`]: a million small vectors would cost more to allocate and free
    // than the scheduling itself).
    let bound = g.node_bound();
    let mut roots = BufferRoots::new(g);
    // (kernel, a kernel it must run after): data, hazards, rematerialization hints.
    let mut pred_pairs: Vec<(usize, usize)> = Vec::with_capacity(kernels.len() * 3);
    // The distinct buffers (roots) each kernel reads, sorted; and per buffer, how many kernels
    // still have to read it.
    let mut reads_first = vec![0usize; bound + 1];
    let mut reads_items: Vec<Value> = Vec::with_capacity(kernels.len() * 3);
    let mut readers: ValueMap<usize> = ValueMap::new(g);
    // `kernels` is in index order: the next one to reach.
    let mut ki = 0;
    for i in 0..bound {
        if kernels.get(ki).is_some_and(|n| n.index() == i) {
            let n = kernels[ki];
            ki += 1;
            let start = reads_items.len();
            for v in g.inputs(n) {
                if let Some(p) = kernel_producer(g, v) {
                    pred_pairs.push((i, p.index()));
                }
                reads_items.push(roots.root(v));
            }
            reads_items[start..].sort_unstable();
            let mut k = start;
            for j in start..reads_items.len() {
                if j == start || reads_items[j] != reads_items[k - 1] {
                    reads_items[k] = reads_items[j];
                    k += 1;
                }
            }
            reads_items.truncate(k);
            for r in &reads_items[start..] {
                *readers.get_or_insert_with(*r, || 0) += 1;
            }
        }
        reads_first[i + 1] = reads_items.len();
    }
    let reads = Lists {
        first: reads_first,
        items: reads_items,
    };
    for (r, u) in hazards {
        if g.is_kernel(r) && g.is_kernel(u) {
            pred_pairs.push((u.index(), r.index()));
        }
    }
    // Rematerialization hints: a recomputation waits for the backward step before it.
    for (n, after) in &g.not_before {
        if !g.g.contains_node(*n) || !g.is_kernel(*n) {
            continue;
        }
        for a in after {
            if g.g.contains_node(*a) && g.is_kernel(*a) {
                pred_pairs.push((n.index(), a.index()));
            }
        }
    }
    pred_pairs.sort_unstable();
    pred_pairs.dedup();
    let mut indeg: Vec<usize> = vec![0; bound];
    for &(n, _) in &pred_pairs {
        indeg[n] += 1;
    }
    let succs = Lists::from_pairs(bound, pred_pairs.iter().map(|&(n, p)| (p, n)));
    drop(pred_pairs);

    // Memory bookkeeping per buffer (root value): bytes, remaining distinct kernel readers.
    let pinned: BTreeSet<Value> = g
        .loss
        .iter()
        .chain(std::iter::once(&g.output))
        .map(|v| roots.root(*v))
        .collect();
    let freeable = |r: &Value| g.is_kernel(r.0) && !pinned.contains(r);
    // Bytes each kernel allocates: its outputs that are not written into an input.
    let mut alloc: Vec<i64> = vec![0; bound];
    for &n in &kernels {
        let aliased: Vec<usize> = g
            .node(n)
            .op
            .aliased_outputs()
            .iter()
            .map(|(o, _)| *o)
            .collect();
        alloc[n.index()] = g
            .node(n)
            .outputs
            .iter()
            .enumerate()
            .filter(|(o, _)| !aliased.contains(o))
            .map(|(_, t)| t.bytes() as i64)
            .sum();
    }

    let mut ready: BTreeSet<usize> = kernels
        .iter()
        .map(|n| n.index())
        .filter(|n| indeg[*n] == 0)
        .collect();
    let mut order = Vec::with_capacity(kernels.len());
    while !ready.is_empty() {
        let mut best: Option<(i64, usize)> = None;
        // the oldest ready kernel that allocates nothing
        let mut free_run: Option<usize> = None;
        for &n in &ready {
            if free_run.is_none() && alloc[n] == 0 {
                free_run = Some(n);
            }
            let freed: i64 = reads
                .get(n)
                .iter()
                .filter(|r| freeable(r) && readers.get(**r) == Some(&1))
                .map(|r| g.ty(*r).bytes() as i64)
                .sum();
            let net = freed - alloc[n];
            if freed > 0 && net >= 0 && !matches!(best, Some((b, _)) if net <= b) {
                best = Some((net, n));
            }
        }
        let n = match best.map(|(_, n)| n).or(free_run) {
            Some(n) => n,
            None => *ready
                .iter()
                .next()
                .ok_or_else(|| CompileError::Internal("empty ready set".into()))?,
        };
        ready.remove(&n);
        order.push(NodeIndex::new(n));
        for r in reads.get(n) {
            if let Some(c) = readers.get_mut(*r) {
                *c -= 1;
            }
        }
        for &s in succs.get(n) {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.insert(s);
            }
        }
    }
    if order.len() != kernels.len() {
        hazard_order(g).map_err(CompileError::Schedule)?;
        return Err(CompileError::Schedule(
            "the kernel graph has a cycle".into(),
        ));
    }
    Ok(order)
}

/// Lists per node index in one array: the list of node `n` is `items[first[n]..first[n + 1]]`.
struct Lists<T> {
    first: Vec<usize>,
    items: Vec<T>,
}

impl<T: Copy + Default> Lists<T> {
    /// The lists of `bound` nodes holding each `(node, item)` pair's item, in pair order.
    fn from_pairs(bound: usize, pairs: impl Iterator<Item = (usize, T)> + Clone) -> Self {
        let mut first = vec![0usize; bound + 1];
        for (n, _) in pairs.clone() {
            first[n + 1] += 1;
        }
        for n in 0..bound {
            first[n + 1] += first[n];
        }
        let mut fill = first.clone();
        let mut items = vec![T::default(); first[bound]];
        for (n, t) in pairs {
            items[fill[n]] = t;
            fill[n] += 1;
        }
        Lists { first, items }
    }
}

impl<T> Lists<T> {
    fn get(&self, n: usize) -> &[T] {
        match (self.first.get(n), self.first.get(n + 1)) {
            (Some(&a), Some(&b)) => &self.items[a..b],
            _ => &[],
        }
    }
}
