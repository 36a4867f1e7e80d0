//! `reshape([...])` end to end: a view (no kernel, no buffer of its own) that regroups the
//! elements row-major, checked against an f64 reference written here.

use dmc_compiler::plan::Mode;
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::{CpuBackend, InputData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// [4, 6] regrouped as [2, 4, 3]: layernorm normalises each run of 3 consecutive elements.
const SRC: &str = "input x: [4, 6]
target y: [2]
h = x |> reshape([2, 4, -1]) as rows |> layernorm
out = h |> reshape([-1]) as flat |> dense(2)
loss mse(out, y)
train { batch: 3, optimizer: sgd(lr: 0.1), seed: 1 }
";
const B: usize = 3;
const N: usize = 24;
const O: usize = 2;

fn plan() -> dmc_compiler::plan::Plan {
    let m = dmc_grammar::compile_source(SRC, "reshape.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    let opts = CompileOptions {
        mode: Mode::Train,
        verify: true,
        ..CompileOptions::default()
    };
    compile(&m, &opts).expect("plan")
}

#[test]
fn reshape_is_a_view_without_kernel_or_buffer() {
    let p = plan();
    for name in ["rows", "flat"] {
        assert!(
            !p.steps.iter().any(|s| s.label.starts_with(name)),
            "`{name}` launches a kernel"
        );
        assert!(
            !p.buffers.iter().any(|b| b.name == name),
            "`{name}` has a buffer of its own"
        );
    }
}

#[test]
fn reshape_regroups_row_major() {
    let mut be = CpuBackend::new(plan()).expect("backend");
    be.init_params(1);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let x: Vec<f32> = (0..B * N).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    let y: Vec<f32> = (0..B * O).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    be.set_input("x", InputData::F32(&x)).expect("x");
    be.set_input("y", InputData::F32(&y)).expect("y");
    let w: Vec<f64> = be
        .param("dense_1.weight")
        .expect("w")
        .iter()
        .map(|&v| v as f64)
        .collect();
    let bias: Vec<f64> = be
        .param("dense_1.bias")
        .expect("b")
        .iter()
        .map(|&v| v as f64)
        .collect();
    // reference: layernorm (weight 1, bias 0, eps 1e-5) of each run of 3, then dense [24, 2]
    let mut loss = 0.0;
    for n in 0..B {
        let xs: Vec<f64> = x[n * N..(n + 1) * N].iter().map(|&v| v as f64).collect();
        let mut h = [0.0; N];
        for r in 0..8 {
            let row = &xs[r * 3..r * 3 + 3];
            let m = row.iter().sum::<f64>() / 3.0;
            let v = row.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / 3.0;
            for k in 0..3 {
                h[r * 3 + k] = (row[k] - m) / (v + 1e-5).sqrt();
            }
        }
        for o in 0..O {
            let out = bias[o] + (0..N).map(|i| h[i] * w[i * O + o]).sum::<f64>();
            loss += (out - y[n * O + o] as f64).powi(2);
        }
    }
    let want = loss / (B * O) as f64;
    let got = be.run(1, 1).expect("step") as f64;
    assert!(
        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
        "loss {got} vs reference {want}"
    );
}
