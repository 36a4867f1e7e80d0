//! The memory planner and the in-place rewrites change memory, never results — checked on the real
//! example programs (the compiler and runtime suites check the same on fixtures and random nets).

use dmc_compiler::PlannerKind;
use dmc_compiler::{check_plan, compile, CompileOptions};
use dmc_grammar::model::Model;
use dmc_runtime::io::{Dataset, Task, TensorRole, TensorSpec};
use dmc_runtime::{CpuBackend, InputData};

fn example(name: &str) -> Model {
    let path = format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    dmc_grammar::compile_file(std::path::Path::new(&path))
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)))
}

/// Trains `steps` steps on seeded synthetic data; returns the losses and the final weights.
fn train(
    m: &Model,
    opts: &CompileOptions,
    steps: usize,
    poison: bool,
) -> (Vec<f32>, Vec<Vec<f32>>, u64) {
    let plan = compile(m, opts).expect("compile");
    check_plan(&plan).expect("plan checker");
    let arena = plan.arena_bytes;
    let specs = TensorSpec::from_plan(&plan);
    let task = if m.loss.terms[0].kind.takes_labels() {
        Task::Classification {
            classes: *m.shape(m.loss.terms[0].pred).last().expect("classes"),
        }
    } else {
        Task::Regression
    };
    let ds = Dataset::synthetic(&specs, plan.batch * steps, 1, task).expect("data");
    let mut be = CpuBackend::new(plan.clone()).expect("backend");
    be.set_poison(poison);
    be.init_params(3);
    let mut losses = Vec::new();
    for s in 0..steps {
        let idx: Vec<usize> = (s * plan.batch..(s + 1) * plan.batch).collect();
        for spec in &specs {
            if spec.role == TensorRole::Target && spec.dtype == dmc_compiler::op::DType::I32 {
                let mut v = vec![0i32; idx.len() * spec.sample_len().max(1)];
                ds.fill_i32(&spec.name, &idx, &mut v).expect("fill");
                be.set_input(&spec.name, InputData::I32(&v)).expect("set");
            } else {
                let mut v = vec![0f32; idx.len() * spec.sample_len()];
                ds.fill_f32(&spec.name, &idx, &mut v).expect("fill");
                be.set_input(&spec.name, InputData::F32(&v)).expect("set");
            }
        }
        losses.push(be.run(s as u64 + 1, 9).expect("run"));
    }
    let weights = be.params().map(|(_, _, d)| d.to_vec()).collect();
    (losses, weights, arena)
}

fn unplanned(fuse: bool) -> CompileOptions {
    CompileOptions {
        planner: PlannerKind::Trivial,
        inplace: false,
        fuse,
        verify: true,
        ..CompileOptions::default()
    }
}

#[test]
fn planner_and_in_place_rewrites_are_bit_identical_on_the_examples() {
    for ex in ["mlp.dm", "resnet_small.dm"] {
        let m = example(ex);
        for fuse in [false, true] {
            let planned = CompileOptions {
                fuse,
                verify: true,
                ..CompileOptions::default()
            };
            let (l0, w0, a0) = train(&m, &unplanned(fuse), 4, false);
            let (l1, w1, a1) = train(&m, &planned, 4, true);
            assert!(
                a1 < a0,
                "{ex}: planned arena {a1} not smaller than unplanned {a0}"
            );
            assert!(
                l1.iter().all(|l| l.is_finite()),
                "{ex}: NaN under poison: {l1:?}"
            );
            assert_eq!(l0, l1, "{ex} fuse={fuse}: losses differ");
            assert!(w0 == w1, "{ex} fuse={fuse}: weights differ");
        }
    }
}

#[test]
fn fused_update_differs_from_unfused_only_by_summation_order() {
    for ex in ["mlp.dm", "resnet_small.dm"] {
        let m = example(ex);
        let (_, wf, af) = train(&m, &CompileOptions::default(), 5, false);
        let (_, wu, au) = train(
            &m,
            &CompileOptions {
                fuse: false,
                ..CompileOptions::default()
            },
            5,
            false,
        );
        assert!(af <= au, "{ex}: fused arena {af} > unfused {au}");
        for (a, b) in wf.iter().zip(&wu) {
            let num: f64 = a
                .iter()
                .zip(b)
                .map(|(x, y)| ((x - y) as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            let den: f64 = b
                .iter()
                .map(|y| (*y as f64).powi(2))
                .sum::<f64>()
                .sqrt()
                .max(1e-30);
            assert!(num / den <= 1e-6, "{ex}: relative difference {}", num / den);
        }
    }
}
