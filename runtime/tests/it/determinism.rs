//! Determinism: same inputs -> bit-identical outputs, across runs and thread counts; and the
//! hand-run timing aids (ignored).

use crate::common;

use common::*;
use dmc_plan::op::UnaryKind;
use dmc_runtime::cpu::conv::{conv2d_bwd_data, conv2d_bwd_weight, conv2d_fwd};
use dmc_runtime::cpu::dense::{dense_bwd_weight, dense_fwd};
use dmc_runtime::cpu::elementwise::unary_fwd;
use dmc_runtime::cpu::loss::{cross_entropy_loss, mse_loss};
use dmc_runtime::cpu::optim::bias_grad;
use dmc_runtime::cpu::pool::global_avgpool_fwd;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs a batch of big kernels and returns all their outputs' bits.
fn big_run() -> Vec<u32> {
    let mut r = rng(30);
    let mut out = Vec::new();
    let c = ConvCase::same(4, 16, 16, 8, 16, 3, 1); // 1024 rows: 4 chunks
    let x = randv(&mut r, c.xlen());
    let w = randv(&mut r, c.wlen());
    let dy = randv(&mut r, c.ylen());
    let b = randv(&mut r, c.co);
    out.extend(bits(&conv_run(&c, &x, &w, Some(&b))));
    let mut dx = vec![0.0; c.xlen()];
    conv2d_bwd_data(&c.geom(), &c.dims(), &dy, &w, &mut dx);
    out.extend(bits(&dx));
    let mut dw = vec![0.0; c.wlen()];
    let mut cols = vec![0.0; c.ws()];
    conv2d_bwd_weight(&c.geom(), &c.dims(), &x, &dy, &mut dw, &mut cols);
    out.extend(bits(&dw));
    let mut db = vec![0.0; c.co];
    bias_grad(&dy, &mut db);
    out.extend(bits(&db));
    // depthwise (groups = channels, 40 of them: three blocks of the weight gradient), run
    // directly rather than through im2col
    let c = ConvCase::same(4, 16, 16, 40, 40, 3, 2);
    let (mut g, d) = (c.geom(), c.dims());
    g.groups = c.ci;
    let x = randv(&mut r, c.xlen());
    let w = randv(&mut r, c.wlen() / c.ci);
    let dy = randv(&mut r, c.ylen());
    let mut cols = vec![0.0; c.ws()];
    let mut y = vec![0.0; c.ylen()];
    conv2d_fwd(&g, &d, &x, &w, None, &mut y, &mut cols);
    out.extend(bits(&y));
    let mut dx = vec![0.0; c.xlen()];
    conv2d_bwd_data(&g, &d, &dy, &w, &mut dx);
    out.extend(bits(&dx));
    let mut dw = vec![0.0; w.len()];
    conv2d_bwd_weight(&g, &d, &x, &dy, &mut dw, &mut cols);
    out.extend(bits(&dw));
    let big = randv(&mut r, 1 << 20);
    let big2 = randv(&mut r, 1 << 20);
    out.push(mse_loss(&big, &big2).to_bits());
    let (n, k) = (4096, 100);
    let labels: Vec<i32> = (0..n).map(|i| (i % k) as i32).collect();
    out.push(
        cross_entropy_loss(&big[..n * k], &labels, k)
            .unwrap()
            .to_bits(),
    );
    let mut g = vec![0.0; 64 * 8];
    global_avgpool_fwd(64, 32 * 32, 8, &big[..64 * 1024 * 8], &mut g);
    out.extend(bits(&g));
    let mut dn = vec![0.0; 300 * 70];
    dense_bwd_weight(1000, 300, 70, &big[..300_000], &big2[..70_000], &mut dn);
    out.extend(bits(&dn));
    out
}

#[test]
fn kernels_are_deterministic_across_runs_and_thread_counts() {
    let a = big_run();
    let b = big_run();
    assert!(a == b, "two runs differ");
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let c = pool.install(big_run);
        assert!(a == c, "{threads} threads differ");
    }
}

/// Rough single-kernel timings: `cargo test --release -p dmc-runtime --test it determinism -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_kernels() {
    use std::time::Instant;
    let time = |what: &str, flops: f64, f: &mut dyn FnMut()| {
        f();
        let reps = 5;
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        eprintln!(
            "{what:<40} {:>9.3} ms  {:>7.2} GFLOP/s",
            s * 1e3,
            flops / s / 1e9
        );
    };
    let mut r = rng(40);
    let c = ConvCase::same(32, 32, 32, 32, 32, 3, 1);
    let (g, d) = (c.geom(), c.dims());
    let x = randv(&mut r, c.xlen());
    let w = randv(&mut r, c.wlen());
    let dy = randv(&mut r, c.ylen());
    let mut y = vec![0.0; c.ylen()];
    let mut dx = vec![0.0; c.xlen()];
    let mut dw = vec![0.0; c.wlen()];
    let mut cols = vec![0.0; c.ws()];
    let fl = 2.0 * (c.n * c.ho * c.wo * c.co * 9 * c.ci) as f64;
    time("conv fwd 32x32x32x32 3x3 -> 32", fl, &mut || {
        conv2d_fwd(&g, &d, &x, &w, None, &mut y, &mut cols)
    });
    time("conv bwd data", fl, &mut || {
        conv2d_bwd_data(&g, &d, &dy, &w, &mut dx)
    });
    time("conv bwd weight", fl, &mut || {
        conv2d_bwd_weight(&g, &d, &x, &dy, &mut dw, &mut cols)
    });
    let (n, k, m) = (256, 1024, 1024);
    let a = randv(&mut r, n * k);
    let wd = randv(&mut r, k * m);
    let mut yd = vec![0.0; n * m];
    time("dense 256x1024x1024", 2.0 * (n * k * m) as f64, &mut || {
        dense_fwd(n, k, m, &a, &wd, None, &mut yd)
    });
    let big = randv(&mut r, 1 << 22);
    let mut out = vec![0.0; 1 << 22];
    time("relu 4M", 0.0, &mut || {
        unary_fwd(UnaryKind::Relu, &big, &mut out)
    });
    time("gelu 4M", 0.0, &mut || {
        unary_fwd(UnaryKind::Gelu, &big, &mut out)
    });
    time("mse 4M", 0.0, &mut || {
        mse_loss(&big, &out);
    });
}

#[test]
#[ignore]
fn bench_conv_parts() {
    use std::time::Instant;
    let mut r = rng(41);
    for co in [1usize, 32] {
        let c = ConvCase::same(32, 32, 32, 32, co, 3, 1);
        let (g, d) = (c.geom(), c.dims());
        let x = randv(&mut r, c.xlen());
        let w = randv(&mut r, c.wlen());
        let dy = randv(&mut r, c.ylen());
        let mut y = vec![0.0; c.ylen()];
        let mut dw = vec![0.0; c.wlen()];
        let mut cols = vec![0.0; c.ws()];
        for _ in 0..2 {
            let t = Instant::now();
            conv2d_fwd(&g, &d, &x, &w, None, &mut y, &mut cols);
            let a = t.elapsed();
            let t = Instant::now();
            conv2d_bwd_weight(&g, &d, &x, &dy, &mut dw, &mut cols);
            eprintln!("co={co}: fwd {a:?} bwd_w {:?}", t.elapsed());
        }
    }
}

/// Prints a checksum of `big_run()`: compare across `RAYON_NUM_THREADS`
/// settings (read once per process) with `-- --ignored --nocapture`.
#[test]
#[ignore]
fn print_determinism_checksum() {
    let h = big_run().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    eprintln!("checksum {h:016x}");
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}

/// The GEMMs split over rayon (one pool, no matrixmultiply threads): the same bits whatever the
/// thread count, for every kernel of `big_run` (convolutions large enough to split).
#[test]
fn results_do_not_depend_on_the_thread_count() {
    let one = in_pool(1, big_run);
    assert_eq!(one, in_pool(3, big_run));
    assert_eq!(one, in_pool(8, big_run));
}

/// A GEMM split by rows (m >= n) and one split by columns (n > m), with transposed operands and a
/// column-major C: against a naive f64 product, and bit-identical across thread counts.
#[test]
fn split_gemms_match_a_naive_product() {
    use dmc_runtime::cpu::gemm::{sgemm, View, PAR_WORK};
    let mut r = rng(77);
    for (m, k, n) in [(700, 65, 40), (33, 70, 900)] {
        assert!(m * n * k >= PAR_WORK);
        let a = randv(&mut r, m * k); // stored k x m: read transposed
        let b = randv(&mut r, k * n);
        let run = || {
            let mut c = vec![f32::NAN; m * n]; // column-major result: c[i + j*m]
            sgemm(
                1.0,
                View::rm_t(&a, k, m),
                View::rm(&b, k, n),
                0.0,
                &mut c,
                1,
                m,
            );
            c
        };
        let c = in_pool(4, run);
        assert_eq!(c, in_pool(1, run));
        for i in (0..m).step_by(7) {
            for j in (0..n).step_by(5) {
                let want: f64 = (0..k)
                    .map(|t| a[t * m + i] as f64 * b[t * n + j] as f64)
                    .sum();
                let got = c[i + j * m] as f64;
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "({i},{j}): {got} vs {want}"
                );
            }
        }
    }
}

/// conv2d_bwd_data runs one task per image and each task's GEMM may split into rayon tasks; while
/// a task waits for its GEMM blocks its thread can steal another image's task. The per-thread tile
/// must survive that (it was held borrowed across the GEMM once: "RefCell already borrowed").
#[test]
fn conv_bwd_data_survives_nested_parallelism() {
    let c = ConvCase::same(32, 11, 11, 64, 64, 3, 1); // per image GEMM: 113 x 576 x 64 > PAR_WORK
    let mut r = rng(5);
    let dy = randv(&mut r, c.ylen());
    let w = randv(&mut r, c.wlen());
    let run = || {
        let mut dx = vec![0.0; c.xlen()];
        for _ in 0..20 {
            conv2d_bwd_data(&c.geom(), &c.dims(), &dy, &w, &mut dx);
        }
        dx
    };
    let one = in_pool(1, run);
    for threads in [2, 3, 4, 8] {
        assert_eq!(one, in_pool(threads, run), "{threads} threads");
    }
}
