//! Learning-rate schedules through the runtime: a backend told a learning rate with
//! `set_learning_rate` trains exactly (bit for bit) as the plan compiled with that rate does, for
//! every optimizer, fused and unfused, on the CPU and through the emulated CUDA kernels (so no
//! kernel bakes a rate in); `dmc run` applies the program's schedule and reports it.

use crate::common;

use common::dmc;
use dmc_compiler::plan::{LearningRate, Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::compare::Batch;
use dmc_runtime::{Backend, BackendKind};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const OPTIMIZERS: &[&str] = &[
    "sgd(lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.01)",
    "adam(lr: 0.01, weight_decay: 0.01)",
    "adamw(lr: 0.01)",
    "rmsprop(lr: 0.01, momentum: 0.5)",
    "lion(lr: 0.001, weight_decay: 0.1)",
];

fn plan(optimizer: &str, lr: Option<f64>, fuse: bool) -> Plan {
    let src = format!(
        "input x: [6, 6, 2]\ntarget y: [3]\n\
         out = x |> conv2d(4, 3, activation: relu) |> flatten |> dense(3)\n\
         loss mse(out, y)\ntrain {{ batch: 2, optimizer: {optimizer} }}\n"
    );
    let m = dmc_grammar::compile_source(&src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    let opts = CompileOptions {
        mode: Mode::Train,
        lr: lr.map(|v| LearningRate::new(v).expect("lr")),
        fuse,
        ..CompileOptions::default()
    };
    compile(&m, &opts).expect("compile")
}

/// Weights and optimizer state after three steps of `plan` on `kind`, the learning rate of each
/// step set to `lrs[step]` when given.
fn train(kind: BackendKind, plan: Plan, lrs: Option<&[f32]>) -> Vec<Vec<f32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let batches: Vec<_> = (0..3).map(|_| Batch::random(&plan, &mut rng)).collect();
    let mut be = dmc_runtime::open_backend(kind, plan, &Default::default()).expect("backend");
    be.init_params(4).expect("init");
    for (s, b) in batches.iter().enumerate() {
        b.feed(|n, d| be.set_input(n, d)).expect("input");
        if let Some(lrs) = lrs {
            be.set_learning_rate(lrs[s]);
        }
        let loss = be.run(s as u64 + 1, 4).expect("step");
        assert!(loss.is_finite());
    }
    let mut out: Vec<Vec<f32>> = be
        .params()
        .expect("params")
        .into_iter()
        .map(|p| p.2.to_vec())
        .collect();
    out.extend(
        be.opt_states()
            .expect("state")
            .into_iter()
            .map(|p| p.2.to_vec()),
    );
    out
}

fn set_rate_is_the_compiled_rate(kind: BackendKind) {
    for opt in OPTIMIZERS {
        for fuse in [true, false] {
            let compiled = plan(opt, None, fuse);
            let base = compiled.optimizer.lr();
            let half = base * 0.5;
            let want = train(kind, plan(opt, Some(half as f64), fuse), None);
            // compiled with the base rate, told half of it at every step
            let got = train(kind, compiled.clone(), Some(&[half; 3]));
            assert!(got == want, "{opt} (fuse {fuse}): set_learning_rate({half}) differs from a plan compiled with it");
            let untouched = train(kind, compiled, None);
            assert!(
                untouched != want,
                "{opt} (fuse {fuse}): the rate made no difference"
            );
        }
    }
}

#[test]
fn set_learning_rate_trains_as_the_plan_compiled_with_that_rate_on_the_cpu() {
    set_rate_is_the_compiled_rate(BackendKind::Cpu);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn set_learning_rate_trains_as_the_plan_compiled_with_that_rate_in_the_emulator() {
    set_rate_is_the_compiled_rate(BackendKind::CudaEmu);
}

#[test]
fn the_kernels_take_the_rate_as_an_argument_and_bake_none_in() {
    // Two plans that differ only in their learning rate render the same kernels.
    for opt in OPTIMIZERS {
        let a =
            dmc_codegen::render_plan(&plan(opt, None, true), &Default::default()).expect("render");
        let b = dmc_codegen::render_plan(&plan(opt, Some(0.123), true), &Default::default())
            .expect("render");
        assert_eq!(a.len(), b.len());
        for (ka, kb) in a.iter().zip(&b) {
            assert_eq!(
                ka.source, kb.source,
                "{opt}: kernel {} depends on the rate",
                ka.name
            );
            assert_eq!(ka.params.last().map(|p| p.name.as_str()), Some("lr"));
        }
    }
}

fn write(dir: &std::path::Path, name: &str, schedule: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "input x: [8]\ntarget y: [2]\nout = x |> dense(8, activation: tanh) |> dense(2)\n\
             loss mse(out, y)\ntrain {{ batch: 4, optimizer: sgd(lr: 0.1){schedule} }}\n"
        ),
    )
    .expect("write");
    p
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn dmc_run_follows_the_schedule_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |file: &std::path::Path, out: &str, extra: &[&str]| -> (Vec<u8>, String) {
        let w = dir.path().join(out);
        let args = [
            &[
                "run",
                s(file),
                "--synthetic-samples",
                "32",
                "--steps",
                "12",
                "--save",
                s(&w),
                "--seed",
                "3",
            ][..],
            extra,
        ]
        .concat();
        let (code, o, e) = dmc(&args);
        assert_eq!(code, 0, "{args:?}\n{o}\n{e}");
        (std::fs::read(&w).expect("weights"), e)
    };
    let constant = write(dir.path(), "c.dm", "");
    let late = write(
        dir.path(),
        "late.dm",
        ", schedule: step(every: 1000, gamma: 0.5)",
    );
    let cosine = write(dir.path(), "cos.dm", ", schedule: cosine(warmup: 3)");
    let (wc, ec) = run(&constant, "c.safetensors", &[]);
    assert!(!ec.contains("schedule"), "{ec}");
    // a decay that starts after the run is the constant rate, bit for bit
    let (wl, el) = run(&late, "l.safetensors", &[]);
    assert_eq!(wc, wl);
    assert!(
        el.contains("learning rate 0.1 (schedule: x0.5 every 1000 steps)"),
        "{el}"
    );
    let (wcos, ecos) = run(&cosine, "cos.safetensors", &[]);
    assert_ne!(wc, wcos);
    assert!(
        ecos.contains("cosine over the run to 0, after 3 linear warmup steps"),
        "{ecos}"
    );
    // --lr moves the base of the schedule
    let (wlr, _) = run(&cosine, "cos2.safetensors", &["--lr", "0.05"]);
    assert_ne!(wlr, wcos);
    // a decay over the run needs a step after its warmup
    let short = write(dir.path(), "short.dm", ", schedule: cosine(warmup: 20)");
    let (code, _, e) = dmc(&[
        "run",
        s(&short),
        "--synthetic-samples",
        "32",
        "--steps",
        "12",
        "-q",
    ]);
    assert_eq!(code, 1, "{e}");
    assert!(
        e.contains("warmup of 20 steps leaves none of the 12 steps") && e.contains("raise --steps"),
        "{e}"
    );
}
