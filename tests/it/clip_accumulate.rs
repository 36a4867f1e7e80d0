//! Gradient clipping and accumulation on every backend that runs on the CPU. Clipping by value
//! (`train { clip_value: v }`): one SGD step of the clipped plan against the same network's
//! gradients taken from an unclipped step (g = (w0 - w1) / lr) and clamped here by hand, as
//! `torch.nn.utils.clip_grad_value_` before `opt.step()` (so before the weight decay is added);
//! fused and unfused plans. Accumulation (`accumulate: 4` of `batch: 2`) against one step of
//! `batch: 8` on the same samples.

use dmc_compiler::plan::{BufferKind, Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::compare::Batch;
use dmc_runtime::{Backend, BackendKind, InputData, RunPass};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const LR: f32 = 0.1;

fn plan(train: &str, fuse: bool) -> Plan {
    let src = format!(
        "input x: [6, 6, 2]\ntarget y: [3]\n\
         out = x |> conv2d(4, 3, activation: relu) |> flatten |> dense(3)\n\
         loss mse(out, y)\ntrain {{ batch: 2, {train} }}\n"
    );
    let m = dmc_grammar::compile_source(&src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    let opts = CompileOptions {
        mode: Mode::Train,
        fuse,
        ..CompileOptions::default()
    };
    compile(&m, &opts).expect("compile")
}

/// The parameters before and after one step of `plan` on `kind` (seeded data and weights).
fn one_step(kind: BackendKind, plan: Plan) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let batch = Batch::random(&plan, &mut rng);
    let mut be = dmc_runtime::open_backend(kind, plan, &Default::default()).expect("backend");
    be.init_params(3).expect("init");
    let params = |be: &dyn Backend| -> Vec<Vec<f32>> {
        let ps = be.params().expect("params");
        ps.into_iter().map(|p| p.2.to_vec()).collect()
    };
    let before = params(&*be);
    batch.feed(|n, d| be.set_input(n, d)).expect("input");
    assert!(be.run(1, 7).expect("step").is_finite());
    (before, params(&*be))
}

fn clip_value_is_clamping_before_the_update(kind: BackendKind) {
    for fuse in [true, false] {
        let (w0, w1) = one_step(kind, plan(&format!("optimizer: sgd(lr: {LR})"), fuse));
        let grads: Vec<Vec<f32>> = w0
            .iter()
            .zip(&w1)
            .map(|(a, b)| a.iter().zip(b).map(|(a, b)| (a - b) / LR).collect())
            .collect();
        // a bound that clips about half of the elements
        let mut mags: Vec<f32> = grads.iter().flatten().map(|g| g.abs()).collect();
        mags.sort_by(f32::total_cmp);
        let v = mags[mags.len() / 2];
        assert!(v > 1e-3, "gradients too small to tell clipping apart: {v}");
        let wd = 0.05f32;
        let (c0, c1) = one_step(
            kind,
            plan(
                &format!("optimizer: sgd(lr: {LR}, weight_decay: {wd}), clip_value: {v}"),
                fuse,
            ),
        );
        assert_eq!(c0, w0, "the same initial weights");
        let (mut clipped, mut kept) = (0, 0);
        for (p, (g, (w, got))) in grads.iter().zip(w0.iter().zip(&c1)).enumerate() {
            for i in 0..g.len() {
                let gc = g[i].clamp(-v, v);
                if gc != g[i] {
                    clipped += 1;
                } else {
                    kept += 1;
                }
                // clipped first, then the decay added: w - lr (clamp(g) + wd w)
                let want = w[i] - LR * (gc + wd * w[i]);
                assert!(
                    (got[i] - want).abs() <= 2e-6 * (1.0 + want.abs()),
                    "{kind:?} fuse {fuse}: param {p}[{i}]: {} != {want} (g {}, v {v})",
                    got[i],
                    g[i]
                );
            }
        }
        assert!(clipped > 10 && kept > 10, "{clipped} clipped, {kept} kept");
        // a bound above every gradient changes nothing, bit for bit
        let (_, h1) = one_step(
            kind,
            plan(&format!("optimizer: sgd(lr: {LR}), clip_value: 1e30"), fuse),
        );
        assert!(
            h1 == w1,
            "{kind:?} fuse {fuse}: clip_value 1e30 changed the step"
        );
    }
}

fn clip_norm_scales_to_the_global_norm(kind: BackendKind) {
    let (w0, w1) = one_step(kind, plan(&format!("optimizer: sgd(lr: {LR})"), true));
    let grads: Vec<Vec<f64>> = w0
        .iter()
        .zip(&w1)
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(a, b)| ((a - b) / LR) as f64)
                .collect()
        })
        .collect();
    let norm = grads.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
    let m = norm / 3.0;
    let p = plan(&format!("optimizer: sgd(lr: {LR}), clip_norm: {m}"), true);
    let c = p.clip_norm.as_ref().expect("the plan records the method");
    let params: u64 = p
        .params
        .iter()
        .map(|b| b.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(c.extra_flops, 3 * params);
    assert!(c.extra_bytes >= 4 * params, "{c:?}");
    let (_, c1) = one_step(kind, p);
    // clip_grad_norm_: g * min(1, m / (norm + 1e-6))
    let scale = m / (norm + 1e-6);
    for (pi, (g, (w, got))) in grads.iter().zip(w0.iter().zip(&c1)).enumerate() {
        for i in 0..g.len() {
            let want = w[i] as f64 - LR as f64 * g[i] * scale;
            assert!(
                (got[i] as f64 - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "{kind:?}: param {pi}[{i}]: {} != {want}",
                got[i]
            );
        }
    }
    // a bound above the norm changes nothing, bit for bit (held gradients, unfused: the same
    // formulas as the fused plan's)
    let (_, h1) = one_step(
        kind,
        plan(&format!("optimizer: sgd(lr: {LR}), clip_norm: 1e30"), true),
    );
    assert!(h1 == w1, "{kind:?}: clip_norm 1e30 changed the step");
}

#[test]
fn clip_norm_scales_every_gradient_to_the_global_norm_on_the_cpu() {
    clip_norm_scales_to_the_global_norm(BackendKind::Cpu);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn clip_norm_scales_every_gradient_to_the_global_norm_in_the_emulator() {
    clip_norm_scales_to_the_global_norm(BackendKind::CudaEmu);
}

#[test]
fn clip_value_clamps_each_gradient_element_before_weight_decay_on_the_cpu() {
    clip_value_is_clamping_before_the_update(BackendKind::Cpu);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn clip_value_clamps_each_gradient_element_before_weight_decay_in_the_emulator() {
    clip_value_is_clamping_before_the_update(BackendKind::CudaEmu);
}

fn accum_plan(optimizer: &str, batch: usize, accumulate: usize) -> Plan {
    let src = format!(
        "input x: [5, 5, 2]\ntarget y: [3]\n\
         out = x |> conv2d(4, 3, activation: tanh) |> flatten |> dense(3)\n\
         loss mse(out, y)\ntrain {{ batch: {batch}, optimizer: {optimizer}, accumulate: {accumulate} }}\n"
    );
    let m = dmc_grammar::compile_source(&src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    compile(&m, &CompileOptions::default()).expect("compile")
}

/// Parameters after `steps` optimizer steps of `plan` on `kind`, each step on the 8 samples of
/// `data[step]` split into `plan.accumulate` micro-batches, and each step's loss (the mean over
/// its micro-batches).
fn train_accumulating(kind: BackendKind, plan: Plan, data: &[Batch]) -> (Vec<Vec<f32>>, Vec<f32>) {
    let n = plan.accumulate;
    let mut be = dmc_runtime::open_backend(kind, plan, &Default::default()).expect("backend");
    be.init_params(9).expect("init");
    let mut losses = vec![];
    for (s, b) in data.iter().enumerate() {
        let mut sum = 0.0f64;
        for j in 0..n {
            for (name, f, _) in &b.0 {
                let len = f.len() / n;
                be.set_input(name, InputData::F32(&f[j * len..(j + 1) * len]))
                    .expect("input");
            }
            be.set_run_pass(if j + 1 == n {
                RunPass::Whole
            } else {
                RunPass::Accumulate
            });
            sum += be.run(s as u64 + 1, 4).expect("step") as f64;
        }
        losses.push((sum / n as f64) as f32);
    }
    let ps = be.params().expect("params");
    (ps.into_iter().map(|p| p.2.to_vec()).collect(), losses)
}

fn accumulating_4_of_2_is_one_batch_of_8(kind: BackendKind) {
    for opt in [
        "sgd(lr: 0.1, momentum: 0.9)",
        "adam(lr: 0.01)",
        // the norm is the accumulated gradient's (as PyTorch clips after the last backward)
        "sgd(lr: 0.1), clip_norm: 0.01",
    ] {
        let big = accum_plan(opt, 8, 1);
        let acc = accum_plan(opt, 2, 4);
        assert_eq!(acc.accumulate, 4);
        let accumulators = acc
            .buffers
            .iter()
            .filter(|b| b.kind == BufferKind::GradAccum)
            .count();
        assert_eq!(
            accumulators,
            acc.params.len(),
            "one gradient buffer per parameter"
        );
        // (clip_norm holds the gradients in the same buffers without accumulating)
        assert_eq!(
            big.buffers.iter().any(|b| b.kind == BufferKind::GradAccum),
            opt.contains("clip_norm")
        );
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let data: Vec<Batch> = (0..3).map(|_| Batch::random(&big, &mut rng)).collect();
        let (want, want_loss) = train_accumulating(kind, big, &data);
        let (got, got_loss) = train_accumulating(kind, acc, &data);
        for (p, (w, g)) in want.iter().zip(&got).enumerate() {
            for (i, (a, b)) in w.iter().zip(g).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                    "{kind:?} {opt}: param {p}[{i}]: batch 8 {a}, 4 x 2 accumulated {b}"
                );
            }
        }
        for (a, b) in want_loss.iter().zip(&got_loss) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "loss {a} vs {b}");
        }
        // and the steps really were taken on all the samples: training only on the last
        // micro-batch of each step differs
        let (last_only, _) = train_accumulating(
            kind,
            accum_plan(opt, 2, 1),
            &data
                .iter()
                .map(|b| {
                    Batch(
                        b.0.iter()
                            .map(|(n, f, i)| (n.clone(), f[f.len() * 3 / 4..].to_vec(), i.clone()))
                            .collect(),
                    )
                })
                .collect::<Vec<_>>(),
        );
        assert!(
            last_only != got,
            "{opt}: the accumulation made no difference"
        );
    }
}

#[test]
fn accumulating_four_micro_batches_of_two_equals_one_batch_of_eight_on_the_cpu() {
    accumulating_4_of_2_is_one_batch_of_8(BackendKind::Cpu);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn accumulating_four_micro_batches_of_two_equals_one_batch_of_eight_in_the_emulator() {
    accumulating_4_of_2_is_one_batch_of_8(BackendKind::CudaEmu);
}

#[test]
fn dmc_run_and_plan_report_the_accumulation_and_its_buffers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("acc.dm");
    std::fs::write(
        &file,
        "input x: [8]\ntarget y: [2]\nout = x |> dense(8, activation: tanh) |> dense(2)\n\
         loss mse(out, y)\ntrain { batch: 4, optimizer: sgd(lr: 0.1), accumulate: 4, clip_value: 0.5 }\n",
    )
    .expect("write");
    let f = file.to_str().expect("utf-8 path");
    let (code, out, err) =
        crate::common::dmc(&["run", f, "--synthetic-samples", "64", "--steps", "6"]);
    assert_eq!(code, 0, "{err}");
    let err = format!("{out}{err}");
    // 64 samples = 4 steps of 16 per epoch; --steps counts optimizer steps
    assert!(
        err.contains("6 steps of batch 16 (4 micro-batches of 4 accumulated) (4 steps per epoch"),
        "{err}"
    );
    assert!(err.contains("6 steps, final loss"), "{err}");
    assert!(err.contains("+ gradient buffers 360 B"), "{err}");
    // fewer samples than one optimizer step
    let (code, _, err) = crate::common::dmc(&["run", f, "--synthetic-samples", "12"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("fewer than one step of 4 micro-batches of 4"),
        "{err}"
    );
    let (code, out, err) = crate::common::dmc(&["plan", f]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("batch 4 x 4 accumulated micro-batches (effective batch 16)"),
        "{out}"
    );
    // the two dense layers' weights and biases: (8*8 + 8 + 8*2 + 2) * 4 bytes
    assert!(out.contains("gradient buffers 360 B"), "{out}");
    // clip_norm: the method and its cost (the 360 B of gradients and the 4 B norm; 2 FLOPs per
    // gradient element for the norm, 1 for the scaling)
    std::fs::write(
        &file,
        "input x: [8]\ntarget y: [2]\nout = x |> dense(8, activation: tanh) |> dense(2)\n\
         loss mse(out, y)\ntrain { batch: 4, optimizer: sgd(lr: 0.1), clip_norm: 1.0 }\n",
    )
    .expect("write");
    let (code, out, err) = crate::common::dmc(&["plan", f]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("clip_norm 1: held gradients (every gradient kept until the global norm is summed), +364 B (364 B) and +270 FLOPs per step, 0 extra forward/backward passes"),
        "{out}"
    );
}
