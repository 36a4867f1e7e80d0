//! Memory: best-fit placement near the liveness lower bound, in-place rewriting, the weight
//! gradient fused with the optimizer update, the cap.

use dmc_compiler::op::{ConvOp, DenseOp, ElementwiseOp, Op, OptimOp, UpdateRule};
use dmc_compiler::plan::{BufferKind, Mode, Plan};
use dmc_compiler::testutil::*;
use dmc_compiler::{check_plan, compile, CompileError, CompileOptions, PlannerKind};
use dmc_grammar::model::{Model, Optimizer};

const SEED_PARAM_BYTES: u64 = 826_152_612;

fn with_opt(mut m: Model, opt: Optimizer) -> Model {
    m.train.optimizer = opt;
    m
}

fn compile_ok(m: &Model, opts: CompileOptions) -> Plan {
    let p = compile(
        m,
        &CompileOptions {
            verify: true,
            ..opts
        },
    )
    .unwrap();
    check_plan(&p).unwrap();
    p
}

fn persistent(p: &Plan, k: BufferKind) -> u64 {
    p.buffers
        .iter()
        .filter(|b| b.kind == k && b.persistent)
        .map(|b| b.bytes)
        .sum()
}

#[test]
fn seed_arena_is_about_the_parameters() {
    for (name, opt, state_copies) in [
        ("sgd", sgd(0.01), 0u64),
        ("momentum", sgd_momentum(0.01, 0.9), 1),
        ("adam", adam(1e-3), 2),
    ] {
        let m = with_opt(seed(), opt);
        let p = compile_ok(&m, CompileOptions::default());
        let params = persistent(&p, BufferKind::Parameter);
        assert_eq!(params, SEED_PARAM_BYTES);
        assert_eq!(
            persistent(&p, BufferKind::OptimizerState),
            state_copies * params
        );
        let base = params * (1 + state_copies);
        println!(
            "seed {name}: arena {} = {:.4} x (params + state {}), lower bound {}, {}",
            p.arena_bytes,
            p.arena_bytes as f64 / base as f64,
            base,
            p.lower_bound_bytes,
            p.placement_strategy
        );
        assert!(
            p.arena_bytes as f64 <= 1.01 * base as f64,
            "{name}: arena {} > 1.01 x {base}",
            p.arena_bytes
        );
        // No whole-layer weight gradient anywhere: every update is fused.
        assert!(p.steps.iter().all(|s| !matches!(
            p.kernels[s.kernel].op,
            Op::Optim(OptimOp::Update { .. })
                | Op::Conv(ConvOp::Conv2dBwdWeight { .. })
                | Op::Dense(DenseOp::DenseBwdWeight)
        )));
    }
}

#[test]
fn seed_unfused_holds_a_whole_layer_gradient() {
    let p = compile_ok(
        &seed(),
        CompileOptions {
            fuse: false,
            ..Default::default()
        },
    );
    // The largest layer (a 3x3 1024->1024 conv): 9216 x 1024 floats.
    let largest = 9 * 1024 * 1024 * 4;
    println!(
        "seed unfused: arena {} = params + {} ({:.4} x params)",
        p.arena_bytes,
        p.arena_bytes - SEED_PARAM_BYTES,
        p.arena_bytes as f64 / SEED_PARAM_BYTES as f64
    );
    assert!(p.arena_bytes >= SEED_PARAM_BYTES + largest);
}

#[test]
fn seed_cap_exceeded_names_the_smallest_cap() {
    let err = compile(
        &seed(),
        &CompileOptions {
            cap: Some(800_000_000),
            verify: true,
            // resident: what the parameters and optimizer state alone need
            stream: false,
            ..Default::default()
        },
    )
    .unwrap_err();
    let msg = err.to_string();
    println!("{msg}");
    let CompileError::CapExceeded {
        needed,
        cap,
        params,
        opt_state,
        working_set,
        host: 0,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(cap, 800_000_000);
    assert_eq!(params + opt_state + working_set, needed);
    assert!(params >= SEED_PARAM_BYTES && opt_state == 0);
    assert!(
        (needed as f64) < 1.005 * SEED_PARAM_BYTES as f64,
        "{needed}"
    );
    assert!(msg.contains("parameters 787.9 MiB + optimizer state 0 B + smallest working set"));
    assert!(msg.contains(&format!(
        "pass --vram-cap {}MiB or more",
        needed.div_ceil(1 << 20)
    )));
    // The smallest cap works, exactly.
    let p = compile_ok(
        &seed(),
        CompileOptions {
            cap: Some(needed),
            stream: false,
            ..Default::default()
        },
    );
    assert!(p.arena_bytes <= needed);
    assert!(matches!(
        compile(
            &seed(),
            &CompileOptions {
                cap: Some(needed - 1),
                stream: false,
                ..Default::default()
            }
        ),
        Err(CompileError::CapExceeded { .. })
    ));
}

#[test]
fn arena_is_within_two_percent_of_the_lower_bound_on_every_fixture() {
    for opt in [sgd(0.1), sgd_momentum(0.1, 0.9), adam(1e-3)] {
        let mut models = small_fixtures(opt);
        models.push(("seed", with_opt(seed(), opt)));
        for (name, m) in models {
            for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
                for fuse in [true, false] {
                    let p = compile_ok(
                        &m,
                        CompileOptions {
                            mode,
                            fuse,
                            ..Default::default()
                        },
                    );
                    let r = p.arena_bytes as f64 / p.lower_bound_bytes as f64;
                    println!(
                        "{name} {opt:?} {mode:?} fuse={fuse}: arena {} / lower bound {} = {r:.4} ({})",
                        p.arena_bytes, p.lower_bound_bytes, p.placement_strategy
                    );
                    assert!(r <= 1.02, "{name} {mode:?}: {r}");
                }
            }
        }
    }
}

#[test]
fn trivial_planner_is_still_selectable() {
    let m = residual(sgd(0.1));
    let t = compile_ok(
        &m,
        CompileOptions {
            planner: PlannerKind::Trivial,
            ..Default::default()
        },
    );
    let b = compile_ok(&m, CompileOptions::default());
    assert_eq!(t.placement_strategy, "trivial");
    assert!(b.arena_bytes < t.arena_bytes);
    assert_eq!(t.lower_bound_bytes, b.lower_bound_bytes);
}

#[test]
fn seed_never_holds_a_whole_layer_gradient() {
    let p = compile_ok(&seed(), CompileOptions::default());
    let largest_ws = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Workspace)
        .map(|b| b.bytes)
        .max()
        .unwrap();
    let largest_grad = 9 * 1024 * 1024 * 4; // a 3x3 1024->1024 conv
    println!("seed: largest workspace {largest_ws} bytes (largest layer gradient {largest_grad})");
    assert!(largest_ws * 8 <= largest_grad);
    assert!(p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Gradient)
        .all(|b| b.bytes < largest_grad / 8));
    let chunks: Vec<usize> = p
        .kernels
        .iter()
        .filter_map(|k| match k.op {
            Op::Conv(ConvOp::Conv2dBwdWeightUpdate { chunk, .. }) => Some(chunk),
            _ => None,
        })
        .collect();
    assert!(chunks.iter().all(|c| *c < 1024), "{chunks:?}");
}

#[test]
fn rewrites_on_the_residual_fixture() {
    let g = dmc_compiler::compile_graph(
        &residual(sgd(0.1)),
        &CompileOptions {
            verify: true,
            ..Default::default()
        },
    )
    .unwrap();
    let count = |pred: &dyn Fn(&Op) -> bool| {
        g.nodes()
            .into_iter()
            .filter(|n| pred(&g.node(*n).op))
            .count()
    };
    // Fused (`fuse_epilogues`): the two forward relus and the residual add are in the
    // convolutions' epilogues (conv2d_2: `relu(acc + b + a)`), the second relu's backward is folded
    // with the pool's broadcast backward (written over the saved output), and the first relu's
    // backward with the accumulation of the two gradients of `a` (used twice) is conv2d_2's
    // data-gradient epilogue, written over `a` after conv2d_2's update (which keeps the old
    // weights): no separate elementwise kernel is left.
    assert_eq!(
        count(&|o| matches!(
            o,
            Op::Elementwise(
                ElementwiseOp::Add
                    | ElementwiseOp::AddInPlace
                    | ElementwiseOp::Unary(_)
                    | ElementwiseOp::UnaryInPlace(_)
                    | ElementwiseOp::UnaryBwd(_)
                    | ElementwiseOp::UnaryBwdInPlace(_)
            )
        )),
        0
    );
    assert_eq!(
        count(&|o| matches!(o, Op::Conv(ConvOp::Conv2d { epi, .. }) if epi.act.is_some())),
        2
    );
    assert_eq!(
        count(&|o| matches!(o, Op::Conv(ConvOp::Conv2d { epi, .. }) if epi.add)),
        1
    );
    assert_eq!(
        count(&|o| matches!(
            o,
            Op::Pool(dmc_compiler::op::PoolOp::GlobalAvgPoolBwdActInPlace(_))
        )),
        1
    );
    assert_eq!(
        count(&|o| matches!(
            o,
            Op::Conv(ConvOp::Conv2dBwdData { epi, in_place: true, .. })
                if epi.add && epi.act.is_some()
        )),
        1
    );
    assert_eq!(
        count(&|o| matches!(
            o,
            Op::Conv(ConvOp::Conv2dBwdWeightUpdate { keep_old: true, .. })
        )),
        1
    );
    // Every update fused: 2 convs + 1 dense, each with its bias in the same kernel.
    assert_eq!(
        count(&|o| matches!(
            o,
            Op::Conv(ConvOp::Conv2dBwdWeightUpdate { bias: true, .. })
        )),
        2
    );
    assert_eq!(
        count(&|o| matches!(
            o,
            Op::Dense(DenseOp::DenseBwdWeightUpdate { bias: true, .. })
        )),
        1
    );
    assert_eq!(
        count(&|o| matches!(o, Op::Optim(OptimOp::BiasGradUpdate { .. }))),
        0
    );
    assert_eq!(
        count(&|o| matches!(
            o,
            Op::Optim(OptimOp::Update {
                rule: UpdateRule::Sgd { .. },
                ..
            }) | Op::Conv(ConvOp::Conv2dBwdWeight { .. })
                | Op::Dense(DenseOp::DenseBwdWeight)
                | Op::Optim(OptimOp::BiasGrad)
        )),
        0
    );
    // In-place kernels bind one buffer for the written input: no `Out` parameter.
    for op in [
        Op::Elementwise(ElementwiseOp::UnaryInPlace(
            dmc_compiler::op::UnaryKind::Relu,
        )),
        Op::Elementwise(ElementwiseOp::AddInPlace),
        Op::Elementwise(ElementwiseOp::UnaryBwdInPlace(
            dmc_compiler::op::UnaryKind::Relu,
        )),
    ] {
        let sig = op.signature();
        assert!(sig
            .params
            .iter()
            .all(|p| p.role != dmc_compiler::op::Role::Out));
        assert_eq!(
            sig.params
                .iter()
                .filter(|p| p.role == dmc_compiler::op::Role::InOut)
                .count(),
            1
        );
    }
}
