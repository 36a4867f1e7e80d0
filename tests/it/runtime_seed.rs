//! The seed network (206,538,153 parameters) trains one step on the CPU with the fused plan, in
//! an arena of at most 1.01 x its parameter bytes.

use std::time::Instant;

use dmc_compiler::testutil::seed;
use dmc_compiler::{compile, CompileOptions};
use dmc_runtime::{CpuBackend, InputData};

#[test]
fn seed_trains_one_step_in_about_its_parameter_bytes() {
    let t0 = Instant::now();
    let plan = compile(&seed(), &CompileOptions::default()).unwrap();
    let params: u64 = plan
        .params
        .iter()
        .map(|p| plan.buffers[p.buffer].bytes)
        .sum();
    assert_eq!(params, 826_152_612);
    assert!(plan.arena_bytes as f64 <= 1.01 * params as f64);
    let mut be = CpuBackend::new(plan).unwrap();
    be.init_params(1);
    let before: Vec<f32> = be.param("conv2d_10.weight").unwrap()[..64].to_vec();
    let t1 = Instant::now();
    let x: Vec<f32> = (0..256).map(|i| (i % 17) as f32 / 17.0).collect();
    be.set_input("x", InputData::F32(&x)).unwrap();
    be.set_input("y", InputData::F32(&[0.5])).unwrap();
    let loss = be.run(1, 0).unwrap();
    let t2 = Instant::now();
    assert!(loss.is_finite(), "{loss}");
    let after = &be.param("conv2d_10.weight").unwrap()[..64];
    assert_ne!(before.as_slice(), after);
    println!(
        "seed: arena {} bytes, loss {loss}, compile+alloc+init {:.2?}, one step {:.2?}",
        be.arena_bytes(),
        t1 - t0,
        t2 - t1
    );
}
