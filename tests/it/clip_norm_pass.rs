//! `clip_norm` in two passes (`ClipNormMethod::NormPass`): a first run of the step that only sums
//! the global gradient norm, then the run that updates with it. Checked against the held-gradient
//! method (the reference: one run, every gradient held until the norm is summed) step by step on a
//! network with batchnorm (its running statistics must be updated once per step), dropout (both
//! runs must draw the same masks) and Adam (one `t` per step); its memory against the held method
//! and the unclipped step; the compiler's choice of it under a cap; and the training loop of
//! `dmc run` through it.

use dmc_compiler::error::CompileError;
use dmc_compiler::plan::{BufferKind, ClipNormMethod, Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::compare::Batch;
use dmc_runtime::{Backend, BackendKind, RunPass};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::common::dmc;

const NET: &str = "input x: [6, 6, 3]\ntarget y: int\n\
    out = x |> conv2d(6, 3) |> batchnorm |> relu |> dropout(0.25) |> flatten \
    |> dense(16, activation: tanh) |> dense(5)\n\
    loss cross_entropy(out, y)\n";

fn plan(train: &str, method: Option<ClipNormMethod>) -> Plan {
    let src = format!("{NET}train {{ batch: 4, {train} }}\n");
    let m = dmc_grammar::compile_source(&src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    let opts = CompileOptions {
        mode: Mode::Train,
        clip_method: method,
        ..CompileOptions::default()
    };
    compile(&m, &opts).expect("compile")
}

/// Every parameter, running statistic and optimizer state after each of `data.len()` steps, and
/// each step's loss: a norm-pass plan runs each step as its norm pass then its update pass, on
/// the same batch (fed again: the plan reuses input memory after the inputs' last reader).
fn train(kind: BackendKind, plan: Plan, data: &[Batch]) -> (Vec<Vec<Vec<f32>>>, Vec<f32>) {
    let two_pass = matches!(&plan.clip_norm, Some(c) if c.method == ClipNormMethod::NormPass);
    let mut be = dmc_runtime::open_backend(kind, plan, &Default::default()).expect("backend");
    be.init_params(11).expect("init");
    let (mut states, mut losses) = (vec![], vec![]);
    for (s, b) in data.iter().enumerate() {
        let step = s as u64 + 1;
        b.feed(|n, d| be.set_input(n, d)).expect("input");
        let l = if two_pass {
            be.set_run_pass(RunPass::Norm);
            let l = be.run(step, 3).expect("norm pass");
            b.feed(|n, d| be.set_input(n, d)).expect("input");
            be.set_run_pass(RunPass::Update);
            let again = be.run(step, 3).expect("update pass");
            assert_eq!(l, again, "both runs compute the same loss");
            l
        } else {
            be.run(step, 3).expect("step")
        };
        losses.push(l);
        let mut all: Vec<Vec<f32>> = be
            .params()
            .expect("params")
            .into_iter()
            .map(|p| p.2.to_vec())
            .collect();
        all.extend(
            be.opt_states()
                .expect("state")
                .into_iter()
                .map(|p| p.2.to_vec()),
        );
        states.push(all);
    }
    (states, losses)
}

fn max_rel_diff(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f32 {
    let mut worst = 0.0f32;
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert_eq!(x.len(), y.len());
        for (p, q) in x.iter().zip(y) {
            worst = worst.max((p - q).abs() / (1.0 + p.abs()));
        }
    }
    worst
}

fn norm_pass_trains_as_held_gradients(kind: BackendKind) {
    let train_block = "optimizer: adam(lr: 0.01), clip_norm: 0.05";
    let held = plan(train_block, Some(ClipNormMethod::HeldGradients));
    let lean = plan(train_block, Some(ClipNormMethod::NormPass));
    let c = lean
        .clip_norm
        .as_ref()
        .expect("the plan records the method");
    assert_eq!((c.method, c.extra_passes), (ClipNormMethod::NormPass, 1));
    assert_eq!(held.clip_norm.as_ref().map(|c| c.extra_passes), Some(0));
    // no gradient buffer: the persistent `GradAccum` buffers are the norm's two scalars
    let persistent_grads: Vec<&str> = lean
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::GradAccum)
        .map(|b| b.name.as_str())
        .collect();
    assert_eq!(
        persistent_grads,
        ["clip_norm.sq_norm_sum", "clip_norm.sq_norm"]
    );
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let data: Vec<Batch> = (0..4).map(|_| Batch::random(&held, &mut rng)).collect();
    let (want, want_loss) = train(kind, held, &data);
    let (got, got_loss) = train(kind, lean, &data);
    let d = max_rel_diff(&want, &got);
    assert!(
        d <= 2e-5,
        "{kind:?}: norm pass vs held gradients: max relative difference {d}"
    );
    for (a, b) in want_loss.iter().zip(&got_loss) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "loss {a} vs {b}");
    }
    // and the clipping is real: without it the same steps end elsewhere
    let (free, _) = train(kind, plan("optimizer: adam(lr: 0.01)", None), &data);
    let apart = max_rel_diff(&want, &free);
    assert!(
        apart > 100.0 * d.max(1e-6),
        "clip_norm 0.05 made no difference ({apart})"
    );
}

#[test]
fn the_norm_pass_trains_as_held_gradients_do_on_the_cpu() {
    norm_pass_trains_as_held_gradients(BackendKind::Cpu);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn the_norm_pass_trains_as_held_gradients_do_in_the_emulator() {
    norm_pass_trains_as_held_gradients(BackendKind::CudaEmu);
}

#[test]
fn a_norm_pass_plan_refuses_a_whole_run() {
    let lean = plan(
        "optimizer: sgd(lr: 0.1), clip_norm: 1.0",
        Some(ClipNormMethod::NormPass),
    );
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let b = Batch::random(&lean, &mut rng);
    let mut be =
        dmc_runtime::open_backend(BackendKind::Cpu, lean, &Default::default()).expect("backend");
    be.init_params(1).expect("init");
    let before: Vec<Vec<f32>> = be
        .params()
        .expect("params")
        .into_iter()
        .map(|p| p.2.to_vec())
        .collect();
    b.feed(|n, d| be.set_input(n, d)).expect("input");
    let e = be.run(1, 0).expect_err("a whole run of a two-pass plan");
    assert!(e.to_string().contains("two passes"), "{e}");
    be.set_run_pass(RunPass::Accumulate);
    assert!(be.run(1, 0).is_err(), "nor an accumulating run");
    let after: Vec<Vec<f32>> = be
        .params()
        .expect("params")
        .into_iter()
        .map(|p| p.2.to_vec())
        .collect();
    assert_eq!(before, after, "a refused run changes nothing");
    // and the passes mean nothing to a one-pass plan
    let held = plan("optimizer: sgd(lr: 0.1), clip_norm: 1.0", None);
    let mut be =
        dmc_runtime::open_backend(BackendKind::Cpu, held, &Default::default()).expect("backend");
    be.set_run_pass(RunPass::Norm);
    assert!(be.run(1, 0).is_err());
}

/// A network whose memory is its parameters (three 192x192 dense layers, batch 2), by method.
fn wide(clip: bool, opts: CompileOptions) -> Result<Plan, CompileError> {
    let src = format!(
        "input x: [192]\ntarget y: [192]\n\
         out = x |> dense(192, activation: relu) |> dense(192, activation: relu) |> dense(192)\n\
         loss mse(out, y)\ntrain {{ batch: 2, optimizer: sgd(lr: 0.01, momentum: 0.9){} }}\n",
        if clip { ", clip_norm: 1.0" } else { "" }
    );
    let m = dmc_grammar::compile_source(&src, "w.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    compile(&m, &opts)
}

#[test]
fn the_norm_pass_holds_no_gradients_and_is_chosen_when_held_ones_do_not_fit() {
    let forced = |method| CompileOptions {
        clip_method: Some(method),
        ..CompileOptions::default()
    };
    let held = wide(true, forced(ClipNormMethod::HeldGradients)).expect("held");
    let lean = wide(true, forced(ClipNormMethod::NormPass)).expect("norm pass");
    let unfused = wide(
        false,
        CompileOptions {
            fuse: false,
            ..CompileOptions::default()
        },
    )
    .expect("no clip");
    let params: u64 = held
        .params
        .iter()
        .map(|p| 4 * p.shape.iter().product::<usize>() as u64)
        .sum();
    let largest = held
        .params
        .iter()
        .map(|p| 4 * p.shape.iter().product::<usize>() as u64)
        .max()
        .unwrap_or(0);
    // held: every gradient at once; the norm pass: about one at a time, as an unclipped step
    // whose updates are not fused (within 2% of the parameters: a gradient lives until both its
    // norm link and its update have read it)
    assert!(
        held.arena_bytes >= lean.arena_bytes + (params - largest) * 9 / 10,
        "held {} B, norm pass {} B, parameters {params} B",
        held.arena_bytes,
        lean.arena_bytes
    );
    assert!(
        lean.arena_bytes <= unfused.arena_bytes + params / 50,
        "norm pass {} B, unclipped unfused {} B",
        lean.arena_bytes,
        unfused.arena_bytes
    );
    let c = lean.clip_norm.as_ref().expect("method");
    assert!(c.extra_bytes >= largest && c.extra_bytes < params, "{c:?}");
    // the second run repeats the forward and backward: more FLOPs than the held method's norm
    let hc = held.clip_norm.as_ref().expect("method");
    assert!(c.extra_flops > 3 * hc.extra_flops, "{c:?} vs {hc:?}");
    // the choice: held gradients without a cap, the norm pass under a cap they do not fit
    let capped = |cap| CompileOptions {
        cap: Some(cap),
        ..CompileOptions::default()
    };
    let free = wide(true, CompileOptions::default()).expect("no cap");
    assert_eq!(
        free.clip_norm.as_ref().map(|c| c.method),
        Some(ClipNormMethod::HeldGradients)
    );
    let fit = wide(true, capped(lean.arena_bytes)).expect("fits in two passes");
    assert_eq!(
        fit.clip_norm.as_ref().map(|c| c.method),
        Some(ClipNormMethod::NormPass)
    );
    assert!(fit.arena_bytes <= lean.arena_bytes);
    // a cap the held method meets keeps it
    let roomy = wide(true, capped(held.arena_bytes)).expect("fits held");
    assert_eq!(
        roomy.clip_norm.as_ref().map(|c| c.method),
        Some(ClipNormMethod::HeldGradients)
    );
    // below both: the error names the smaller cap that works (the norm pass's)
    match wide(true, capped(params / 2)) {
        Err(CompileError::CapExceeded { needed, .. }) => {
            assert!(needed <= lean.arena_bytes, "needed {needed}")
        }
        other => panic!(
            "expected CapExceeded, got {:?}",
            other.map(|p| p.arena_bytes)
        ),
    }
}

#[test]
fn dmc_run_trains_through_the_norm_pass_as_through_held_gradients() {
    let dir = tempfile::tempdir().expect("tempdir");
    let net = dir.path().join("n.dm");
    std::fs::write(
        &net,
        format!("{NET}train {{ batch: 4, optimizer: adam(lr: 0.01), clip_norm: 0.05 }}\n"),
    )
    .expect("write");
    let net = net.to_str().expect("utf-8");
    let log = |m: &str| {
        let f = dir.path().join(format!("{m}.log"));
        let f = f.to_str().expect("utf-8").to_string();
        let (rc, out, err) = dmc(&[
            "run",
            net,
            "--steps",
            "6",
            "--device",
            "cpu",
            "--clip-norm-method",
            m,
            "--loss-log",
            &f,
            "-q",
        ]);
        assert_eq!(rc, 0, "{m}: {out}{err}");
        let text = std::fs::read_to_string(&f).expect("loss log");
        text.lines()
            .map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .expect("loss")
                    .parse::<f32>()
                    .expect("f32")
            })
            .collect::<Vec<f32>>()
    };
    let (held, lean) = (log("held"), log("norm-pass"));
    assert_eq!(held.len(), 6);
    for (a, b) in held.iter().zip(&lean) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
            "{held:?} vs {lean:?}"
        );
    }
    // `dmc plan` reports the method and its cost
    let (rc, out, err) = dmc(&["plan", net, "--clip-norm-method", "norm-pass"]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("norm pass") && out.contains("1 extra forward/backward pass\n"),
        "{out}"
    );
    // accumulation holds the gradients anyway: two passes with it are refused, clearly
    let acc = dir.path().join("a.dm");
    std::fs::write(
        &acc,
        format!(
            "{NET}train {{ batch: 2, accumulate: 2, optimizer: sgd(lr: 0.1), clip_norm: 1 }}\n"
        ),
    )
    .expect("write");
    let (rc, _, err) = dmc(&[
        "plan",
        acc.to_str().expect("utf-8"),
        "--clip-norm-method",
        "norm-pass",
    ]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("accumulate") && err.contains("held"), "{err}");
    // a method for a program without clip_norm is refused, not ignored (auto stays quiet)
    let plain = dir.path().join("p.dm");
    std::fs::write(
        &plain,
        format!("{NET}train {{ batch: 2, optimizer: sgd(lr: 0.1) }}\n"),
    )
    .expect("write");
    let plain = plain.to_str().expect("utf-8");
    for method in ["held", "norm-pass"] {
        let (rc, _, err) = dmc(&["plan", plain, "--clip-norm-method", method]);
        assert_eq!(rc, 1, "{method}: {err}");
        assert!(
            err.contains("no clip_norm") && err.contains("clip_norm: 1.0"),
            "{err}"
        );
    }
    let (rc, _, err) = dmc(&["plan", plain, "--clip-norm-method", "auto"]);
    assert_eq!(rc, 0, "{err}");
}

/// A chain whose memory is its activations (so a cap is met by recomputation), by train block.
fn deep(train: &str, opts: &CompileOptions) -> Result<Plan, CompileError> {
    let src = format!(
        "input x: [48]\ntarget y: [48]\n\
         out = x |> repeat 6 {{ dense(48, activation: tanh) }}\n\
         loss mse(out, y)\ntrain {{ batch: 256, {train} }}\n"
    );
    let m = dmc_grammar::compile_source(&src, "d.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    compile(&m, opts)
}

#[test]
fn held_gradients_and_accumulation_are_rematerialized_under_a_cap_without_a_cycle() {
    // (was: "schedule: the kernel graph has a cycle": a recomputation waited for an update of
    // the stage after it, which waited for the norm of every gradient)
    for (train, method) in [
        (
            "optimizer: sgd(lr: 0.1), clip_norm: 0.5",
            Some(ClipNormMethod::HeldGradients),
        ),
        (
            "optimizer: sgd(lr: 0.1), clip_norm: 0.5",
            Some(ClipNormMethod::NormPass),
        ),
        ("optimizer: adam(lr: 0.01), accumulate: 2", None),
        (
            "optimizer: sgd(lr: 0.1), accumulate: 2, clip_norm: 0.5",
            None,
        ),
    ] {
        let base = CompileOptions {
            clip_method: method,
            // the cap met by recomputation, not by offloading activations or streaming Adam's
            // state through the arena
            offload: false,
            stream: false,
            ..CompileOptions::default()
        };
        let free = deep(train, &base).expect("no cap");
        let cap = free.arena_bytes * 9 / 10;
        let capped = deep(
            train,
            &CompileOptions {
                cap: Some(cap),
                ..base.clone()
            },
        )
        .unwrap_or_else(|e| panic!("{train} {method:?}: {e}"));
        assert!(capped.arena_bytes <= cap);
        assert!(
            capped.steps.iter().any(|s| s.label.contains("(recompute")),
            "{train}: the cap was met by recomputation"
        );
        assert_eq!(
            capped.clip_norm.as_ref().map(|c| c.method),
            free.clip_norm.as_ref().map(|c| c.method)
        );
        // recomputation repeats the same kernels: the same steps, bit for bit
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let data: Vec<Batch> = (0..2).map(|_| Batch::random(&free, &mut rng)).collect();
        if free.accumulate > 1 {
            continue; // (accumulation's numbers: clip_accumulate.rs; here the plan only)
        }
        let (want, wl) = train_plan(free, &data);
        let (got, gl) = train_plan(capped, &data);
        assert_eq!(wl, gl, "{train}");
        assert_eq!(want, got, "{train}");
    }
}

fn train_plan(plan: Plan, data: &[Batch]) -> (Vec<Vec<Vec<f32>>>, Vec<f32>) {
    train(BackendKind::Cpu, plan, data)
}
