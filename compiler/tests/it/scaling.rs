//! Long networks compile, in every mode, to plans the independent checker accepts: a 20,000-layer
//! ReLU chain, a 5,000-layer dense chain, and a ReLU chain longer than the rematerialization DP
//! plans stage by stage, under a cap. While compilation was quadratic in the number of layers
//! (buffer roots found by walking alias chains, scans of every placed buffer, ...) this file took
//! minutes; it takes seconds now. Nothing here is timed: the work of the buffer-root queries is
//! counted instead.

use dmc_compiler::alias::{BufferRoots, ValueMap, ValueSlots};
use dmc_compiler::ir::{Phase, TensorType};
use dmc_compiler::op::Op;
use dmc_compiler::plan::Mode;
use dmc_compiler::remat::MAX_DP_STAGES;
use dmc_compiler::{check_plan, compile, compile_explained, compile_graph, CompileOptions};

fn model(body: &str, width: usize) -> dmc_grammar::Model {
    let src = format!(
        "input x: [{width}]\ntarget y: [{width}]\nout = x |> {body}\nloss mse(out, y)\n\
         train {{ batch: 2, optimizer: sgd(lr: 0.01) }}\n"
    );
    dmc_grammar::compile_source(&src, "scaling.dm").unwrap()
}

fn relu_chain(layers: usize) -> dmc_grammar::Model {
    model(&format!("dense(8) |> repeat {} {{ relu }}", layers - 1), 8)
}

fn opts(mode: Mode) -> CompileOptions {
    CompileOptions {
        mode,
        verify: true,
        ..CompileOptions::default()
    }
}

#[test]
fn a_20000_layer_relu_chain_compiles_in_every_mode() {
    let m = relu_chain(20_000);
    for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
        let p = compile(&m, &opts(mode)).unwrap();
        check_plan(&p).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        // The dense layer with the first ReLU fused in, the other ReLUs (and in training their
        // backward and the updates).
        assert!(p.steps.len() >= 19_999, "{mode:?}: {} steps", p.steps.len());
        if mode != Mode::Train {
            // In place: after the dense layer's output, the ReLUs need no buffer of their own.
            assert!(
                p.buffers.len() < 16,
                "{mode:?}: {} buffers",
                p.buffers.len()
            );
        }
    }
}

#[test]
fn a_5000_layer_dense_chain_compiles_in_every_mode() {
    let m = model("repeat 5000 { dense(4) }", 4);
    for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
        let p = compile(&m, &opts(mode)).unwrap();
        check_plan(&p).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(p.params.len(), 10_000, "{mode:?}");
        assert!(p.arena_bytes >= p.lower_bound_bytes);
    }
}

#[test]
fn residual_blocks_compile_and_check() {
    let src = "input x: [8]\ntarget y: [8]\n\
               block res(x) {\n  y = x |> dense(8, activation: relu) |> dense(8)\n  return relu(x + y)\n}\n\
               out = x |> repeat 1000 { res }\nloss mse(out, y)\n\
               train { batch: 2, optimizer: adam(lr: 0.001) }\n";
    let m = dmc_grammar::compile_source(src, "res.dm").unwrap();
    for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
        let p = compile(&m, &opts(mode)).unwrap();
        check_plan(&p).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
    }
}

/// In predict mode every ReLU of the chain writes into its input: one alias chain as long as the
/// network. Resolving every value's buffer costs a bounded number of parent steps per value,
/// in any query order (path compression), and agrees with walking the chain.
#[test]
fn buffer_roots_of_a_long_alias_chain_cost_linear_work() {
    let n = 20_000;
    let g = compile_graph(&relu_chain(n), &opts(Mode::Predict)).unwrap();
    let values: Vec<_> = g
        .topo_order()
        .unwrap()
        .into_iter()
        .flat_map(|x| (0..g.node(x).outputs.len()).map(move |o| (x, o)))
        .collect();
    assert!(values.len() > n);
    for order in [values.clone(), values.iter().rev().copied().collect()] {
        let mut roots = BufferRoots::new(&g);
        let mut distinct = std::collections::BTreeSet::new();
        for v in &order {
            distinct.insert(roots.root(*v));
        }
        // The input, the dense layer's parameters and output (which every ReLU writes into).
        assert!(distinct.len() <= 5, "{} buffers", distinct.len());
        assert!(
            roots.steps() <= 3 * order.len() as u64,
            "{} parent steps for {} queries",
            roots.steps(),
            order.len()
        );
    }
    // The same answers as following the chain, on a few values.
    let mut roots = BufferRoots::new(&g);
    for v in values.iter().step_by(997) {
        assert_eq!(roots.root(*v), g.buffer_root(*v));
    }
}

/// Buffer roots agree with `Graph::buffer_root` on every value of the example networks, in every
/// mode (views, in-place activations and additions, optimizer updates).
#[test]
fn buffer_roots_agree_with_walking_alias_chains() {
    for name in ["mlp.dm", "resnet_small.dm", "seed.dm"] {
        let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
        let src = std::fs::read_to_string(&path).unwrap();
        let m = dmc_grammar::compile_source(&src, &path).unwrap();
        for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
            let g = compile_graph(&m, &opts(mode)).unwrap();
            let mut roots = BufferRoots::new(&g);
            for x in g.nodes() {
                for o in 0..g.node(x).outputs.len() {
                    assert_eq!(roots.root((x, o)), g.buffer_root((x, o)), "{name} {mode:?}");
                }
            }
        }
    }
}

/// The dense numbering behind the per-value tables of scheduling and emission: every value of
/// the graph gets its own slot in `0..len`, values the graph did not have get none, and a
/// `ValueMap` keeps entries for both kinds.
#[test]
fn value_slots_number_every_value_once() {
    let path = format!("{}/../examples/resnet_small.dm", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap();
    let m = dmc_grammar::compile_source(&src, &path).unwrap();
    let mut g = compile_graph(&m, &opts(Mode::Train)).unwrap();
    let slots = ValueSlots::new(&g);
    let mut seen = vec![false; slots.len()];
    let mut values = 0;
    for x in g.nodes() {
        for o in 0..g.node(x).outputs.len() {
            let s = slots.slot((x, o)).unwrap();
            assert!(!seen[s], "slot {s} given twice");
            seen[s] = true;
            values += 1;
        }
        assert_eq!(slots.slot((x, g.node(x).outputs.len())), None);
    }
    assert_eq!(values, slots.len());
    let mut map: ValueMap<usize> = ValueMap::new(&g);
    let old = (g.nodes()[3], 0);
    let new = g.add_leaf(
        Op::Input {
            name: "late".into(),
        },
        TensorType::f32(vec![1]),
        "late",
        Phase::Forward,
    );
    assert_eq!(slots.slot((new, 0)), None);
    map.insert(old, 7);
    map.insert((new, 0), 8);
    *map.get_or_insert_with((new, 0), || 0) += 1;
    *map.get_or_insert_with((g.nodes()[4], 0), || 5) += 1;
    assert_eq!(map.get(old), Some(&7));
    assert_eq!(map.get((new, 0)), Some(&9));
    assert_eq!(map.get((g.nodes()[4], 0)), Some(&6));
    assert_eq!(map.get((g.nodes()[5], 0)), None);
}

/// A chain longer than the DP plans stage by stage is planned on groups of stages: under half of
/// its arena, it still fits, recomputes, and checks.
/// The training step of `m` under `cap`, rematerialized as needed, checked.
fn capped(
    m: &dmc_grammar::Model,
    cap: u64,
) -> (dmc_compiler::Plan, Option<dmc_compiler::RematInfo>) {
    let (p, info) = compile_explained(
        m,
        &CompileOptions {
            cap: Some(cap),
            ..opts(Mode::Train)
        },
    )
    .unwrap();
    check_plan(&p).unwrap();
    (p, info)
}

#[test]
fn a_chain_longer_than_the_dp_rematerializes_under_a_cap() {
    let layers = 3 * MAX_DP_STAGES;
    let m = relu_chain(layers);
    let free = compile(&m, &opts(Mode::Train)).unwrap();
    let cap = free.arena_bytes / 2;
    let (p, info) = capped(&m, cap);
    assert!(p.arena_bytes <= cap, "{} > {cap}", p.arena_bytes);
    let info = info.expect("rematerialized");
    assert!(info.stages > MAX_DP_STAGES, "{} stages", info.stages);
    assert!(dmc_compiler::recompute_flops(&p) > 0);
}

/// Under a cap, an 8,000-layer chain is rematerialized and every copy is fused like the original:
/// each `tanh` folds into its dense layer, recomputed or not. (The legality search of the fusion
/// pass walked every node after the fused pair, and past 20,000 nodes refused the fusion: minutes
/// at 32,000 layers, and unfused copies.)
#[test]
fn a_capped_8000_layer_chain_is_rematerialized_with_every_copy_fused() {
    let src =
        "input x: [16]\ntarget y: [16]\nout = x |> repeat 8000 { dense(16, activation: tanh) }\n\
               loss mse(out, y)\ntrain { batch: 64, optimizer: sgd(lr: 0.01) }\n";
    let m = dmc_grammar::compile_source(src, "long.dm").unwrap();
    let free = compile(&m, &opts(Mode::Train)).unwrap();
    let cap = free.arena_bytes * 4 / 5;
    let (p, info) = capped(&m, cap);
    assert!(p.arena_bytes <= cap && info.is_some());
    let recomputed = p
        .steps
        .iter()
        .filter(|s| s.label.contains("(recompute"))
        .count();
    assert!(recomputed > 1000, "{recomputed} recomputed steps");
    let kind = |s: &dmc_compiler::plan::Step| p.kernels[s.kernel].op.kind_name();
    let unfused = p.steps.iter().filter(|s| kind(s) == "tanh").count();
    assert_eq!(unfused, 0, "tanh steps not fused into their dense layer");
    let dense = p.steps.iter().filter(|s| kind(s) == "dense").count();
    assert_eq!(
        dense,
        8000 + recomputed,
        "one dense step per layer and per copy"
    );
}
