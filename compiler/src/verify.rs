//! The IR verifier, run before and after every pass in debug/test builds: structure (input slots,
//! edges, arity), types (recomputed [`crate::ir::infer_outputs`] equals the stored outputs, dtypes match the
//! signature), acyclicity (including the in-place hazard constraints) and the graph's
//! distinguished values. Its errors name the pass, the node, the op and the shapes.

use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

pub use crate::error::VerifyError;
use crate::ir::{fmt_types, infer_outputs_with, Graph, TensorType};

fn at(g: &Graph, pass: &str, n: NodeIndex, msg: String) -> VerifyError {
    let node = g.node(n);
    let inputs = g
        .inputs(n)
        .into_iter()
        .filter(|v| g.g.contains_node(v.0) && v.1 < g.node(v.0).outputs.len())
        .map(|v| g.ty(v).clone())
        .collect();
    VerifyError {
        pass: pass.to_string(),
        node: Some((n.index(), node.name.clone())),
        op: node.op.kind_name().to_string(),
        inputs,
        outputs: node.outputs.clone(),
        msg,
    }
}

fn global(pass: &str, msg: String) -> VerifyError {
    VerifyError {
        pass: pass.to_string(),
        node: None,
        op: String::new(),
        inputs: vec![],
        outputs: vec![],
        msg,
    }
}

/// Checks the whole graph; `pass` names the pass that produced it.
#[allow(clippy::result_large_err)] // a cold path; the rich error is the point
pub fn verify(g: &Graph, pass: &str) -> Result<(), VerifyError> {
    // Per-node scratch, reused: edges into each input slot, the value of one of them, and the
    // input types (`clone_from` keeps their shape allocations).
    let mut slots: Vec<usize> = vec![];
    let mut srcs: Vec<Option<(NodeIndex, usize)>> = vec![];
    let mut ins: Vec<TensorType> = vec![];
    for n in g.g.node_indices() {
        let node = g.node(n);
        let op = &node.op;
        let params = op.params();
        if node.outputs.len() != op.num_outputs_of(&params) {
            return Err(at(
                g,
                pass,
                n,
                format!(
                    "has {} outputs, the op has {}",
                    node.outputs.len(),
                    op.num_outputs_of(&params)
                ),
            ));
        }
        let want = if op.is_leaf() {
            0
        } else {
            op.num_inputs_of(&params)
        };
        slots.clear();
        slots.resize(want, 0);
        srcs.clear();
        srcs.resize(want, None);
        for e in g.g.edges_directed(n, Direction::Incoming) {
            let w = e.weight();
            let src = g.node(e.source());
            if w.dst_input >= want {
                let msg = if op.is_leaf() {
                    format!("a leaf has an incoming edge from `{}`", src.name)
                } else {
                    format!(
                        "edge from `{}` into input slot {} but the op has {want} inputs",
                        src.name, w.dst_input
                    )
                };
                return Err(at(g, pass, n, msg));
            }
            if w.src_output >= src.outputs.len() {
                return Err(at(
                    g,
                    pass,
                    n,
                    format!(
                        "input {} reads output {} of `{}`, which has {}",
                        w.dst_input,
                        w.src_output,
                        src.name,
                        src.outputs.len()
                    ),
                ));
            }
            slots[w.dst_input] += 1;
            srcs[w.dst_input] = Some((e.source(), w.src_output));
        }
        for (i, c) in slots.iter().enumerate() {
            if *c != 1 {
                return Err(at(
                    g,
                    pass,
                    n,
                    format!("input slot {i} has {c} incoming edges (expected exactly 1)"),
                ));
            }
        }
        if op.is_leaf() {
            continue;
        }
        // Every slot has exactly one edge (checked above): the inputs in slot order.
        ins.truncate(want);
        for (i, v) in srcs.iter().flatten().enumerate() {
            match ins.get_mut(i) {
                Some(t) => {
                    let src = g.ty(*v);
                    t.shape.clone_from(&src.shape);
                    t.dtype = src.dtype;
                }
                None => ins.push(g.ty(*v).clone()),
            }
        }
        match infer_outputs_with(op, &params, &ins, node.outputs.first()) {
            Err(e) => return Err(at(g, pass, n, format!("shape inference failed: {e}"))),
            Ok(outs) if outs != node.outputs => {
                return Err(at(
                    g,
                    pass,
                    n,
                    format!(
                        "stored outputs differ from the inferred [{}]",
                        fmt_types(&outs)
                    ),
                ))
            }
            Ok(_) => {}
        }
    }
    if let Err(n) = g.topo_order() {
        return Err(at(
            g,
            pass,
            n,
            "the graph has a cycle through this node".into(),
        ));
    }
    if let Err(e) = crate::schedule::hazard_order(g) {
        return Err(global(pass, e));
    }
    let value_ok =
        |v: (NodeIndex, usize)| g.g.contains_node(v.0) && v.1 < g.node(v.0).outputs.len();
    if !value_ok(g.output) {
        return Err(global(
            pass,
            format!("the output value {:?} does not exist", g.output),
        ));
    }
    if let Some(l) = g.loss {
        if !value_ok(l) {
            return Err(global(pass, format!("the loss value {l:?} does not exist")));
        }
    }
    for (p, d) in &g.grads {
        if !g.g.contains_node(*p) || !value_ok(*d) {
            return Err(global(
                pass,
                format!("gradient record {p:?} -> {d:?} dangles"),
            ));
        }
        if g.ty((*p, 0)).shape != g.ty(*d).shape {
            return Err(at(
                g,
                pass,
                d.0,
                format!(
                    "gradient of `{}` has the wrong shape {}",
                    g.node(*p).name,
                    g.ty(*d)
                ),
            ));
        }
    }
    // Scheduling hints (rematerialization) name existing nodes, never the node itself.
    for (n, after) in &g.not_before {
        if !g.g.contains_node(*n) {
            continue;
        }
        if let Some(a) = after.iter().find(|a| !g.g.contains_node(**a) || **a == *n) {
            return Err(at(
                g,
                pass,
                *n,
                format!("scheduling hint on a missing node or itself ({a:?})"),
            ));
        }
    }
    Ok(())
}
