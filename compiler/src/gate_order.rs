//! Which nodes can run only after which, once rematerialization has added scheduling gates: the
//! reachability question of `fuse_epilogues` ([`GateOrder::waits_for`]), answered by a search
//! that a topological numbering of the nodes bounds.
//!
//! A node waits for another when a path leads from that one to it along data edges, scheduling
//! gates (`Graph::not_before`: a recomputed node waits for the backward step before it) and
//! in-place hazards (an op that overwrites a value waits for that value's other readers). Every
//! such edge goes from a lower position to a higher one, so a search for a path to nodes at
//! positions `<= b` never needs to leave the nodes at positions `<= b`. Without the bound the
//! search from a forward node of a long network walks every node after it (and, past its limit,
//! refused the fusion): quadratic in the layers under `--vram-cap`.
//!
//! A rewrite keeps the numbering true by placing each node it adds between its predecessors and
//! successors ([`GateOrder::place`]); where there is no room the numbering is rebuilt the next
//! time it is read.

use petgraph::stable_graph::NodeIndex;

use crate::fxhash::FxHashMap;
use crate::ir::Graph;

/// How many nodes [`GateOrder::waits_for`] visits before it gives up (and answers yes).
const WAIT_SEARCH_LIMIT: usize = 20_000;

/// Spacing of the positions a rebuild gives, so that added nodes fit between two.
const GAP: u64 = 1 << 16;

/// A topological numbering of a graph's nodes along data edges, gates and in-place hazards, and
/// the gates by the node waited for.
#[derive(Default)]
pub(crate) struct GateOrder {
    /// Position by node index (`None`: not numbered, never used to bound a search).
    pos: Vec<Option<u64>>,
    /// Node -> the nodes gated on it (`Graph::not_before` inverted).
    gated_on: FxHashMap<NodeIndex, Vec<NodeIndex>>,
    /// Whether `pos` and `gated_on` describe the graph (else rebuilt when read).
    fresh: bool,
}

impl GateOrder {
    /// An order to be built when first read.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn rebuild(&mut self, g: &Graph) {
        self.gated_on.clear();
        for (m, gate) in &g.not_before {
            for x in gate {
                self.gated_on.entry(*x).or_default().push(*m);
            }
        }
        let bound = g.node_bound();
        let mut indeg = vec![0usize; bound];
        let nodes = g.nodes();
        for &m in &nodes {
            for s in self.succs(g, m) {
                indeg[s.index()] += 1;
            }
        }
        let mut ready: Vec<NodeIndex> = nodes
            .iter()
            .copied()
            .filter(|n| indeg[n.index()] == 0)
            .collect();
        self.pos = vec![None; bound];
        let mut next = 0u64;
        while let Some(m) = ready.pop() {
            self.pos[m.index()] = Some(next);
            next += GAP;
            for s in self.succs(g, m) {
                indeg[s.index()] -= 1;
                if indeg[s.index()] == 0 {
                    ready.push(s);
                }
            }
        }
        // (a cycle leaves its nodes unnumbered: searches through them are not bounded)
        self.fresh = true;
    }

    fn fresh(&mut self, g: &Graph) {
        if !self.fresh {
            self.rebuild(g);
        }
    }

    fn pos_of(&self, n: NodeIndex) -> Option<u64> {
        self.pos.get(n.index()).copied().flatten()
    }

    /// The nodes that wait directly for `m`: its consumers, the nodes gated on it and the in-place
    /// writers of what it reads.
    fn succs(&self, g: &Graph, m: NodeIndex) -> Vec<NodeIndex> {
        let mut out: Vec<NodeIndex> =
            g.g.neighbors_directed(m, petgraph::Direction::Outgoing)
                .collect();
        out.extend(self.gated_on.get(&m).into_iter().flatten().copied());
        for v in g.inputs(m) {
            for (c, slot) in g.consumers(v) {
                if c != m && writes_in_place(g, c, slot) {
                    out.push(c);
                }
            }
        }
        out
    }

    /// The nodes `m` waits for directly: its producers, its gate and, where it overwrites an
    /// input, that input's other readers.
    fn preds(&self, g: &Graph, m: NodeIndex) -> Vec<NodeIndex> {
        let ins = g.inputs(m);
        let mut out: Vec<NodeIndex> = ins.iter().map(|v| v.0).collect();
        out.extend(g.not_before.get(&m).into_iter().flatten().copied());
        for (_, slot) in g.node(m).op.aliased_outputs() {
            if let Some(v) = ins.get(slot) {
                out.extend(
                    g.consumers(*v)
                        .into_iter()
                        .map(|(c, _)| c)
                        .filter(|c| *c != m),
                );
            }
        }
        out
    }

    /// Whether one of the nodes `targets` can run only after one of `nodes` (see the module
    /// documentation). Without gates no such path exists (updates, the only in-place writers
    /// here, are read by nothing), so this is free then; a search that grows too large answers
    /// yes.
    pub(crate) fn waits_for(
        &mut self,
        g: &Graph,
        targets: &[NodeIndex],
        nodes: &[NodeIndex],
    ) -> bool {
        if g.not_before.is_empty() {
            return false;
        }
        self.fresh(g);
        let targets: Vec<NodeIndex> = targets
            .iter()
            .copied()
            .filter(|t| !nodes.contains(t))
            .collect();
        // (a target without a position leaves the search unbounded)
        let bound = self
            .extreme(&targets, u64::max)
            .map_or(u64::MAX, |b| b.unwrap_or(0));
        self.search(g, &targets, nodes, bound)
    }

    fn search(&self, g: &Graph, targets: &[NodeIndex], nodes: &[NodeIndex], bound: u64) -> bool {
        if targets.is_empty() {
            return false;
        }
        let mut stack: Vec<NodeIndex> = nodes.to_vec();
        let mut seen = crate::fxhash::FxHashMap::<NodeIndex, ()>::default();
        while let Some(m) = stack.pop() {
            if targets.contains(&m) {
                return true;
            }
            if !nodes.contains(&m) && self.pos_of(m).is_some_and(|p| p > bound) {
                continue; // every path on from here stays above the targets
            }
            if seen.insert(m, ()).is_some() {
                continue;
            }
            if seen.len() > WAIT_SEARCH_LIMIT {
                return true;
            }
            stack.extend(self.succs(g, m));
        }
        false
    }

    /// After a rewrite replaced the nodes `olds` (removed) by `new`, with `old_gates` the
    /// union of the gates `olds` had: the inverted gates follow, and `new` gets a position
    /// between its predecessors and successors (or the order is rebuilt when next read).
    pub(crate) fn replaced(
        &mut self,
        g: &Graph,
        olds: &[NodeIndex],
        old_gates: &[NodeIndex],
        new: NodeIndex,
    ) {
        if !self.fresh {
            return;
        }
        // the nodes gated on an old one are now gated on the new one
        let mut mine: Vec<NodeIndex> = vec![];
        for o in olds {
            mine.extend(self.gated_on.remove(o).into_iter().flatten());
        }
        mine.retain(|m| !olds.contains(m) && *m != new);
        mine.sort_unstable();
        mine.dedup();
        if !mine.is_empty() {
            self.gated_on.insert(new, mine);
        }
        // the new node waits for what the old ones waited for
        for x in old_gates {
            if let Some(list) = self.gated_on.get_mut(x) {
                list.retain(|m| !olds.contains(m));
                if g.not_before.get(&new).is_some_and(|s| s.contains(x)) && !list.contains(&new) {
                    list.push(new);
                }
            }
        }
        self.place(g, new);
    }

    /// After `n` was gated on `on` (`Graph::not_before[n]` gained it).
    pub(crate) fn gated(&mut self, g: &Graph, n: NodeIndex, on: NodeIndex) {
        if !self.fresh {
            return;
        }
        let list = self.gated_on.entry(on).or_default();
        if !list.contains(&n) {
            list.push(n);
        }
        // the new edge on -> n must go up
        if !(self.pos_of(on) < self.pos_of(n) && self.pos_of(on).is_some()) {
            self.place(g, n);
        }
    }

    /// Gives `n` a position between its predecessors' and its successors', or marks the order
    /// stale where there is none.
    fn place(&mut self, g: &Graph, n: NodeIndex) {
        let others = |v: Vec<NodeIndex>| v.into_iter().filter(|m| *m != n).collect::<Vec<_>>();
        let lo = self.extreme(&others(self.preds(g, n)), u64::max);
        let hi = self.extreme(&others(self.succs(g, n)), u64::min);
        let (Some(lo), Some(hi)) = (lo, hi) else {
            self.fresh = false; // a neighbour without a position
            return;
        };
        let at = match (lo, hi) {
            (None, None) => Some(0),
            (Some(l), None) => l.checked_add(GAP),
            (None, Some(h)) => h.checked_sub(1),
            (Some(l), Some(h)) if h > l + 1 => Some(l + (h - l) / 2),
            _ => None,
        };
        match at {
            Some(p) => {
                if self.pos.len() <= n.index() {
                    self.pos.resize(n.index() + 1, None);
                }
                self.pos[n.index()] = Some(p);
            }
            None => self.fresh = false,
        }
    }

    /// The largest (`pick = u64::max`) or smallest position of `nodes`: `None` when one has no
    /// position, `Some(None)` when there are no nodes.
    fn extreme(&self, nodes: &[NodeIndex], pick: fn(u64, u64) -> u64) -> Option<Option<u64>> {
        nodes.iter().try_fold(None, |b: Option<u64>, n| {
            self.pos_of(*n).map(|p| Some(b.map_or(p, |b| pick(b, p))))
        })
    }
}

/// Whether `c` writes its input `slot` in place.
fn writes_in_place(g: &Graph, c: NodeIndex, slot: usize) -> bool {
    g.node(c)
        .op
        .aliased_outputs()
        .iter()
        .any(|(_, i)| *i == slot)
}
