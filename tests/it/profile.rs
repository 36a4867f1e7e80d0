//! `dmc run --profile` and `--cuda-graph` without a GPU: the profile's aggregation by training
//! step and its table (the measurement itself, CUDA events, needs a GPU: `scripts/gpu-check.sh`),
//! the segments the graphs are captured in (cut where the NaN halt reads the loss, one set per
//! pass), the flags refused on the backends that do not have them, the CPU backend's own profile
//! (wall clock per step, with the CPU time model's prediction), and `set_cuda_graph` refused by
//! the CPU backend.

use dmc_compiler::plan::{ClipNormMethod, Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::host_arena::segments;
use dmc_runtime::profile::{profile_table, ProfileAccumulator};
use dmc_runtime::{Backend, BackendKind, RunPass};

use crate::common::{dmc, dmc_env};

fn accumulator() -> ProfileAccumulator {
    ProfileAccumulator::new(
        vec!["conv".into(), "relu".into(), "update".into()],
        "CUDA events around each launch",
    )
}

#[test]
fn the_first_step_is_left_out_and_runs_of_one_step_count_once() {
    let mut a = accumulator();
    // step 1: the warm-up, slow
    a.record(1, 0, 100.0);
    a.record(1, 1, 50.0);
    // a single step so far: it is the profile
    let p = a.profile();
    assert_eq!((p.steps, p.warmup_excluded), (1, false));
    assert_eq!(p.kernels.len(), 2);
    // steps 2 and 3, each as two runs (accumulated micro-batches): the same step counter
    for step in [2, 3] {
        for _ in 0..2 {
            a.record(step, 0, 1.0);
            a.record(step, 1, 0.5);
            a.record(step, 1, 0.5);
        }
        a.record(step, 2, 2.0);
    }
    let p = a.profile();
    assert_eq!((p.steps, p.warmup_excluded), (2, true));
    let by_name: Vec<(&str, u64, f64)> = p
        .kernels
        .iter()
        .map(|k| (k.name.as_str(), k.launches, k.total_ms))
        .collect();
    assert_eq!(
        by_name,
        vec![("conv", 4, 4.0), ("relu", 8, 4.0), ("update", 2, 4.0)]
    );
    let medians: Vec<f64> = p.kernels.iter().map(|k| k.median_ms).collect();
    assert_eq!(medians, vec![2.0, 2.0, 2.0]);
}

#[test]
fn the_table_shows_each_kernels_median_step_so_one_stalled_step_does_not_move_it() {
    let mut a = accumulator();
    a.record(1, 0, 9.0);
    // conv: 1 ms per step but 50 ms in one stalled step; relu: skipped in one step
    for (step, conv) in [(2, 1.0), (3, 50.0), (4, 1.0)] {
        a.record(step, 0, conv);
        if step != 3 {
            a.record(step, 1, 0.25);
        }
    }
    let p = a.profile();
    let by_name: Vec<(&str, f64, f64)> = p
        .kernels
        .iter()
        .map(|k| (k.name.as_str(), k.total_ms, k.median_ms))
        .collect();
    assert_eq!(by_name, vec![("conv", 52.0, 1.0), ("relu", 0.5, 0.25)]);
    let t = profile_table(&p, None);
    assert!(t.contains("| conv | 1 | 1000.0 | 80.0% |"), "{t}");
    assert!(t.contains("| **step** | 1.67 | 1250.0 | 100% |"), "{t}");
}

#[test]
fn the_table_is_markdown_slowest_first_with_shares_and_a_total() {
    let mut a = accumulator();
    a.record(1, 0, 9.0);
    for step in [2, 3] {
        a.record(step, 0, 3.0); // 3 ms per step
        a.record(step, 1, 0.5);
        a.record(step, 1, 0.5); // 2 launches, 1 ms per step
    }
    let t = profile_table(&a.profile(), None);
    let lines: Vec<&str> = t.lines().collect();
    assert!(
        lines[0].contains("median of 2 steps after the first (warm-up)"),
        "{t}"
    );
    let rows: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("| "))
        .collect();
    assert_eq!(
        rows[0], "| kernel | launches/step | µs/step | share |",
        "{t}"
    );
    assert_eq!(rows[1], "| conv | 1 | 3000.0 | 75.0% |", "{t}");
    assert_eq!(rows[2], "| relu | 2 | 1000.0 | 25.0% |", "{t}");
    assert_eq!(rows[3], "| **step** | 3 | 4000.0 | 100% |", "{t}");
    assert!(lines.contains(&"|---|---:|---:|---:|"), "{t}");
}

#[test]
fn the_table_has_a_slot_for_a_prediction_by_kernel_id() {
    let mut a = accumulator();
    for step in [1, 2] {
        a.record(step, 0, 3.0);
        a.record(step, 1, 0.5);
        a.record(step, 1, 0.5);
    }
    // a model's seconds per launch: conv 1.5 ms, no prediction for relu
    let model = |id: usize| (id == 0).then_some(1.5e-3);
    let t = profile_table(&a.profile(), Some(&model));
    assert!(
        t.contains(
            "| kernel | launches/step | µs/step | share | predicted µs/step | measured/predicted |"
        ),
        "{t}"
    );
    assert!(
        t.contains("| conv | 1 | 3000.0 | 75.0% | 1500.0 | 2.00x |"),
        "{t}"
    );
    assert!(t.contains("| relu | 2 | 1000.0 | 25.0% | - | - |"), "{t}");
    assert!(
        t.contains("| **step** | 3 | 4000.0 | 100% | 1500.0 | 2.67x |"),
        "{t}"
    );
}

#[test]
fn fractional_launch_counts_keep_two_decimals() {
    let mut a = accumulator();
    a.record(1, 0, 1.0);
    for step in [2, 3, 4] {
        a.record(step, 0, 1.0);
    }
    a.record(4, 1, 1.0); // once in three steps
    let t = profile_table(&a.profile(), None);
    assert!(t.contains("| relu | 0.33 |"), "{t}");
}

fn plan(src: &str, clip: Option<ClipNormMethod>) -> Plan {
    let m = dmc_grammar::compile_source(src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    let opts = CompileOptions {
        mode: Mode::Train,
        clip_method: clip,
        ..CompileOptions::default()
    };
    compile(&m, &opts).expect("compile")
}

const NET: &str = "input x: [4, 4, 2]\ntarget y: int\n\
    out = x |> conv2d(4, 3) |> relu |> flatten |> dense(16, activation: relu) |> dense(3)\n\
    loss cross_entropy(out, y)\n";

#[test]
fn graph_segments_cut_at_the_loss_read_and_cover_each_pass() {
    let p = plan(
        &format!("{NET}train {{ batch: 2, optimizer: sgd(lr: 0.1) }}\n"),
        None,
    );
    let all: Vec<usize> = (0..p.steps.len()).collect();
    // without the halt: one segment, every step
    let one = segments(&p, RunPass::Whole, false);
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].steps, all);
    assert!(!one[0].check_loss);
    // with it: cut after every step that has the loss among its arguments, the loss read there
    let cut = segments(&p, RunPass::Whole, true);
    assert!(cut.len() >= 2, "{cut:?}");
    let flat: Vec<usize> = cut.iter().flat_map(|s| s.steps.clone()).collect();
    assert_eq!(flat, all, "the segments are the steps in order");
    for s in &cut {
        let last = *s.steps.last().expect("no empty segment");
        assert_eq!(s.check_loss, p.steps[last].args.contains(&p.loss));
    }
    assert!(cut[0].check_loss);
    let first_backward = cut[1].steps[0];
    assert!(
        first_backward > 0
            && p.steps[..first_backward]
                .iter()
                .any(|s| s.args.contains(&p.loss))
    );

    // clip_norm's two passes run different subsets of the steps: one set of segments each
    let two = plan(
        &format!("{NET}train {{ batch: 2, optimizer: sgd(lr: 0.1), clip_norm: 1.0 }}\n"),
        Some(ClipNormMethod::NormPass),
    );
    let steps_of = |pass| -> Vec<usize> {
        segments(&two, pass, true)
            .into_iter()
            .flat_map(|s| s.steps)
            .collect()
    };
    let (norm, update) = (steps_of(RunPass::Norm), steps_of(RunPass::Update));
    assert_ne!(norm, update);
    for (pass, steps) in [(RunPass::Norm, &norm), (RunPass::Update, &update)] {
        let want: Vec<usize> = (0..two.steps.len())
            .filter(|&s| two.runs_step(s, pass))
            .collect();
        assert_eq!(*steps, want, "{pass:?}");
    }
}

#[test]
fn the_cpu_backend_profiles_every_step_and_refuses_graphs() {
    let p = plan(
        &format!("{NET}train {{ batch: 2, optimizer: sgd(lr: 0.1) }}\n"),
        None,
    );
    let mut launches = vec![0u64; p.kernels.len()];
    for s in &p.steps {
        launches[s.kernel] += 1;
    }
    let mut be =
        dmc_runtime::open_backend(BackendKind::Cpu, p.clone(), &Default::default()).expect("cpu");
    assert!(be.profile().is_none(), "not profiling yet");
    be.set_profile(true).expect("the CPU backend profiles");
    be.init_params(1).expect("init");
    for step in 1..=3 {
        be.run(step, 0).expect("run");
    }
    let prof = be.profile().expect("profiling");
    assert_eq!(prof.steps, 2, "the two steps after the first");
    assert!(prof.warmup_excluded);
    assert!(prof.clock.contains("wall clock"), "{}", prof.clock);
    // every kernel that has steps, each launched as often as the plan runs it, per step
    let ran: Vec<usize> = prof.kernels.iter().map(|k| k.kernel).collect();
    let want: Vec<usize> = (0..p.kernels.len()).filter(|&k| launches[k] > 0).collect();
    assert_eq!(ran, want);
    for k in &prof.kernels {
        assert_eq!(k.launches, 2 * launches[k.kernel], "{}", k.name);
        assert_eq!(k.name, p.kernels[k.kernel].name);
        assert!(k.total_ms >= 0.0 && k.total_ms.is_finite());
    }
    assert!(be.set_cuda_graph(true).is_err());
}

#[test]
fn profile_runs_on_the_cpu_with_the_models_prediction_and_flags_off_cuda_are_refused() {
    let (rc, out, err) = dmc_env(
        &[
            "run",
            "examples/mlp.dm",
            "--steps",
            "2",
            "-q",
            "--device",
            "cpu",
            "--profile",
        ],
        &[("DMC_CPU_RATES", "nominal")],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("wall clock around each step"), "{out}");
    assert!(out.contains("predicted µs/step"), "{out}");
    assert!(
        out.contains("predicted: the CPU time model at nominal rates"),
        "{out}"
    );
    let (rc, _, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--steps",
        "1",
        "-q",
        "--device",
        "cuda-emu",
        "--profile",
    ]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("not on the CUDA emulator"), "{err}");
    assert!(err.contains("--loss-log"), "{err}");
    for device in ["cpu", "cuda-emu"] {
        let (rc, _, err) = dmc(&[
            "run",
            "examples/mlp.dm",
            "--steps",
            "1",
            "-q",
            "--device",
            device,
            "--cuda-graph",
        ]);
        assert_eq!(rc, 1, "{err}");
        assert!(
            err.contains("--cuda-graph replays the step as a CUDA graph and needs --device cuda"),
            "{err}"
        );
    }
    // --profile launches kernel by kernel: with --cuda-graph it is refused by the parser
    let (rc, _, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--device",
        "cpu",
        "--profile",
        "--cuda-graph",
    ]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}
