//! The memory plan changes memory, never results: best-fit placement + in-place rewriting train
//! bit-identically to the trivial placement without rewriting; the fused weight-gradient +
//! update kernels match the unfused ones to 1e-6 (whole-layer and one-column chunks); random
//! networks under random feasible caps run without NaN under poison and equal the unplanned run.

use dmc_compiler::op::{ConvOp, DType, DenseOp, Op, OptimOp, Optimizer, Role};
use dmc_compiler::plan::Plan;
use dmc_compiler::testutil::*;
use dmc_compiler::{compile, CompileError, CompileOptions, PlannerKind};
use dmc_runtime::{CpuBackend, InputData};
use proptest::prelude::*;

/// Parameters after each of `steps` training steps on deterministic data, and the losses.
type Trained = (Vec<(String, Vec<f32>)>, Vec<f32>);

fn data(n: usize, salt: usize, step: u64) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 + salt * 11 + step as usize * 23) % 101) as f32 / 50.0 - 1.0)
        .collect()
}

fn run_plan(plan: Plan, steps: u64, poison: bool) -> Trained {
    let classes = *plan.output.shape.last().unwrap_or(&1);
    let mut be = CpuBackend::new(plan.clone()).unwrap();
    be.init_params(7);
    be.set_poison(poison);
    let mut losses = vec![];
    for step in 1..=steps {
        for (k, io) in plan.inputs.iter().chain(&plan.targets).enumerate() {
            let n: usize = io.shape.iter().product();
            match io.dtype {
                DType::I32 => {
                    let l: Vec<i32> = (0..n)
                        .map(|i| ((i + step as usize) % classes) as i32)
                        .collect();
                    be.set_input(&io.name, InputData::I32(&l)).unwrap();
                }
                _ => be
                    .set_input(&io.name, InputData::F32(&data(n, k, step)))
                    .unwrap(),
            }
        }
        losses.push(be.run(step, 99).unwrap());
    }
    let params = be
        .params()
        .map(|(n, _, v)| (n.to_string(), v.to_vec()))
        .collect();
    (params, losses)
}

fn train(m: &TestModel, opts: CompileOptions, steps: u64, poison: bool) -> Trained {
    let plan = compile(
        m,
        &CompileOptions {
            verify: true,
            ..opts
        },
    )
    .unwrap();
    run_plan(plan, steps, poison)
}

fn planned(fuse: bool) -> CompileOptions {
    CompileOptions {
        fuse,
        ..Default::default()
    }
}

fn unplanned(fuse: bool) -> CompileOptions {
    CompileOptions {
        fuse,
        planner: PlannerKind::Trivial,
        inplace: false,
        ..Default::default()
    }
}

fn bits(t: &Trained) -> Vec<(String, Vec<u32>)> {
    t.0.iter()
        .map(|(n, v)| (n.clone(), v.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

fn optimizers() -> Vec<Optimizer> {
    vec![
        sgd(0.1),
        sgd_momentum(0.1, 0.9),
        Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-3,
            nesterov: true,
            clip_value: None,
            clip_norm: None,
        },
        adam(1e-2),
        Optimizer::Adam {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-7,
            weight_decay: 1e-2,
            decoupled: true,
            clip_value: None,
            clip_norm: None,
        },
    ]
}

/// Largest |a - b| over a tensor, relative to its largest |b|.
fn max_rel(a: &Trained, b: &Trained) -> f64 {
    let mut worst = 0f64;
    for ((na, va), (nb, vb)) in a.0.iter().zip(&b.0) {
        assert_eq!(na, nb);
        let scale = vb
            .iter()
            .fold(0f64, |m, x| m.max(x.abs() as f64))
            .max(1e-30);
        let d = va
            .iter()
            .zip(vb)
            .fold(0f64, |m, (x, y)| m.max((*x as f64 - *y as f64).abs()));
        worst = worst.max(d / scale);
    }
    worst
}

#[test]
fn planning_and_in_place_rewriting_never_change_results() {
    for opt in optimizers() {
        for (name, m) in small_fixtures(opt) {
            for fuse in [true, false] {
                let a = train(&m, planned(fuse), 4, false);
                let b = train(&m, unplanned(fuse), 4, false);
                assert_eq!(bits(&a), bits(&b), "{name} {opt:?} fuse={fuse}");
                assert_eq!(
                    a.1.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
                    b.1.iter().map(|l| l.to_bits()).collect::<Vec<_>>()
                );
                // The same under poison: nothing is read after its planned death.
                let p = train(&m, planned(fuse), 4, true);
                assert_eq!(bits(&p), bits(&a), "{name} {opt:?} fuse={fuse} poisoned");
                assert!(p.1.iter().all(|l| l.is_finite()), "{name}: {:?}", p.1);
            }
        }
    }
}

#[test]
fn the_plans_really_differ() {
    let m = residual(sgd(0.1));
    let a = compile(&m, &planned(true)).unwrap();
    let b = compile(&m, &unplanned(true)).unwrap();
    assert!(a.arena_bytes < b.arena_bytes);
    // kernels writing an input in place besides the optimizer updates (elementwise ops, the
    // fused data gradient written over its saved value, the folded pool backward)
    let inplace = |p: &Plan| {
        p.kernels
            .iter()
            .filter(|k| !k.op.aliased_outputs().is_empty() && !k.op.is_update())
            .count()
    };
    assert!(inplace(&a) > 0);
    assert_eq!(inplace(&b), 0);
}

/// The smallest achievable arena (from the cap error).
fn smallest(m: &TestModel) -> u64 {
    match compile(
        m,
        &CompileOptions {
            cap: Some(0),
            ..Default::default()
        },
    ) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        other => panic!("{other:?}"),
    }
}

#[test]
fn fused_matches_unfused_after_five_steps() {
    for opt in optimizers() {
        for (name, m) in small_fixtures(opt) {
            let unfused = train(&m, planned(false), 5, false);
            let whole = train(&m, planned(true), 5, false);
            // The smallest cap is met (the chunks shrink only while the gradient workspaces
            // matter for the peak).
            let cap = smallest(&m);
            let capped = compile(
                &m,
                &CompileOptions {
                    cap: Some(cap),
                    verify: true,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(capped.arena_bytes <= cap);
            // Narrow chunks (1 and 3 columns; a smaller chunk needs less workspace than planned,
            // which is allowed): the same plan with the fused kernels' chunks overridden.
            let with_chunk = |c: usize| {
                let mut p = compile(&m, &planned(true)).unwrap();
                let mut n = 0;
                for k in &mut p.kernels {
                    if let Op::Conv(ConvOp::Conv2dBwdWeightUpdate { chunk, .. })
                    | Op::Dense(DenseOp::DenseBwdWeightUpdate { chunk, .. }) = &mut k.op
                    {
                        *chunk = c.min(*chunk);
                        n += 1;
                    }
                }
                assert!(n > 0);
                dmc_compiler::check_plan(&p).unwrap();
                run_plan(p, 5, true)
            };
            let narrow = with_chunk(1);
            let three = with_chunk(3);
            let capped = run_plan(capped, 5, true);
            for (what, t) in [
                ("whole", &whole),
                ("one-column", &narrow),
                ("three-column", &three),
                ("capped", &capped),
            ] {
                let r = max_rel(t, &unfused);
                assert!(r <= 1e-6, "{name} {opt:?} {what}: {r}");
            }
        }
    }
}

fn layer() -> impl Strategy<Value = RandLayer> {
    prop_oneof![
        (
            1usize..5,
            1usize..4,
            1usize..3,
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(filters, k, stride, same, bias)| RandLayer::Conv {
                filters,
                k,
                stride,
                same,
                bias
            }),
        (any::<bool>(), 1usize..3, 1usize..3).prop_map(|(max, size, stride)| RandLayer::Pool {
            max,
            size,
            stride
        }),
        (0u8..4).prop_map(RandLayer::Act),
        Just(RandLayer::Dropout),
        Just(RandLayer::Residual),
        (0u8..4, 0u8..4).prop_map(|(f, g)| RandLayer::Branch(f, g)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_nets_under_random_caps_train_like_the_unplanned_run(
        hw in 3usize..8,
        layers in proptest::collection::vec(layer(), 1..6),
        dense in proptest::collection::vec((1usize..5, any::<bool>(), 0u8..5), 1..3),
        batch in 1usize..3,
        ce in any::<bool>(),
        opt in 0u8..5,
        frac in 0.0f64..1.0,
    ) {
        let m = random_net(hw, &layers, &dense, batch, ce, opt);
        let uncapped = compile(&m, &CompileOptions::default()).unwrap().arena_bytes;
        let small = smallest(&m);
        let cap = small + (uncapped.saturating_sub(small) as f64 * frac) as u64;
        let plan = compile(&m, &CompileOptions { cap: Some(cap), verify: true, ..Default::default() })
            .map_err(|e| TestCaseError::fail(format!("cap {cap}: {e}")))?;
        prop_assert!(plan.arena_bytes <= cap);
        let fused = plan.kernels.iter().any(|k| k.op.is_update() && !matches!(k.op, Op::Optim(OptimOp::Update { .. })));
        let a = run_plan(plan, 3, true);
        prop_assert!(a.0.iter().all(|(_, v)| v.iter().all(|x| !x.is_nan())));
        prop_assert!(a.1.iter().all(|l| !l.is_nan()));
        // Same fused/unfused choice, trivial placement, no rewriting, no poison.
        let b = train(&m, unplanned(fused), 3, false);
        let r = max_rel(&a, &b);
        // Chunked gradients may round differently from whole-layer ones; everything else is exact.
        prop_assert!(r <= 1e-6, "relative difference {}", r);
    }
}

#[test]
fn an_in_place_argument_overlapping_another_is_rejected() {
    let mut p = compile(&residual(sgd(0.1)), &planned(true)).unwrap();
    // a step writing one argument in place (not an update) and reading another
    let (si, (w, r)) = p
        .steps
        .iter()
        .enumerate()
        .find_map(|(i, s)| {
            let op = &p.kernels[s.kernel].op;
            let params = op.signature().params;
            let w = params.iter().position(|q| q.role == Role::InOut)?;
            let r = params.iter().position(|q| q.role == Role::In)?;
            (!op.is_update()).then_some((i, (w, r)))
        })
        .unwrap();
    // the read argument := the written one: the kernel would read the buffer it writes through
    // another argument.
    p.steps[si].args[r] = p.steps[si].args[w];
    let err = CpuBackend::new(p).err().expect("must be rejected");
    assert!(err.to_string().contains("overlaps"), "{err}");
}
