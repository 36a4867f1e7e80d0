//! Buffer roots for a whole graph at once: the value whose buffer each value lives in, following
//! `Reshape` views and aliased (in-place) outputs back to the value that owns the buffer — the
//! same answer as [`Graph::buffer_root`], without walking the alias chain on every query.
//!
//! A long chain of in-place ops (`repeat 100000 { relu }` after `inplace_elementwise`) is one
//! alias chain as long as the network: walking it per query makes every per-value loop over the
//! graph quadratic. [`BufferRoots`] is a union-find over the alias links (each aliased output
//! points at the input it lives in) with path compression, so a query costs amortised
//! `O(log n)` at worst. It can follow a graph that gains alias links ([`BufferRoots::link`],
//! used by the in-place pass while it rewrites ops); a value only ever gains a link while it is
//! a root (an op's own output becoming an in-place output), which is what keeps the compressed
//! paths valid.

use crate::fxhash::FxHashMap;
use crate::ir::{Graph, Value};

/// A dense numbering of the values of a graph as it is now: node by node in index order, a
/// node's outputs in order. Per-value tables are then vectors indexed by [`ValueSlots::slot`]
/// instead of hash maps (a deep network has millions of values, and hashing each one on every
/// lookup was a large part of scheduling and emission).
#[derive(Debug, Clone, Default)]
pub struct ValueSlots {
    /// Slot of output 0 of node `n`: `first[n]`; node `n` has `first[n + 1] - first[n]` outputs
    /// (0 for a vacant index).
    first: Vec<usize>,
}

impl ValueSlots {
    pub fn new(g: &Graph) -> Self {
        let bound = g.node_bound();
        let mut first = vec![0usize; bound + 1];
        for n in g.g.node_indices() {
            first[n.index() + 1] = g.node(n).outputs.len();
        }
        for i in 0..bound {
            first[i + 1] += first[i];
        }
        ValueSlots { first }
    }

    /// The number of slots (values of the graph when this was built).
    pub fn len(&self) -> usize {
        self.first.last().copied().unwrap_or(0)
    }

    /// Whether the graph had no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot of `v`; `None` for a value the graph did not have when this was built.
    pub fn slot(&self, v: Value) -> Option<usize> {
        let n = v.0.index();
        let (a, b) = (*self.first.get(n)?, *self.first.get(n + 1)?);
        (v.1 < b - a).then_some(a + v.1)
    }
}

/// The alias forest of a graph (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct BufferRoots {
    slots: ValueSlots,
    /// By slot: the value that value's buffer is taken from (an ancestor, after path
    /// compression); the value itself when it owns its buffer.
    parent: Vec<Value>,
    /// Links of values that have no slot (not in the graph when this was built; none in
    /// practice, but a link must not be lost).
    extra: FxHashMap<Value, Value>,
    /// Parent-link steps followed by all queries so far (for complexity tests).
    steps: u64,
}

impl BufferRoots {
    /// The alias links of `g` as it is now: every aliased output of a node (see
    /// [`crate::op::Op::aliased_outputs`]) whose input slot is connected.
    pub fn new(g: &Graph) -> Self {
        let slots = ValueSlots::new(g);
        let mut parent = Vec::with_capacity(slots.len());
        for n in g.g.node_indices() {
            let start = parent.len();
            parent.extend((0..g.node(n).outputs.len()).map(|o| (n, o)));
            for (o, i) in g.node(n).op.aliased_outputs() {
                if let (Some(src), Some(p)) = (g.input(n, i), parent.get_mut(start + o)) {
                    *p = src;
                }
            }
        }
        BufferRoots {
            slots,
            parent,
            extra: FxHashMap::default(),
            steps: 0,
        }
    }

    /// The parent link of `v`, if it has one.
    fn parent_of(&self, v: Value) -> Option<Value> {
        match self.slots.slot(v) {
            Some(s) => Some(self.parent[s]).filter(|p| *p != v),
            None => self.extra.get(&v).copied(),
        }
    }

    /// The value whose buffer `v` lives in ([`Graph::buffer_root`] of the graph this was built
    /// from, plus the links added since).
    pub fn root(&mut self, v: Value) -> Value {
        let mut r = v;
        while let Some(p) = self.parent_of(r) {
            r = p;
            self.steps += 1;
        }
        // Path compression: everything on the way now points at the root.
        let mut w = v;
        while let Some(next) = self.parent_of(w) {
            match self.slots.slot(w) {
                Some(s) => self.parent[s] = r,
                None => {
                    self.extra.insert(w, r);
                }
            }
            w = next;
        }
        r
    }

    /// Records that `v` (until now the owner of its buffer) becomes an alias of `src`, e.g. the
    /// output of an op just rewritten to write into its input `src`.
    pub fn link(&mut self, v: Value, src: Value) {
        debug_assert!(self.parent_of(v).is_none(), "{v:?} already aliases a value");
        match self.slots.slot(v) {
            Some(s) => self.parent[s] = src,
            None => {
                self.extra.insert(v, src);
            }
        }
    }

    /// Parent-link steps followed by [`BufferRoots::root`] so far: a measure of the work done,
    /// for tests that check the queries stay cheap on long alias chains.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The numbering of the values this was built with.
    pub fn slots(&self) -> &ValueSlots {
        &self.slots
    }
}

/// A map from the values of a graph to `T`: a vector by [`ValueSlots`] slot (values the graph
/// did not have when it was built go to a small hash map).
#[derive(Debug, Clone)]
pub struct ValueMap<T> {
    slots: ValueSlots,
    vals: Vec<Option<T>>,
    extra: FxHashMap<Value, T>,
}

impl<T: Clone> ValueMap<T> {
    /// An empty map over the values of `g` as it is now.
    pub fn new(g: &Graph) -> Self {
        let slots = ValueSlots::new(g);
        let vals = vec![None; slots.len()];
        ValueMap {
            slots,
            vals,
            extra: FxHashMap::default(),
        }
    }

    pub fn get(&self, v: Value) -> Option<&T> {
        match self.slots.slot(v) {
            Some(s) => self.vals[s].as_ref(),
            None => self.extra.get(&v),
        }
    }

    pub fn get_mut(&mut self, v: Value) -> Option<&mut T> {
        match self.slots.slot(v) {
            Some(s) => self.vals[s].as_mut(),
            None => self.extra.get_mut(&v),
        }
    }

    pub fn insert(&mut self, v: Value, t: T) {
        match self.slots.slot(v) {
            Some(s) => self.vals[s] = Some(t),
            None => {
                self.extra.insert(v, t);
            }
        }
    }

    /// The entry of `v`, inserted as `default()` first if absent.
    pub fn get_or_insert_with(&mut self, v: Value, default: impl FnOnce() -> T) -> &mut T {
        match self.slots.slot(v) {
            Some(s) => self.vals[s].get_or_insert_with(default),
            None => self.extra.entry(v).or_insert_with(default),
        }
    }
}
