use std::time::Instant;
fn t(name: &str, mut f: impl FnMut()) {
    for _ in 0..20 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..20 {
        let t0 = Instant::now();
        for _ in 0..20 {
            f();
        }
        best = best.min(t0.elapsed().as_secs_f64() / 20.0);
    }
    println!("{name}: {:.2} us", best * 1e6);
}
fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(|| {
        for &(rows, c) in &[(4096usize, 16usize), (1024, 64), (256, 256), (16384, 32)] {
            let x: Vec<f32> = (0..rows * c).map(|i| (i % 13) as f32 * 0.1).collect();
            let mut y = vec![0f32; rows * c];
            let (ga, be) = (vec![1f32; c], vec![0f32; c]);
            let (mut m, mut v) = (vec![0f32; c], vec![0f32; c]);
            t(&format!("bn fwd [{rows},{c}]"), || {
                dmc_runtime::cpu::norm::batchnorm(&x, &ga, &be, &mut y, &mut m, &mut v, 1e-5)
            });
            let mut dg = vec![0f32; c];
            let mut db = vec![0f32; c];
            let mut dy = x.clone();
            t(&format!("bn bwd [{rows},{c}]"), || {
                dmc_runtime::cpu::norm::batchnorm_bwd_in_place(
                    &mut dy, &x, &m, &v, &ga, &mut dg, &mut db, 1e-5,
                )
            });
        }
    });
}
