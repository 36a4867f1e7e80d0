//! Gradient clipping by value (`train { clip_value: v }`) on every backend that runs on the CPU:
//! one SGD step of the clipped plan against the same network's gradients taken from an unclipped
//! step (g = (w0 - w1) / lr) and clamped here by hand, as `torch.nn.utils.clip_grad_value_`
//! before `opt.step()` (so before the weight decay is added); fused and unfused plans.

use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::compare::Batch;
use dmc_runtime::{Backend, BackendKind};
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

#[test]
fn clip_value_clamps_each_gradient_element_before_weight_decay_on_the_cpu() {
    clip_value_is_clamping_before_the_update(BackendKind::Cpu);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn clip_value_clamps_each_gradient_element_before_weight_decay_in_the_emulator() {
    clip_value_is_clamping_before_the_update(BackendKind::CudaEmu);
}
