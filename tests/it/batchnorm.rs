//! Batchnorm end to end (parser -> compiler -> plan -> CPU backend) against an independent f64
//! reference written here from PyTorch's definition (no PyTorch or numpy on the test machines):
//! the training losses with batch statistics, the running statistics after several steps
//! (momentum, unbiased variance), the eval loss with the running statistics, and the running
//! statistics' round trip through a weights file into an eval backend.

use dmc_compiler::plan::{BufferKind, Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::{CpuBackend, InputData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SRC: &str = "input x: [3]
target y: [2]
p = x |> batchnorm(momentum: 0.2) |> dense(2)
loss mse(p, y)
train { batch: 4, optimizer: sgd(lr: 0.1), seed: 1 }
";
const B: usize = 4;
const C: usize = 3;
const O: usize = 2;
const MOMENTUM: f64 = 0.2;
const EPS: f64 = 1e-5;

fn plan(mode: Mode) -> Plan {
    let m = dmc_grammar::compile_source(SRC, "bn.dm").expect("program");
    let opts = CompileOptions {
        mode,
        verify: true,
        ..CompileOptions::default()
    };
    compile(&m, &opts).expect("plan")
}

fn batch(rng: &mut ChaCha8Rng) -> (Vec<f32>, Vec<f32>) {
    // inputs far from mean 0 / variance 1 (so the running statistics move visibly)
    let x = (0..B * C)
        .map(|i| rng.random_range(-1.0f32..3.0) * (1 + i % C) as f32)
        .collect();
    let y = (0..B * O).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    (x, y)
}

fn param(be: &CpuBackend, name: &str) -> Vec<f64> {
    be.param(name)
        .expect(name)
        .iter()
        .map(|&v| v as f64)
        .collect()
}

/// Per channel (mean, biased variance) of x[B, C].
fn batch_stats(x: &[f32]) -> Vec<(f64, f64)> {
    (0..C)
        .map(|c| {
            let m = (0..B).map(|n| x[n * C + c] as f64).sum::<f64>() / B as f64;
            let v = (0..B)
                .map(|n| (x[n * C + c] as f64 - m).powi(2))
                .sum::<f64>()
                / B as f64;
            (m, v)
        })
        .collect()
}

/// mse(dense(batchnorm(x)), y) with the given per-channel statistics and `be`'s parameters.
fn loss_ref(be: &CpuBackend, x: &[f32], y: &[f32], st: &[(f64, f64)]) -> f64 {
    let (g, b) = (
        param(be, "batchnorm_1.weight"),
        param(be, "batchnorm_1.bias"),
    );
    let (w, wb) = (param(be, "dense_1.weight"), param(be, "dense_1.bias"));
    let mut l = 0.0;
    for n in 0..B {
        let h: Vec<f64> = (0..C)
            .map(|c| (x[n * C + c] as f64 - st[c].0) / (st[c].1 + EPS).sqrt() * g[c] + b[c])
            .collect();
        for o in 0..O {
            let p = wb[o] + (0..C).map(|c| h[c] * w[c * O + o]).sum::<f64>();
            l += (p - y[n * O + o] as f64).powi(2);
        }
    }
    l / (B * O) as f64
}

fn feed(be: &mut CpuBackend, x: &[f32], y: &[f32]) {
    be.set_input("x", InputData::F32(x)).expect("x");
    be.set_input("y", InputData::F32(y)).expect("y");
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// Trains `steps` steps, checking each loss against the reference; returns the backend and the
/// reference running statistics.
fn train(steps: u64) -> (CpuBackend, Vec<f64>, Vec<f64>) {
    let mut be = CpuBackend::new(plan(Mode::Train)).expect("backend");
    be.init_params(1);
    // PyTorch's initial values
    assert_eq!(param(&be, "batchnorm_1.weight"), vec![1.0; C]);
    assert_eq!(param(&be, "batchnorm_1.bias"), vec![0.0; C]);
    assert_eq!(param(&be, "batchnorm_1.running_mean"), vec![0.0; C]);
    assert_eq!(param(&be, "batchnorm_1.running_var"), vec![1.0; C]);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (mut rm, mut rv) = (vec![0.0f64; C], vec![1.0f64; C]);
    for step in 1..=steps {
        let (x, y) = batch(&mut rng);
        let st = batch_stats(&x);
        let want = loss_ref(&be, &x, &y, &st);
        feed(&mut be, &x, &y);
        let got = be.run(step, 1).expect("step") as f64;
        assert!(
            rel(got, want) < 1e-5,
            "step {step}: loss {got} vs reference {want}"
        );
        for c in 0..C {
            rm[c] = (1.0 - MOMENTUM) * rm[c] + MOMENTUM * st[c].0;
            rv[c] = (1.0 - MOMENTUM) * rv[c] + MOMENTUM * st[c].1 * B as f64 / (B - 1) as f64;
        }
    }
    (be, rm, rv)
}

#[test]
fn losses_and_running_statistics_match_the_reference_after_several_steps() {
    let (be, rm, rv) = train(7);
    let (gm, gv) = (
        param(&be, "batchnorm_1.running_mean"),
        param(&be, "batchnorm_1.running_var"),
    );
    for c in 0..C {
        assert!(
            rel(gm[c], rm[c]) < 1e-6,
            "running_mean[{c}]: {} vs {}",
            gm[c],
            rm[c]
        );
        assert!(
            rel(gv[c], rv[c]) < 1e-6,
            "running_var[{c}]: {} vs {}",
            gv[c],
            rv[c]
        );
    }
    // they moved away from their initial values (the check is not vacuous)
    assert!(gv.iter().any(|v| (v - 1.0).abs() > 0.5), "{gv:?}");
    // no gradient, no optimizer state for them
    let p = be.plan();
    for b in p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::RunningStat)
    {
        assert!(b.persistent, "{}", b.name);
    }
    assert_eq!(
        p.buffers
            .iter()
            .filter(|b| b.kind == BufferKind::RunningStat)
            .count(),
        2
    );
    assert!(!p
        .buffers
        .iter()
        .any(|b| b.name.contains("running") && b.kind != BufferKind::RunningStat));
}

#[test]
fn eval_uses_the_running_statistics_saved_with_the_weights() {
    let (trained, rm, rv) = train(5);
    // through a weights file, as `run --save` and `eval --init` do
    let dir = std::env::temp_dir().join(format!("dmc-bn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("w.safetensors");
    let tensors: Vec<(String, Vec<usize>, &[f32])> = trained
        .params()
        .map(|(n, s, v)| (n.to_string(), s.to_vec(), v))
        .collect();
    assert!(tensors.iter().any(|t| t.0 == "batchnorm_1.running_var"));
    dmc_runtime::io::save_weights(&file, &tensors).expect("save");
    let mut ev = CpuBackend::new(plan(Mode::Eval)).expect("eval backend");
    // the eval plan expects the running statistics with the parameters
    let expected: Vec<(String, Vec<usize>)> = ev
        .plan()
        .params
        .iter()
        .map(|p| (p.name.clone(), p.shape.clone()))
        .collect();
    assert!(expected
        .iter()
        .any(|(n, _)| n == "batchnorm_1.running_mean"));
    let loaded = dmc_runtime::io::load_weights(&file, &expected).expect("load");
    for (name, data) in &loaded {
        ev.set_param(name, data).expect("set");
    }
    assert_eq!(
        param(&ev, "batchnorm_1.running_var"),
        param(&trained, "batchnorm_1.running_var")
    );
    let (x, y) = batch(&mut ChaCha8Rng::seed_from_u64(77));
    feed(&mut ev, &x, &y);
    let got = ev.run(1, 1).expect("eval") as f64;
    let running: Vec<(f64, f64)> = rm.iter().zip(&rv).map(|(&m, &v)| (m, v)).collect();
    let want = loss_ref(&ev, &x, &y, &running);
    assert!(rel(got, want) < 1e-5, "eval loss {got} vs reference {want}");
    // and not the batch statistics
    let with_batch = loss_ref(&ev, &x, &y, &batch_stats(&x));
    assert!(rel(got, with_batch) > 1e-2, "{got} vs {with_batch}");
    // eval does not touch the running statistics
    assert_eq!(
        param(&ev, "batchnorm_1.running_mean"),
        param(&trained, "batchnorm_1.running_mean")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
