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

/// The alias forest of a graph (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct BufferRoots {
    /// `v -> the value v's buffer is taken from` (an ancestor, after path compression); values
    /// without an entry own their buffer.
    parent: FxHashMap<Value, Value>,
    /// Parent-link steps followed by all queries so far (for complexity tests).
    steps: u64,
}

impl BufferRoots {
    /// The alias links of `g` as it is now: every aliased output of a node (see
    /// [`crate::op::Op::aliased_outputs`]) whose input slot is connected.
    pub fn new(g: &Graph) -> Self {
        let mut parent = FxHashMap::default();
        for n in g.g.node_indices() {
            for (o, i) in g.node(n).op.aliased_outputs() {
                if let Some(src) = g.input(n, i) {
                    parent.insert((n, o), src);
                }
            }
        }
        BufferRoots { parent, steps: 0 }
    }

    /// The value whose buffer `v` lives in ([`Graph::buffer_root`] of the graph this was built
    /// from, plus the links added since).
    pub fn root(&mut self, v: Value) -> Value {
        let mut r = v;
        while let Some(&p) = self.parent.get(&r) {
            r = p;
            self.steps += 1;
        }
        // Path compression: everything on the way now points at the root.
        let mut w = v;
        while let Some(p) = self.parent.get_mut(&w) {
            let next = *p;
            *p = r;
            w = next;
        }
        r
    }

    /// Records that `v` (until now the owner of its buffer) becomes an alias of `src`, e.g. the
    /// output of an op just rewritten to write into its input `src`.
    pub fn link(&mut self, v: Value, src: Value) {
        debug_assert!(
            !self.parent.contains_key(&v),
            "{v:?} already aliases a value"
        );
        self.parent.insert(v, src);
    }

    /// Parent-link steps followed by [`BufferRoots::root`] so far: a measure of the work done,
    /// for tests that check the queries stay cheap on long alias chains.
    pub fn steps(&self) -> u64 {
        self.steps
    }
}
