//! A readable listing of the IR (`dmc compile --dump-ir`).

use std::fmt::Write as _;

use crate::ir::{self, Graph};

/// A human-readable listing of the graph in topological order, one node per line:
/// `%3 = conv2d(%0:0, %1:0, %2:0) -> f32[1,16,16,256]  "conv2d_1" [Forward]`.
pub fn graph_dump(g: &Graph) -> String {
    let order = g.topo_order().unwrap_or_else(|_| g.nodes());
    let mut s = String::new();
    for n in order {
        let node = g.node(n);
        let ins: Vec<String> = g
            .inputs(n)
            .iter()
            .map(|(p, o)| format!("%{}:{o}", p.index()))
            .collect();
        let _ = writeln!(
            s,
            "%{} = {}({}) -> {}  \"{}\" [{:?}]",
            n.index(),
            node.op.kind_name(),
            ins.join(", "),
            ir::fmt_types(&node.outputs),
            node.name,
            node.phase
        );
    }
    if let Some(l) = g.loss {
        let _ = writeln!(s, "loss = %{}:{}", l.0.index(), l.1);
    }
    let _ = writeln!(s, "output = %{}:{}", g.output.0.index(), g.output.1);
    s
}
