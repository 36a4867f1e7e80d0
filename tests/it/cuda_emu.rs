//! The generated CUDA C, compiled by g++ against `codegen/templates/host/cuda_host.h` and run on the CPU
//! (`dmc_runtime::emu`), checked numerically without a GPU:
//!
//! * every kernel of every example (train and eval plans, the examples' batches and odd ones that
//!   leave partial tiles) and of the op zoo, at its planned offsets in a NaN-poisoned arena with red
//!   zones, against the CPU backend (rel err <= 1e-5), in forward and reversed thread order
//!   (bit-identical), with no byte written outside its outputs;
//! * whole training steps of mlp, resnet_small and a small deep_convnet through the emulated
//!   kernels only: the same losses and weights as the CPU backend after 3 steps;
//! * deliberately broken kernels (wrong index, missing barrier, unguarded partial tile, a barrier
//!   not every thread reaches) are caught.
//!
//! Every test that compiles a kernel needs g++ (`$DMC_CXX`, else `g++`): without it the test is
//! ignored (the build script probes for it, see `runtime/build/probe.rs`), unless `CI` is set,
//! where a missing compiler fails it.

use std::path::Path;

use crate::common;
use common::dmc_env;

use dmc_codegen::{render_kernel, render_plan, CodegenOptions};
use dmc_compiler::plan::{Kernel, Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::compare::Batch;
use dmc_runtime::emu::check::{
    check_compiled, check_kernel, check_kernels, check_plan, packed_site, site_in_plan, CheckRun,
    EmuCheck, KernelSite,
};
use dmc_runtime::emu::{compile_with, EmuBackend, Switch};
use dmc_runtime::{CpuBackend, HostArena, InputData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub(super) const TOL: f64 = 1e-5;

pub(super) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub(super) fn plan_of_source(src: &str, file: &str, mode: Mode, batch: Option<usize>) -> Plan {
    let model = dmc_grammar::compile_source(src, file).unwrap_or_else(|e| panic!("{file}: {e:?}"));
    let opts = CompileOptions {
        mode,
        batch,
        verify: true,
        ..Default::default()
    };
    compile(&model, &opts).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn plan_of(example: &str, mode: Mode, batch: Option<usize>) -> Plan {
    let path = root().join("examples").join(format!("{example}.dm"));
    let src = std::fs::read_to_string(&path).expect("read example");
    plan_of_source(&src, &path.display().to_string(), mode, batch)
}

pub(super) fn assert_all_ok(what: &str, checks: &[EmuCheck]) {
    assert!(!checks.is_empty(), "{what}: no kernels checked");
    let bad: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok(TOL))
        .map(|c| format!("  {} ({}): {}", c.kernel, c.kind, c.verdict(TOL)))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} kernels fail in the CUDA emulator:\n{}",
        bad.len(),
        checks.len(),
        bad.join("\n")
    );
}

fn check_example(example: &str, batch: Option<usize>) {
    for mode in [Mode::Train, Mode::Eval] {
        let plan = plan_of(example, mode, batch);
        let checks = check_plan(&plan, CheckRun::default()).expect("emulate");
        assert_all_ok(&format!("{example} {mode:?} batch {batch:?}"), &checks);
    }
}

/// A deep_convnet small enough to train through the emulator: odd, non-square images, odd batch.
const SMALL_DEEP_CONVNET: &str = "\
input  image: [13, 11, 3]
target label: int

logits = image
  |> conv2d(16, 3, activation: relu) as stem
  |> repeat 3 { conv2d(16, 3) |> relu }
  |> global_avgpool
  |> dense(10)

loss cross_entropy(logits, label)
train { batch: 3, optimizer: sgd(lr: 0.01, momentum: 0.9, weight_decay: 5e-4) }
";

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn every_mlp_kernel_matches_the_cpu_backend() {
    check_example("mlp", None);
    check_example("mlp", Some(5));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn every_resnet_small_kernel_matches_the_cpu_backend() {
    check_example("resnet_small", None);
    check_example("resnet_small", Some(3));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn every_deep_convnet_kernel_matches_the_cpu_backend() {
    check_example("deep_convnet", None);
    for mode in [Mode::Train, Mode::Eval] {
        let plan = plan_of_source(SMALL_DEEP_CONVNET, "small_deep_convnet.dm", mode, None);
        let checks = check_plan(&plan, CheckRun::default()).expect("emulate");
        assert_all_ok(&format!("small deep_convnet {mode:?}"), &checks);
    }
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn every_bn_cnn_kernel_matches_the_cpu_backend() {
    check_example("bn_cnn", None);
    check_example("bn_cnn", Some(3));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn bn_cnn_trains_through_emulated_kernels_like_the_cpu_backend() {
    // (the running statistics are among the compared weights)
    trains_like_the_cpu_backend("bn_cnn", plan_of("bn_cnn", Mode::Train, None));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn every_seed_kernel_matches_the_cpu_backend() {
    check_example("seed", None);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn every_op_zoo_kernel_matches_the_cpu_backend() {
    let zoo = dmc_codegen::zoo::zoo();
    for mode in [Mode::Train, Mode::Eval] {
        let checks = check_kernels(
            &zoo,
            mode,
            CheckRun {
                seed: 11,
                ..CheckRun::default()
            },
        )
        .expect("emulate");
        assert_all_ok(&format!("op zoo {mode:?}"), &checks);
    }
}

// ---- whole training steps through the emulated kernels -------------------------------------------

/// max |a - b| / max |b| over a tensor.
fn tensor_rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-30);
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs() / scale)
        .fold(0f64, |m, e| {
            if e.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(e)
            }
        })
}

/// Three training steps on the CPU backend and through the emulated CUDA kernels (an arena
/// poisoned with NaN), each with its own learning rate: the same loss at every step and the same
/// weights afterwards.
fn trains_like_the_cpu_backend(name: &str, plan: Plan) {
    trains_like_the_cpu_backend_within(name, plan, TOL, 0.0)
}

/// [`trains_like_the_cpu_backend`] with the losses and weights compared within `tol`, a weight's
/// error relative to the larger of its largest element and `floor` (for parameters that start at
/// zero, whose few small updates make any relative error of their gradient sums look large).
fn trains_like_the_cpu_backend_within(name: &str, plan: Plan, tol: f64, floor: f64) {
    let seed = 5;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let batches: Vec<_> = (0..3).map(|_| Batch::random(&plan, &mut rng)).collect();
    let base_lr = plan.optimizer.lr();
    let mut cpu = CpuBackend::new(plan.clone()).expect("cpu backend");
    let mut emu = EmuBackend::new(plan).expect("emulated backend");
    cpu.init_params(seed);
    emu.init_params(seed).expect("init");
    for (s, batch) in batches.iter().enumerate() {
        batch.feed(|n, d| cpu.set_input(n, d)).expect("cpu input");
        batch
            .feed(|n, d| emu.set_input(n, d))
            .expect("emulator input");
        // a different learning rate at every step, as a schedule gives (a launch argument)
        let lr = base_lr * [1.0, 0.5, 0.25][s % 3];
        cpu.set_learning_rate(lr);
        emu.set_learning_rate(lr);
        let lc = cpu.run(s as u64 + 1, seed).expect("cpu step");
        let le = emu.run(s as u64 + 1, seed).expect("emulated step");
        let e = ((lc - le).abs() / lc.abs().max(1e-30)) as f64;
        assert!(
            lc.is_finite() && e <= tol,
            "{name}: step {} loss {le} (emulated) vs {lc} (CPU): rel err {e:.2e}",
            s + 1
        );
    }
    let ep = emu.params().expect("params");
    let mut n = 0;
    for ((cn, _, cv), (en, _, ev)) in cpu.params().zip(&ep) {
        assert_eq!(cn, en);
        let top = cv.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        let e = tensor_rel_err(ev, cv) * top.max(1e-30) / top.max(floor).max(1e-30);
        assert!(
            e <= tol,
            "{name}: weight `{cn}` after 3 steps: rel err {e:.2e}"
        );
        n += 1;
    }
    assert!(n > 0, "{name}: no parameters compared");
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn mlp_trains_through_emulated_kernels_like_the_cpu_backend() {
    trains_like_the_cpu_backend("mlp", plan_of("mlp", Mode::Train, None));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn resnet_small_trains_through_emulated_kernels_like_the_cpu_backend() {
    trains_like_the_cpu_backend("resnet_small", plan_of("resnet_small", Mode::Train, None));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn small_deep_convnet_trains_through_emulated_kernels_like_the_cpu_backend() {
    let plan = plan_of_source(
        SMALL_DEEP_CONVNET,
        "small_deep_convnet.dm",
        Mode::Train,
        None,
    );
    trains_like_the_cpu_backend("small deep_convnet", plan);
}

/// The small deep_convnet on 32x32 images (batch 2): its weight gradients are split-K kernels
/// (the update in the reduction entry), trained through the emulator like the CPU backend with a
/// changing learning rate.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn split_k_weight_updates_train_like_the_cpu_backend() {
    let src = SMALL_DEEP_CONVNET
        .replace("[13, 11, 3]", "[32, 32, 3]")
        .replace("batch: 3", "batch: 2");
    let plan = plan_of_source(&src, "split_convnet.dm", Mode::Train, None);
    let split = render_plan(&plan, &CodegenOptions::default())
        .expect("render")
        .iter()
        .filter(|k| k.then.is_some() && k.name.contains("bwd_weight_update"))
        .count();
    assert!(split >= 2, "{split} split-K weight updates");
    trains_like_the_cpu_backend("split-K convnet", plan);
}

/// Layernorm over an image's channels and over a dense layer's features: every kernel of the
/// train and eval plans, then training, against the CPU backend.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_layernorm_net_trains_through_emulated_kernels_like_the_cpu_backend() {
    const SRC: &str = "input x: [5, 5, 3]
target y: [2]
h = x |> conv2d(6, 3, activation: relu) |> layernorm
out = h |> flatten |> dense(40) |> layernorm(eps: 1e-3) |> tanh |> dense(2)
loss mse(out, y)
train { batch: 3, optimizer: adam(lr: 0.01) }
";
    for mode in [Mode::Train, Mode::Eval] {
        let plan = plan_of_source(SRC, "layernorm.dm", mode, None);
        assert!(plan.kernels.iter().any(|k| k.op.kind_name() == "layernorm"));
        let checks = check_plan(&plan, CheckRun::default()).expect("emulate");
        assert_all_ok(&format!("layernorm {mode:?}"), &checks);
    }
    trains_like_the_cpu_backend(
        "layernorm",
        plan_of_source(SRC, "layernorm.dm", Mode::Train, None),
    );
}

/// Under a cap the plan recomputes forward stages and chunks the fused updates; without fusion
/// it keeps whole gradients and runs separate update kernels: the emulated kernels must still train
/// exactly like the CPU backend on those plans.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_transposed_convolution_net_trains_through_emulated_kernels_like_the_cpu_backend() {
    // an encoder-decoder: a strided convolution down, transposed convolutions back up (PyTorch's
    // 3x3/2 padding 1 output padding 1, and a grouped one), an image-shaped regression target
    const SRC: &str = "input x: [6, 6, 2]
target y: [6, 6, 2]
h = x |> conv2d(4, 3, stride: 2, padding: 1, activation: relu)
u = h |> conv_transpose2d(4, 3, stride: 2, padding: 1, output_padding: 1, activation: tanh)
out = u |> conv_transpose2d(2, 1, groups: 2)
loss mse(out, y)
train { batch: 2, optimizer: adam(lr: 0.01) }
";
    for mode in [Mode::Train, Mode::Eval] {
        let plan = plan_of_source(SRC, "transposed.dm", mode, None);
        assert!(plan
            .kernels
            .iter()
            .any(|k| k.op.kind_name() == "conv_transpose2d"));
        let checks = check_plan(&plan, CheckRun::default()).expect("emulate");
        assert_all_ok(&format!("transposed convolutions {mode:?}"), &checks);
    }
    trains_like_the_cpu_backend(
        "transposed convolutions",
        plan_of_source(SRC, "transposed.dm", Mode::Train, None),
    );
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn capped_remat_and_unfused_plans_train_through_emulated_kernels_like_the_cpu_backend() {
    let model =
        dmc_grammar::compile_source(SMALL_DEEP_CONVNET, "small_deep_convnet.dm").expect("parse");
    let opts = CompileOptions {
        verify: true,
        // recomputation under test, not streaming or offloading (tests/it/offload.rs)
        stream: false,
        ..Default::default()
    };
    let free = compile(&model, &opts).expect("compile").arena_bytes;
    // (a cap somewhat below its no-remat arena makes it recompute)
    let capped = (50..100)
        .filter_map(|pct| {
            let o = CompileOptions {
                cap: Some(free * pct / 100),
                ..opts.clone()
            };
            compile(&model, &o).ok()
        })
        .find(|p| p.steps.iter().any(|s| s.label.contains("(recompute")))
        .expect("a cap that recomputes");
    assert!(capped.arena_bytes < free);
    trains_like_the_cpu_backend("small deep_convnet under a cap", capped);
    let unfused = CompileOptions {
        fuse: false,
        ..opts.clone()
    };
    let path = root().join("examples/resnet_small.dm");
    let src = std::fs::read_to_string(&path).expect("read");
    let model = dmc_grammar::compile_source(&src, "resnet_small.dm").expect("parse");
    let plan = compile(&model, &unfused).expect("compile --no-fuse");
    assert!(plan
        .kernels
        .iter()
        .any(|k| k.op.kind_name() == "adam_update"));
    trains_like_the_cpu_backend("resnet_small --no-fuse", plan);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_nan_loss_halts_the_emulated_step_before_any_update() {
    let plan = plan_of("resnet_small", Mode::Train, None);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut batch = Batch::random(&plan, &mut rng);
    let mut emu = EmuBackend::new(plan).expect("emulated backend");
    emu.init_params(1).expect("init");
    emu.set_halt_on_nonfinite_loss(true);
    let before = emu.params().expect("params");
    batch.0[0].1[3] = f32::NAN;
    batch.feed(|n, d| emu.set_input(n, d)).expect("input");
    let l = emu.run(1, 1).expect("step");
    assert!(l.is_nan(), "{l}");
    assert_eq!(
        emu.params().expect("params"),
        before,
        "an update ran after a NaN loss"
    );
    // without the halt the NaN reaches the weights (so the check above can fail)
    emu.set_halt_on_nonfinite_loss(false);
    batch.feed(|n, d| emu.set_input(n, d)).expect("input");
    emu.run(1, 1).expect("step");
    let after = emu.params().expect("params");
    assert!(after.iter().any(|(_, _, v)| v.iter().any(|x| x.is_nan())));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn an_out_of_range_label_is_the_cpu_backends_error() {
    let plan = plan_of("mlp", Mode::Train, Some(5));
    let labels = [0, 3, 10, 1, 2];
    let image = vec![0.5f32; 5 * 784];
    let mut cpu = CpuBackend::new(plan.clone()).expect("cpu");
    cpu.init_params(1);
    cpu.set_input("image", InputData::F32(&image))
        .expect("image");
    cpu.set_input("label", InputData::I32(&labels))
        .expect("labels are read in the step");
    let want = cpu.run(1, 1).expect_err("bad label").to_string();
    let mut emu = EmuBackend::new(plan).expect("emulated");
    let got = emu
        .set_input("label", InputData::I32(&labels))
        .expect_err("bad label")
        .to_string();
    assert_eq!(got, want);
    assert!(
        got.contains("index 10 of row 2 is outside 0..10 (a class label"),
        "{got}"
    );
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn poison_mode_changes_nothing_in_a_correct_plan() {
    for example in ["mlp", "resnet_small"] {
        let plan = plan_of(example, Mode::Train, None);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let batches: Vec<_> = (0..2).map(|_| Batch::random(&plan, &mut rng)).collect();
        let mut runs = Vec::new();
        for poison in [false, true] {
            let mut emu = EmuBackend::new(plan.clone()).expect("emulated");
            emu.set_poison(poison);
            emu.init_params(2).expect("init");
            let mut losses = Vec::new();
            for (s, b) in batches.iter().enumerate() {
                b.feed(|n, d| emu.set_input(n, d)).expect("input");
                losses.push(emu.run(s as u64 + 1, 2).expect("step"));
            }
            runs.push((losses, emu.params().expect("params")));
        }
        assert!(
            runs[0].0.iter().all(|l| l.is_finite()),
            "{example}: {:?}",
            runs[0].0
        );
        assert_eq!(
            runs[0], runs[1],
            "{example}: poison mode changed the results"
        );
    }
}

// ---- deliberately broken kernels are caught -------------------------------------------------------

/// mlp's training step at batch 5: its first dense kernel has a 5 x 256 output (a partial 64-row
/// tile) and 49 k-tiles; its loss gradient has one thread per row (5 of a 256-thread block).
fn mlp5() -> Plan {
    plan_of("mlp", Mode::Train, Some(5))
}

/// Checks the first kernel of `kind` in `kernels` (at `site`, or where `plan` launches it) with
/// the `nth` occurrence of `from` in its source replaced by `to` (`from` must occur).
fn check_edited(plan: &Plan, kind: &str, from: &str, to: &str, nth: usize) -> EmuCheck {
    check_edited_with(plan, kind, (from, to, nth), &CodegenOptions::default())
}

/// As [`check_edited`], rendered with `opts`.
fn check_edited_with(
    plan: &Plan,
    kind: &str,
    (from, to, nth): (&str, &str, usize),
    opts: &CodegenOptions,
) -> EmuCheck {
    let k = plan
        .kernels
        .iter()
        .find(|k| k.op.kind_name() == kind)
        .unwrap_or_else(|| panic!("no {kind} kernel"));
    let site = site_in_plan(plan, k.id).expect("launched by a step");
    check_edited_at_with(k, plan.mode, &site, (from, to, nth), opts)
}

fn check_edited_at(
    k: &Kernel,
    mode: Mode,
    site: &KernelSite,
    from: &str,
    to: &str,
    nth: usize,
) -> EmuCheck {
    check_edited_at_with(k, mode, site, (from, to, nth), &CodegenOptions::default())
}

pub(super) fn check_edited_at_with(
    k: &Kernel,
    mode: Mode,
    site: &KernelSite,
    (from, to, nth): (&str, &str, usize),
    opts: &CodegenOptions,
) -> EmuCheck {
    let ck = render_kernel(k, mode, opts)
        .expect("render")
        .expect("kernel");
    let hits: Vec<usize> = ck.source.match_indices(from).map(|(i, _)| i).collect();
    assert!(
        hits.len() > nth,
        "`{from}` occurs {} times in:\n{}",
        hits.len(),
        ck.source
    );
    let mut edited = ck.clone();
    let at = hits[nth];
    edited.source = format!("{}{to}{}", &ck.source[..at], &ck.source[at + from.len()..]);
    let c = check_kernel(k, mode, &edited, site, CheckRun::default()).expect("emulate");
    eprintln!("{} with `{from}` -> `{to}`: {}", k.name, c.verdict(TOL));
    c
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn the_unedited_kernels_pass_every_check() {
    let plan = mlp5();
    for kind in ["dense", "cross_entropy_loss_bwd"] {
        let c = check_edited(&plan, kind, "{", "{", 0);
        assert!(c.ok(TOL), "{kind}: {}", c.verdict(TOL));
    }
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_wrong_index_is_caught() {
    // w read transposed: in bounds, wrong values
    let c = check_edited(
        &mlp5(),
        "dense",
        "(w + (k) * MOUT + (n))",
        "(w + (n) * MOUT + (k))",
        0,
    );
    assert!(!c.ok(TOL), "a transposed read passed: {c:?}");
    assert!(c.rel_err > 1e-2, "{c:?}");
    assert!(c.race.is_none() && c.stray.is_none(), "{c:?}");
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_missing_barrier_is_caught_as_a_race() {
    let plan = mlp5();
    // tiles staged through registers (no cp.async): two barriers per k-tile
    let regs = CodegenOptions {
        copy_async: false,
        ..CodegenOptions::default()
    };
    // the barrier after the multiply: the next tile's loads overwrite what others still read
    let c = check_edited_with(&plan, "dense", ("__syncthreads();", "", 1), &regs);
    assert!(
        c.race.as_deref().unwrap_or("").contains("__syncthreads"),
        "{c:?}"
    );
    // the barrier after the loads: threads multiply a tile others have not loaded yet
    let c = check_edited_with(&plan, "dense", ("__syncthreads();", "", 0), &regs);
    assert!(c.race.is_some() && !c.ok(TOL), "{c:?}");
    // cp.async stages: the one barrier per k-tile (after the wait) gone, threads multiply a stage
    // others' copies have not landed in, and overwrite one others still read
    let (k, site, opts) = super::cuda_emu_gemm::staged_kernel();
    let c = check_edited_at_with(&k, Mode::Train, &site, ("__syncthreads();", "", 0), &opts);
    assert!(!c.ok(TOL), "{c:?}");
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn an_unguarded_partial_tile_is_caught_as_a_stray_write() {
    let plan = mlp5();
    let c = check_edited(
        &plan,
        "dense",
        "if (m < GM && n < GN) STORE(m, n, acc[i][j]);",
        "STORE(m, n, acc[i][j]);",
        0,
    );
    assert!(c.stray.is_some(), "no stray write reported: {c:?}");
    // a one-thread-per-row kernel without its bounds check writes rows past the end
    let c = check_edited(
        &plan,
        "cross_entropy_loss_bwd",
        "if (i >= ROWS) return;",
        "",
        0,
    );
    assert!(c.stray.is_some(), "{c:?}");
    // relu in place past the end leaves NaN as NaN: the gap's other words (-1e30) still change
    let zoo = dmc_codegen::zoo::zoo();
    let k = zoo
        .iter()
        .find(|k| k.op.kind_name() == "relu_inplace")
        .expect("an in-place relu in the zoo");
    let site = packed_site(k);
    let c = check_edited_at(k, Mode::Train, &site, "if (i >= NUMEL) return;", "", 0);
    assert!(c.stray.is_some(), "{c:?}");
    let c = check_edited_at(k, Mode::Train, &site, "{", "{", 0);
    assert!(c.ok(TOL), "{}", c.verdict(TOL));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_barrier_not_every_thread_reaches_is_caught() {
    let plan = mlp5();
    let tid = "const int tid = threadIdx.x;";
    let c = check_edited(
        &plan,
        "dense",
        tid,
        &format!("{tid}\n    if (tid == 5) return;"),
        0,
    );
    let f = c.failure.clone().unwrap_or_default();
    assert!(f.contains("divergent __syncthreads()"), "{c:?}");
    // a barrier inside a branch only some threads take
    let branch =
        "if (tid % 2) {\n        __syncthreads();\n    } else {\n        __syncthreads();\n    }";
    let c = check_edited(&plan, "dense", "__syncthreads();", branch, 0);
    let f = c.failure.clone().unwrap_or_default();
    assert!(
        f.contains("divergent __syncthreads()") && f.contains("line"),
        "{c:?}"
    );
}

// ---- the CLI ---------------------------------------------------------------------------------------

pub(super) fn final_loss(output: &str) -> String {
    let i = output
        .find("final loss ")
        .unwrap_or_else(|| panic!("no final loss in:\n{output}"));
    output[i + 11..].split(',').next().unwrap_or("").to_string()
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn run_on_the_cuda_emulator_trains_like_the_cpu() {
    let args = [
        "run",
        "examples/resnet_small.dm",
        "--steps",
        "3",
        "--seed",
        "3",
    ];
    let (rc, out, err) = dmc_env(&[&args[..], &["--device", "cpu"]].concat(), &[]);
    assert_eq!(rc, 0, "{err}");
    let cpu = out + &err;
    let (rc, out, err) = dmc_env(&[&args[..], &["--device", "cuda-emu"]].concat(), &[]);
    assert_eq!(rc, 0, "{err}");
    let emu = out + &err;
    assert_eq!(
        final_loss(&emu),
        final_loss(&cpu),
        "cpu:\n{cpu}\nemulator:\n{emu}"
    );
}

#[test]
fn a_missing_cxx_compiler_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().display().to_string();
    let (rc, _, err) = dmc_env(
        &[
            "run",
            "examples/mlp.dm",
            "--steps",
            "1",
            "--device",
            "cuda-emu",
        ],
        &[("DMC_CXX", "/nonexistent/g++"), ("DMC_CACHE_DIR", &cache)],
    );
    assert_ne!(rc, 0);
    assert!(
        err.contains("/nonexistent/g++") && err.contains("DMC_CXX"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn the_ucontext_fallback_switch_gives_the_same_results() {
    // the fallback for other architectures, forced here: the GEMM (barriers every k-tile) and a
    // reduction (a barrier tree) must pass every check with it too
    let plan = plan_of("mlp", Mode::Train, Some(5));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut n = 0;
    for k in &plan.kernels {
        if !matches!(k.op.kind_name(), "dense" | "cross_entropy_loss") {
            continue;
        }
        let ck = render_kernel(k, plan.mode, &CodegenOptions::default())
            .expect("render")
            .expect("kernel");
        let emu = compile_with(&ck, dir.path(), Switch::Ucontext).expect("compile");
        let src = std::fs::read_to_string(emu.path.with_extension("cpp")).expect("source");
        assert!(src.contains("DMC_ASM_SWITCH"));
        let site = site_in_plan(&plan, k.id).expect("site");
        let c = check_compiled(k, plan.mode, &emu, &site, CheckRun::default()).expect("emulate");
        assert!(c.ok(TOL), "{}: {}", k.name, c.verdict(TOL));
        n += 1;
    }
    assert!(n >= 2);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn emu_check_prints_one_line_per_kernel_and_a_summary() {
    let (rc, out, err) = dmc_env(&["emu-check", "examples/mlp.dm", "--batch", "5"], &[]);
    assert_eq!(rc, 0, "{out}{err}");
    let plan = plan_of("mlp", Mode::Train, Some(5));
    let kernels = render_plan(&plan, &CodegenOptions::default())
        .expect("render")
        .len();
    let ok_lines = out
        .lines()
        .filter(|l| l.contains(" ok (max rel err"))
        .count();
    assert_eq!(ok_lines, kernels, "{out}");
    assert!(
        out.contains(&format!("{kernels} kernels of the Train step")),
        "{out}"
    );
    assert!(out.contains("0 failed"), "{out}");
    let (rc, _, err) = dmc_env(&["emu-check", "examples/nope.dm"], &[]);
    assert_ne!(rc, 0);
    assert!(err.contains("nope.dm"), "{err}");
}

/// The issue-15 examples (ResNet-18, MobileNet, UNet): every kernel of their train and eval plans
/// against the CPU backend, at small batches (the emulator is slow), and the UNet (transposed
/// convolutions, concat, batchnorm) trained through the emulated kernels.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn every_resnet18_mobilenet_and_unet_kernel_matches_the_cpu_backend() {
    check_example("resnet18", Some(1));
    check_example("mobilenet", Some(2));
    check_example("unet", Some(2));
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn unet_trains_through_emulated_kernels_like_the_cpu_backend() {
    // With SGD: Adam's first steps move each weight by about `lr * sign(g)`, so a gradient near 0
    // (a batchnorm bias) turns rounding differences of 1e-7 into weight differences of 1e-4.
    let path = root().join("examples").join("unet.dm");
    let src = std::fs::read_to_string(&path)
        .expect("read example")
        .replace("adam(lr: 1e-3)", "sgd(lr: 0.01, momentum: 0.9)");
    assert!(
        src.contains("sgd("),
        "unet.dm's optimizer changed: update this test"
    );
    // With the GPU's split-K weight gradients unet drifts from the CPU at step 3: the convolutions'
    // weights by up to 6.4e-5 of their largest, the batchnorm biases (zero at first, at most 7e-4
    // after 3 steps) by 1e-6 absolute. Not a kernel's error: from the same state after step 2,
    // every one of step 3's kernel outputs agrees between split and unsplit kernels within 4e-7;
    // step 3 amplifies the states' 2e-6 differences after a change of learning rate with momentum
    // (unsplit, a constant rate, plain SGD, or a convnet without batchnorm stay within 3e-6:
    // `split_k_weight_updates_train_like_...`). So the weights are compared within 1e-4 of the
    // larger of their largest element and 0.1.
    let plan = plan_of_source(&src, "unet.dm", Mode::Train, Some(2));
    trains_like_the_cpu_backend_within("unet", plan, 1e-4, 0.1);
}

/// A weighted sum of losses over two heads (a regression head read by two terms, a classifier):
/// every kernel of the train and eval plans (the weighted loss kernels and their gradients), then
/// training, against the CPU backend.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_weighted_loss_trains_through_emulated_kernels_like_the_cpu_backend() {
    const SRC: &str = "input x: [6]
target r: [3]
target label: int
h = x |> dense(8, activation: tanh)
recon = h |> dense(3)
logits = h |> dense(4)
loss 0.3 * mse(recon, r) + 0.5 * huber(recon, r, delta: 0.25) + 1.75 * cross_entropy(logits, label, label_smoothing: 0.1)
train { batch: 3, optimizer: sgd(lr: 0.1, momentum: 0.9) }
";
    for mode in [Mode::Train, Mode::Eval] {
        let plan = plan_of_source(SRC, "weighted.dm", mode, None);
        let weighted = plan
            .kernels
            .iter()
            .filter(|k| matches!(&k.op, dmc_compiler::op::Op::Loss(l) if l.weight() != 1.0))
            .count();
        assert_eq!(
            weighted,
            if mode == Mode::Train { 6 } else { 3 },
            "{mode:?}"
        );
        let checks = check_plan(&plan, CheckRun::default()).expect("emulate");
        assert_all_ok(&format!("weighted loss {mode:?}"), &checks);
    }
    trains_like_the_cpu_backend(
        "weighted loss",
        plan_of_source(SRC, "weighted.dm", Mode::Train, None),
    );
}
