//! Whole training runs (parser -> compiler -> plan -> CPU backend) of a tiny dense network with
//! each loss and optimizer added with them (mae, huber, bce_with_logits, label-smoothed
//! cross-entropy; RMSprop with and without momentum, Lion): the losses of the first steps and the
//! weights after them equal an independent f64 re-implementation of the same network, loss and
//! update written in this file.

use dmc_compiler::plan::Mode;
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::{CpuBackend, InputData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const N: usize = 4; // batch
const I: usize = 5; // inputs
const U: usize = 3; // outputs
const STEPS: u64 = 4;

/// The loss of a batch of outputs `y[N*U]` against float targets or labels, and its gradient.
#[derive(Clone, Copy)]
enum Loss {
    Mse,
    Mae,
    Huber(f64),
    Bce,
    CrossEntropy(f64),
}

/// The optimizer, with its state per weight.
#[derive(Clone, Copy)]
enum Opt {
    Sgd(f64),
    RmsProp {
        lr: f64,
        alpha: f64,
        eps: f64,
        wd: f64,
        momentum: f64,
    },
    Lion {
        lr: f64,
        b1: f64,
        b2: f64,
        wd: f64,
    },
}

fn loss_and_grad(l: Loss, y: &[f64], t: &[f64], labels: &[i32]) -> (f64, Vec<f64>) {
    let m = y.len() as f64;
    let mut g = vec![0.0; y.len()];
    let mut total = 0.0;
    match l {
        Loss::CrossEntropy(e) => {
            for n in 0..N {
                let row = &y[n * U..(n + 1) * U];
                let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = row.iter().map(|v| (v - mx).exp()).sum();
                for j in 0..U {
                    let p = (row[j] - mx).exp() / z;
                    let q = if j as i32 == labels[n] { 1.0 - e } else { 0.0 } + e / U as f64;
                    total -= q * p.ln();
                    g[n * U + j] = (p - q) / N as f64;
                }
            }
            (total / N as f64, g)
        }
        _ => {
            for k in 0..y.len() {
                let (x, tt) = (y[k], t[k]);
                let d = x - tt;
                let (v, dv) = match l {
                    Loss::Mse => (d * d, 2.0 * d),
                    Loss::Mae => (d.abs(), d.signum()),
                    Loss::Huber(delta) if d.abs() <= delta => (0.5 * d * d, d),
                    Loss::Huber(delta) => (delta * (d.abs() - 0.5 * delta), delta * d.signum()),
                    Loss::Bce => {
                        let s = 1.0 / (1.0 + (-x).exp());
                        (-(tt * s.ln() + (1.0 - tt) * (1.0 - s).ln()), s - tt)
                    }
                    Loss::CrossEntropy(_) => (0.0, 0.0),
                };
                total += v;
                g[k] = dv / m;
            }
            (total / m, g)
        }
    }
}

/// One update of weights `w` with gradient `g` and state `s1`, `s2`.
fn update(o: Opt, w: &mut [f64], g: &[f64], s1: &mut [f64], s2: &mut [f64]) {
    for k in 0..w.len() {
        match o {
            Opt::Sgd(lr) => w[k] -= lr * g[k],
            Opt::RmsProp {
                lr,
                alpha,
                eps,
                wd,
                momentum,
            } => {
                let gk = g[k] + wd * w[k];
                s1[k] = alpha * s1[k] + (1.0 - alpha) * gk * gk;
                let avg = s1[k].sqrt() + eps;
                if momentum != 0.0 {
                    s2[k] = momentum * s2[k] + gk / avg;
                    w[k] -= lr * s2[k];
                } else {
                    w[k] -= lr * gk / avg;
                }
            }
            Opt::Lion { lr, b1, b2, wd } => {
                w[k] *= 1.0 - lr * wd;
                let c = b1 * s1[k] + (1.0 - b1) * g[k];
                let sign = if c > 0.0 {
                    1.0
                } else if c < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                w[k] -= lr * sign;
                s1[k] = b2 * s1[k] + (1.0 - b2) * g[k];
            }
        }
    }
}

/// Trains `dense(U)` on one fixed batch for [`STEPS`] steps with the program's `loss_stmt` and
/// `optimizer`, and the same in f64; the losses and final weights must agree.
fn check(loss_stmt: &str, optimizer: &str, l: Loss, o: Opt) {
    check_scheduled(loss_stmt, optimizer, "", &|_| 1.0, l, o);
}

impl Opt {
    /// The optimizer with its learning rate multiplied by `f`.
    fn scaled(self, f: f64) -> Opt {
        match self {
            Opt::Sgd(lr) => Opt::Sgd(lr * f),
            Opt::RmsProp {
                lr,
                alpha,
                eps,
                wd,
                momentum,
            } => Opt::RmsProp {
                lr: lr * f,
                alpha,
                eps,
                wd,
                momentum,
            },
            Opt::Lion { lr, b1, b2, wd } => Opt::Lion {
                lr: lr * f,
                b1,
                b2,
                wd,
            },
        }
    }
}

/// [`check`] with `train { schedule }` set to `schedule` (empty: none), the CPU backend given
/// each step's rate from the plan's schedule as `dmc run` does, and the reference the rate
/// `factor(step)` times the optimizer's.
fn check_scheduled(
    loss_stmt: &str,
    optimizer: &str,
    schedule: &str,
    factor: &dyn Fn(u64) -> f64,
    l: Loss,
    o: Opt,
) {
    let labels_target = matches!(l, Loss::CrossEntropy(_));
    let target_decl = if labels_target {
        "target y: int".to_string()
    } else {
        format!("target y: [{U}]")
    };
    let src = format!(
        "input x: [{I}]\n{target_decl}\nout = x |> dense({U})\nloss {loss_stmt}\ntrain {{ batch: {N}, optimizer: {optimizer}{schedule} }}\n"
    );
    let m = dmc_grammar::compile_source(&src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    let opts = CompileOptions {
        mode: Mode::Train,
        verify: true,
        ..CompileOptions::default()
    };
    let plan = compile(&m, &opts).expect("compile");
    let (lr_schedule, base_lr) = (plan.schedule, plan.optimizer.lr());
    let mut be = CpuBackend::new(plan).expect("backend");
    be.init_params(3);
    let mut r = ChaCha8Rng::seed_from_u64(9);
    let x: Vec<f32> = (0..N * I).map(|_| r.random_range(-1.0..1.0)).collect();
    let t: Vec<f32> = (0..N * U)
        .map(|_| match l {
            Loss::Bce => f32::from(r.random_bool(0.5)) * 0.8 + 0.1,
            _ => r.random_range(-1.0..1.0),
        })
        .collect();
    let labels: Vec<i32> = (0..N).map(|_| r.random_range(0..U as i32)).collect();
    let (mut w, mut b): (Vec<f64>, Vec<f64>) = {
        let p: Vec<(String, Vec<f32>)> = be
            .params()
            .map(|(n, _, d)| (n.to_string(), d.to_vec()))
            .collect();
        let get = |suffix: &str| -> Vec<f64> {
            p.iter()
                .find(|(n, _)| n.ends_with(suffix))
                .map(|(_, d)| d.iter().map(|&v| v as f64).collect())
                .unwrap_or_else(|| panic!("no {suffix}"))
        };
        (get(".weight"), get(".bias"))
    };
    assert_eq!((w.len(), b.len()), (I * U, U));
    // biases start at 0: give them values so that their update is checked too
    let b0: Vec<f32> = (0..U).map(|_| r.random_range(-0.5..0.5)).collect();
    let bname = be
        .params()
        .map(|(n, _, _)| n.to_string())
        .find(|n| n.ends_with(".bias"))
        .expect("bias");
    be.set_param(&bname, &b0).expect("set bias");
    b = b0.iter().map(|&v| v as f64).collect();
    let (mut sw1, mut sw2) = (vec![0.0; I * U], vec![0.0; I * U]);
    let (mut sb1, mut sb2) = (vec![0.0; U], vec![0.0; U]);
    let td: Vec<f64> = t.iter().map(|&v| v as f64).collect();
    for step in 1..=STEPS {
        be.set_input("x", InputData::F32(&x)).expect("x");
        if labels_target {
            be.set_input("y", InputData::I32(&labels)).expect("y");
        } else {
            be.set_input("y", InputData::F32(&t)).expect("y");
        }
        be.set_learning_rate(lr_schedule.lr_at(base_lr, step, STEPS));
        let got = be.run(step, 1).expect("run") as f64;
        let y: Vec<f64> = (0..N * U)
            .map(|k| {
                let (n, u) = (k / U, k % U);
                b[u] + (0..I)
                    .map(|i| x[n * I + i] as f64 * w[i * U + u])
                    .sum::<f64>()
            })
            .collect();
        let (want, dy) = loss_and_grad(l, &y, &td, &labels);
        assert!(
            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "{loss_stmt} / {optimizer}: loss of step {step}: {got} vs the reference {want}"
        );
        let gw: Vec<f64> = (0..I * U)
            .map(|k| {
                let (i, u) = (k / U, k % U);
                (0..N).map(|n| x[n * I + i] as f64 * dy[n * U + u]).sum()
            })
            .collect();
        let gb: Vec<f64> = (0..U)
            .map(|u| (0..N).map(|n| dy[n * U + u]).sum())
            .collect();
        let os = o.scaled(factor(step));
        update(os, &mut w, &gw, &mut sw1, &mut sw2);
        update(os, &mut b, &gb, &mut sb1, &mut sb2);
    }
    for (suffix, want) in [(".weight", &w), (".bias", &b)] {
        let got: Vec<f32> = be
            .params()
            .find(|(n, _, _)| n.ends_with(suffix))
            .map(|(_, _, d)| d.to_vec())
            .expect("param");
        for (k, (&g, &e)) in got.iter().zip(want.iter()).enumerate() {
            assert!(
                (g as f64 - e).abs() <= 1e-4 * (1.0 + e.abs()),
                "{loss_stmt} / {optimizer}: {suffix}[{k}] {g} vs the reference {e}"
            );
        }
    }
}

#[test]
fn each_new_loss_trains_as_its_reference() {
    let sgd = Opt::Sgd(0.1);
    check("mse(out, y)", "sgd(lr: 0.1)", Loss::Mse, sgd);
    check("mae(out, y)", "sgd(lr: 0.1)", Loss::Mae, sgd);
    check(
        "huber(out, y, delta: 0.3)",
        "sgd(lr: 0.1)",
        Loss::Huber(0.3),
        sgd,
    );
    check("huber(out, y)", "sgd(lr: 0.1)", Loss::Huber(1.0), sgd);
    check("bce_with_logits(out, y)", "sgd(lr: 0.1)", Loss::Bce, sgd);
    check(
        "cross_entropy(out, y, label_smoothing: 0.2)",
        "sgd(lr: 0.1)",
        Loss::CrossEntropy(0.2),
        sgd,
    );
}

#[test]
fn rmsprop_and_lion_train_as_their_references() {
    check(
        "mse(out, y)",
        "rmsprop(lr: 0.01)",
        Loss::Mse,
        Opt::RmsProp {
            lr: 0.01,
            alpha: 0.99,
            eps: 1e-8,
            wd: 0.0,
            momentum: 0.0,
        },
    );
    check(
        "mse(out, y)",
        "rmsprop(lr: 0.005, alpha: 0.9, eps: 0.001, weight_decay: 0.01, momentum: 0.9)",
        Loss::Mse,
        Opt::RmsProp {
            lr: 0.005,
            alpha: 0.9,
            eps: 0.001,
            wd: 0.01,
            momentum: 0.9,
        },
    );
    check(
        "cross_entropy(out, y)",
        "lion(lr: 0.001)",
        Loss::CrossEntropy(0.0),
        Opt::Lion {
            lr: 0.001,
            b1: 0.9,
            b2: 0.99,
            wd: 0.0,
        },
    );
    check(
        "mse(out, y)",
        "lion(lr: 0.003, betas: (0.8, 0.95), weight_decay: 0.5)",
        Loss::Mse,
        Opt::Lion {
            lr: 0.003,
            b1: 0.8,
            b2: 0.95,
            wd: 0.5,
        },
    );
}

#[test]
fn lion_keeps_half_of_adams_optimizer_state() {
    let state = |opt: &str| {
        let src = format!(
            "input x: [{I}]\ntarget y: [{U}]\nout = x |> dense({U})\nloss mse(out, y)\ntrain {{ batch: {N}, optimizer: {opt} }}\n"
        );
        let m = dmc_grammar::compile_source(&src, "t.dm").expect("checks");
        let plan = compile(&m, &CompileOptions::default()).expect("compile");
        plan.buffers
            .iter()
            .filter(|b| b.kind == dmc_compiler::plan::BufferKind::OptimizerState)
            .map(|b| b.bytes)
            .sum::<u64>()
    };
    let params = ((I * U + U) * 4) as u64;
    assert_eq!(state("adam"), 2 * params);
    assert_eq!(state("lion"), params);
    assert_eq!(state("rmsprop"), params);
    assert_eq!(state("rmsprop(momentum: 0.9)"), 2 * params);
}

#[test]
fn scheduled_learning_rates_train_as_the_reference() {
    // step decay: halved after every step; the reference multiplies by 0.5^(step - 1)
    let half = |t: u64| 0.5f64.powi(t as i32 - 1);
    check_scheduled(
        "mse(out, y)",
        "sgd(lr: 0.1)",
        ", schedule: step(every: 1, gamma: 0.5)",
        &half,
        Loss::Mse,
        Opt::Sgd(0.1),
    );
    // warmup over 3 steps then constant: 1/3, 2/3, 1, 1
    let warm = |t: u64| (t.min(3)) as f64 / 3.0;
    check_scheduled(
        "mae(out, y)",
        "rmsprop(lr: 0.01, momentum: 0.9)",
        ", schedule: warmup(3)",
        &warm,
        Loss::Mae,
        Opt::RmsProp {
            lr: 0.01,
            alpha: 0.99,
            eps: 1e-8,
            wd: 0.0,
            momentum: 0.9,
        },
    );
    // cosine over the 4 steps after one warmup step: 1, then (1 + cos(pi k / 3)) / 2 for k = 0, 1, 2
    let cos = |t: u64| {
        if t == 1 {
            1.0
        } else {
            (1.0 + (std::f64::consts::PI * (t - 2) as f64 / 3.0).cos()) / 2.0
        }
    };
    check_scheduled(
        "huber(out, y)",
        "lion(lr: 0.003, weight_decay: 0.5)",
        ", schedule: cosine(warmup: 1)",
        &cos,
        Loss::Huber(1.0),
        Opt::Lion {
            lr: 0.003,
            b1: 0.9,
            b2: 0.99,
            wd: 0.5,
        },
    );
}
