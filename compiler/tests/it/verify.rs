//! The IR verifier accepts every fixture after every pass and rejects hand-broken graphs with
//! messages naming the pass, the node, the op and the shapes.

use dmc_compiler::ctx::Ctx;
use dmc_compiler::error::CompileError;
use dmc_compiler::ir::{Edge, Graph};
use dmc_compiler::op::{DType, ElementwiseOp};
use dmc_compiler::passes::{run_passes, PIPELINE};
use dmc_compiler::plan::Mode;
use dmc_compiler::testutil::*;
use dmc_compiler::verify::verify;
use dmc_compiler::{compile_graph, context, lower, CompileOptions};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

fn ctx(m: &dmc_grammar::model::Model, mode: Mode) -> Ctx {
    context(
        m,
        &CompileOptions {
            mode,
            verify: true,
            ..Default::default()
        },
    )
}

#[test]
fn verifier_accepts_every_fixture_after_every_pass() {
    let mut models: Vec<_> = small_fixtures(adam(1e-3))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    models.extend(
        small_fixtures(sgd_momentum(0.1, 0.9))
            .into_iter()
            .map(|(_, m)| m),
    );
    models.push(seed());
    for m in &models {
        for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
            let c = ctx(m, mode);
            let mut g = lower::lower(m, c.batch).unwrap();
            verify(&g, "lower").unwrap();
            for (name, pass) in PIPELINE.iter().flat_map(|p| p.iter()) {
                pass(&mut g, &c).unwrap();
                verify(&g, name).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

/// The mlp's graph without fusion (whose separate activation nodes these tests corrupt).
fn mlp_graph() -> Graph {
    compile_graph(
        &mlp(sgd(0.1)),
        &CompileOptions {
            verify: true,
            fuse: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn find(g: &Graph, name: &str) -> petgraph::stable_graph::NodeIndex {
    g.nodes()
        .into_iter()
        .find(|n| g.node(*n).name == name)
        .unwrap()
}

/// Runs a corrupting "pass" through the pipeline driver and returns the verifier's message.
fn break_with(
    g: &mut Graph,
    name: &'static str,
    pass: fn(&mut Graph, &Ctx) -> Result<bool, CompileError>,
) -> String {
    let c = ctx(&mlp(sgd(0.1)), Mode::Train);
    match run_passes(g, &c, &[(name, pass)]) {
        Err(CompileError::Verify(e)) => {
            assert_eq!(e.pass, name);
            e.to_string()
        }
        other => panic!("expected a verifier error, got {other:?}"),
    }
}

#[test]
fn rejects_wrong_shape() {
    let mut g = mlp_graph();
    let msg = break_with(&mut g, "break_shape", |g, _| {
        let n = find(g, "dense_2");
        g.g[n].outputs[0].shape = vec![4, 9];
        Ok(true)
    });
    assert!(
        msg.contains("`dense_2` (dense)") && msg.contains("f32[4,9]"),
        "{msg}"
    );
    insta::assert_snapshot!("wrong_shape", msg);
}

#[test]
fn rejects_wrong_dtype() {
    let mut g = mlp_graph();
    let msg = break_with(&mut g, "break_dtype", |g, _| {
        let n = find(g, "x");
        g.g[n].outputs[0].dtype = DType::I32;
        Ok(true)
    });
    assert!(
        msg.contains("`dense_1` (dense)") && msg.contains("i32[4,8]"),
        "{msg}"
    );
    insta::assert_snapshot!("wrong_dtype", msg);
}

#[test]
fn rejects_missing_input_edge() {
    let mut g = mlp_graph();
    let msg = break_with(&mut g, "drop_edge", |g, _| {
        let n = find(g, "dense_2");
        let e =
            g.g.edges_directed(n, Direction::Incoming)
                .find(|e| e.weight().dst_input == 1)
                .unwrap()
                .id();
        g.g.remove_edge(e);
        Ok(true)
    });
    assert!(
        msg.contains("after pass `drop_edge`") && msg.contains("input slot 1 has 0 incoming edges"),
        "{msg}"
    );
}

#[test]
fn rejects_cycle() {
    let mut g = mlp_graph();
    let msg = break_with(&mut g, "make_cycle", |g, _| {
        // relu's input now comes from its own gradient (same type): a cycle.
        let relu = find(g, "activation_1");
        let grad = find(g, "grad dense_1");
        let e =
            g.g.edges_directed(relu, Direction::Incoming)
                .next()
                .unwrap()
                .id();
        g.g.remove_edge(e);
        g.g.add_edge(
            grad,
            relu,
            Edge {
                src_output: 0,
                dst_input: 0,
            },
        );
        Ok(true)
    });
    assert!(msg.contains("cycle"), "{msg}");
}

#[test]
fn rejects_bad_source_output_and_leaf_inputs() {
    let mut g = mlp_graph();
    let msg = break_with(&mut g, "bad_src", |g, _| {
        let n = find(g, "activation_1");
        let e =
            g.g.edges_directed(n, Direction::Incoming)
                .next()
                .unwrap()
                .id();
        g.g[e].src_output = 3;
        Ok(true)
    });
    assert!(msg.contains("reads output 3 of `dense_1`"), "{msg}");
    let mut g = mlp_graph();
    let msg = break_with(&mut g, "feed_leaf", |g, _| {
        let x = find(g, "x");
        let w = find(g, "dense_1.weight");
        g.g.add_edge(
            x,
            w,
            Edge {
                src_output: 0,
                dst_input: 0,
            },
        );
        Ok(true)
    });
    assert!(msg.contains("a leaf has an incoming edge"), "{msg}");
}

#[test]
fn rejects_read_of_a_value_after_its_in_place_update() {
    // A node reading the old weight while depending on its update: no order exists.
    let mut g = mlp_graph();
    let msg = break_with(&mut g, "hazard", |g, _| {
        let w = find(g, "dense_3.weight");
        let upd = find(g, "dense_3.weight update");
        let t = g.add_node(
            dmc_compiler::op::Op::Elementwise(ElementwiseOp::Add),
            &[(w, 0), (upd, 0)],
            "reads old and new",
            dmc_compiler::ir::Phase::Update,
            None,
        )?;
        let _ = t;
        Ok(true)
    });
    assert!(msg.contains("in-place hazard"), "{msg}");
}

/// The tests run checked builds in every profile (`cargo test --release` included): the
/// `verify-passes` feature the dev-dependencies turn on makes the pipeline verify after every pass.
#[test]
fn the_tests_are_checked_builds() {
    assert!(
        std::hint::black_box(dmc_compiler::CHECKED_BUILD),
        "the tests must verify the IR after every pass: is the `verify-passes` feature of \
         dmc-compiler enabled by the dev-dependencies?"
    );
}
