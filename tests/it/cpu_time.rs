//! The CPU time model (`dmc_plan::cpu`), its calibration's fit (`dmc_runtime::cpu::calibrate`;
//! its measurement and cache: calibration.rs) and the cap fitter that ranks plans by it: the
//! model's structure (chunks, splits, sums), the calibration's fit, and the fitter never choosing a plan predicted slower than the
//! plan it had without recomputation.

use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::{compile, CompileError, CompileOptions, RematMode};
use dmc_plan::cpu::{gemm_split, plan_time, CpuRates, CpuWork, GemmCalls};
use dmc_plan::op::{ConvGeom, ConvOp, OpFacts};
use dmc_plan::update::UpdateRule;
use dmc_runtime::cpu::calibrate;

fn model(src: &str) -> dmc_grammar::model::Model {
    dmc_grammar::compile_source(src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)))
}

/// SGD with momentum 0.9, lr 0.01 (one state tensor).
fn sgd_momentum() -> UpdateRule {
    UpdateRule::Sgd {
        lr: 0.01,
        momentum: 0.9,
        weight_decay: 0.0,
        nesterov: false,
        clip_value: None,
        clip_norm: None,
    }
}

/// A fused conv weight-gradient + SGD-momentum update of a 3x3, 64 -> 64 conv on 32 images of
/// 64x64, in chunks of `chunk` output channels.
fn update_work(chunk: usize) -> CpuWork {
    let op = ConvOp::Conv2dBwdWeightUpdate {
        shards: 1,
        keep_rows: false,
        geom: ConvGeom::square(3, 1, 1),
        rule: sgd_momentum(),
        chunk,
        bias: false,
        keep_old: false,
    };
    let (x, dy, w) = (
        vec![32, 64, 64, 64],
        vec![32, 64, 64, 64],
        vec![3, 3, 64, 64],
    );
    op.cpu_work(&[x, dy, w.clone(), w.clone()], &[w.clone(), w])
}

#[test]
fn smaller_update_chunks_are_predicted_slower_and_redo_im2col_per_chunk() {
    let r = CpuRates::nominal();
    let times: Vec<f64> = [64, 32, 16, 8, 4, 2, 1]
        .iter()
        .map(|&c| r.work_s(&update_work(c)))
        .collect();
    for w in times.windows(2) {
        assert!(w[1] > w[0], "a smaller chunk is slower: {times:?}");
    }
    // one column per chunk: 64 im2cols of the whole input instead of one
    assert_eq!(update_work(1).im2col, 64 * update_work(64).im2col);
    assert!(
        times[6] > 8.0 * times[0],
        "chunk 1 pays for a whole micro-tile per column and redoes im2col: {times:?}"
    );
    // the GEMM calls: per chunk of 256 rows, one [K x c] += cols^T dy
    let w = update_work(16);
    let calls: u64 = w.gemms.iter().map(|g| g.calls).sum();
    assert_eq!(calls, 4 * (32 * 64 * 64 / 256));
    assert!(w
        .gemms
        .iter()
        .all(|g| g.m == 576 && g.n == 16 && g.k == 256));
}

#[test]
fn a_gemm_is_split_as_the_backend_splits_it_and_costs_whole_micro_tiles() {
    // small: one block on the calling thread; large: rows over the threads
    assert_eq!(gemm_split(8, 8, 8, 2).parts, 1);
    let s = gemm_split(256, 64, 576, 2);
    assert!(s.rows && s.parts == 2 && s.per == 128, "{s:?}");
    // wide: blocks of columns
    let s = gemm_split(256, 4096, 256, 2);
    assert!(!s.rows && s.parts >= 2, "{s:?}");
    let r = CpuRates::nominal();
    // a 1-column GEMM costs as much arithmetic as a micro-tile-wide one
    let [f1, ..] = r.gemm_terms(576, 1, 256, false);
    let [f8, ..] = r.gemm_terms(576, r.micro_tile, 256, false);
    assert_eq!(f1, f8);
    // outer-parallel calls over more items than threads take waves of single-threaded calls
    let g = GemmCalls {
        m: 64,
        n: 576,
        k: 64,
        calls: 32,
        outer: 32,
        accumulate: false,
        per_thread_rows: false,
        a_t: false,
        b_t: false,
    };
    let work = |g: GemmCalls| CpuWork {
        gemms: vec![g],
        ..Default::default()
    };
    // (one call on one thread)
    let r1 = CpuRates {
        threads: 1,
        ..r.clone()
    };
    let one = r1.work_s(&work(GemmCalls {
        calls: 1,
        outer: 1,
        ..g
    })) - r1.launch_s;
    let all = r.work_s(&work(g)) - r.launch_s;
    assert!((all - 16.0 * one).abs() < 1e-12 * one.max(1.0));
}

/// A small step's plan: a convolution with its activation, a dense layer, Adam.
fn small_plan() -> Plan {
    let m = model(
        "input x: [8, 8, 3]\ntarget y: int\n\
         out = x |> conv2d(8, 3, activation: relu) |> flatten |> dense(10)\n\
         loss cross_entropy(out, y)\ntrain { batch: 4, optimizer: adam(lr: 0.001) }\n",
    );
    compile(&m, &CompileOptions::default()).expect("compile")
}

#[test]
fn a_plans_predicted_step_is_the_sum_of_its_steps() {
    let p = small_plan();
    let r = CpuRates::nominal();
    let t = plan_time(&p, &r);
    assert_eq!(t.kernel_s.len(), p.kernels.len());
    let sum: f64 = p.steps.iter().map(|s| t.kernel_s[s.kernel]).sum();
    assert!((sum - t.step_s).abs() <= 1e-12 * sum);
    assert!(t.kernel_s.iter().all(|s| *s > 0.0 && s.is_finite()));
    // faster rates, faster step
    let fast = CpuRates {
        gemm_flops: r.gemm_flops * 2.0,
        stream_bytes: r.stream_bytes * 2.0,
        ..r.clone()
    };
    assert!(plan_time(&p, &fast).step_s < t.step_s);
}

#[test]
fn the_fit_recovers_known_coefficients_and_never_goes_negative() {
    let shapes = [
        (256, 256, 256),
        (576, 1, 256),
        (64, 64, 64),
        (8, 8, 8),
        (16, 256, 768),
    ];
    let rows: Vec<[f64; 4]> = shapes
        .iter()
        .map(|&(m, n, k)| CpuRates::nominal().gemm_terms(m, n, k, false))
        .collect();
    let truth = [1.0 / 150e9, 1.0 / 25e9, 3e-7, 1.0 / 40e9];
    let t: Vec<f64> = rows
        .iter()
        .map(|r| r.iter().zip(truth).map(|(a, b)| a * b).sum())
        .collect();
    let x = calibrate::fit_nonneg(&rows, &t);
    for (a, b) in x.iter().zip(truth) {
        assert!((a / b - 1.0).abs() < 1e-6, "{x:?} vs {truth:?}");
    }
    // data no non-negative line explains: still non-negative
    let x = calibrate::fit_nonneg(&rows, &[1.0, 1e-9, 1.0, 1e-9, 1.0]);
    assert!(x.iter().all(|v| *v >= 0.0), "{x:?}");
}

/// A chain of convolutions whose weights (and their gradient chunks) weigh as much as their
/// activations: caps between the smallest plan and the plan without recomputation, some where
/// chunks alone fit but only at a few columns each.
const CHAIN: &str = "input x: [8, 8, 64]\ntarget y: int\n\
    out = x |> repeat 4 { conv2d(128, 3) |> relu } |> global_avgpool |> dense(10)\n\
    loss cross_entropy(out, y)\n\
    train { batch: 8, optimizer: sgd(lr: 0.01, momentum: 0.9) }\n";

fn at(
    m: &dmc_grammar::model::Model,
    cap: Option<u64>,
    remat: RematMode,
) -> Result<Plan, CompileError> {
    compile(
        m,
        &CompileOptions {
            mode: Mode::Train,
            cap,
            remat,
            // resident: chunking against recomputation (streaming is what comes after both)
            stream: false,
            ..CompileOptions::default()
        },
    )
}

#[test]
fn the_fitter_never_picks_a_plan_predicted_slower_than_chunking_alone() {
    let m = model(CHAIN);
    let r = CpuRates::nominal();
    let full = at(&m, None, RematMode::Off).expect("uncapped");
    let min = match at(&m, Some(1), RematMode::Auto) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        other => panic!("{:?}", other.map(|p| p.arena_bytes)),
    };
    let mut chose_remat = false;
    for i in 0..=12u64 {
        let cap = min + (full.arena_bytes - min) * i / 12;
        let auto = at(&m, Some(cap), RematMode::Auto).expect("fits at or above the floor");
        assert!(auto.arena_bytes <= cap);
        if i == 0 {
            // the floor's plan leaves out the GPU split-K room: the backends still take it
            let split_room = at(&m, None, RematMode::Off).expect("uncapped");
            let mut be = dmc_runtime::CpuBackend::new(auto.clone()).expect("a valid plan");
            be.init_params(1);
            assert!(be.run(1, 0).expect("runs").is_finite());
            assert!(auto.arena_bytes < split_room.arena_bytes);
        }
        let t = plan_time(&auto, &r).step_s;
        if let Ok(off) = at(&m, Some(cap), RematMode::Off) {
            let t_off = plan_time(&off, &r).step_s;
            assert!(
                t <= t_off * (1.0 + 1e-9),
                "cap {cap}: chose {t} s over chunking's {t_off} s"
            );
            chose_remat |= dmc_compiler::recompute_flops(&auto) > 0;
        }
    }
    // the caps include one where chunking alone fits but recomputing is faster
    assert!(
        chose_remat,
        "no cap where recomputation beat chunks that fit: the test does not test the choice"
    );
}

#[test]
fn deep_convnets_floor_plan_leaves_out_the_split_room_and_the_backends_take_it() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/deep_convnet.dm"
    ))
    .expect("example");
    let m = model(&src);
    let floor = match at(&m, Some(1), RematMode::Auto) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        other => panic!("{:?}", other.map(|p| p.arena_bytes)),
    };
    let p = at(&m, Some(floor), RematMode::Auto).expect("fits its floor");
    // some workspace is smaller than the GPU split-K room would make it
    let short = p.kernels.iter().any(|k| {
        let ws: Vec<usize> = k
            .signature
            .params
            .iter()
            .zip(&k.arg_shapes)
            .filter(|(s, _)| s.role == dmc_plan::op::Role::Workspace)
            .map(|(_, sh)| sh.iter().product())
            .collect();
        let others: Vec<Vec<usize>> = k
            .signature
            .params
            .iter()
            .zip(&k.arg_shapes)
            .filter(|(s, _)| s.role != dmc_plan::op::Role::Workspace)
            .map(|(_, sh)| sh.clone())
            .collect();
        ws.iter()
            .zip(k.op.workspace_elems(&others))
            .any(|(have, room)| *have < room)
    });
    assert!(
        short,
        "the floor plan should be the one without the split room"
    );
    dmc_runtime::check_plan(&p).expect("the CPU backend takes the plan without the room");
}

/// The terms the in-place calibration fits are the model: every kernel's time at any rates is
/// the dot product of its terms with the rates' weights, and rates rebuilt from those weights
/// predict the same times.
#[test]
fn a_launchs_time_is_its_terms_weighed_by_the_rates() {
    let m = model(
        "input x: [16, 16, 8]\ntarget y: int\n\
         out = x |> conv2d(16, 3, activation: relu) |> conv2d(16, 3, groups: 16) |> batchnorm\n\
           |> relu |> maxpool(2) |> flatten |> dense(32, activation: relu) |> dense(10)\n\
         loss cross_entropy(out, y)\ntrain { batch: 8, optimizer: adam(lr: 0.001) }\n",
    );
    let p = compile(&m, &CompileOptions::default()).expect("compile");
    let measured = CpuRates {
        threads: 4,
        micro_tile: 16,
        ..CpuRates::nominal()
    };
    for r in [CpuRates::nominal(), measured] {
        let c = r.coefs();
        let rebuilt = r.with_coefs(&c);
        for k in &p.kernels {
            let w = k.cpu_work();
            let dot: f64 = r.terms(&w).iter().zip(&c).map(|(t, c)| t * c).sum();
            let s = r.work_s(&w);
            assert!((dot - s).abs() <= 1e-9 * s, "{}: {dot} vs {s}", k.name);
            assert!((rebuilt.work_s(&w) - s).abs() <= 1e-9 * s, "{}", k.name);
        }
    }
}

/// The fit of all its weights recovers them from times they generate (each kernel's error on
/// its step's scale, as the in-place calibration weighs them, and relative to itself), and stays
/// non-negative on times no non-negative weights explain.
#[test]
fn the_fit_of_every_term_recovers_known_weights() {
    let r = CpuRates::nominal();
    let m = model(
        "input x: [16, 16, 8]\ntarget y: int\n\
         out = x |> conv2d(16, 3, activation: relu) |> conv2d(16, 3, groups: 16)\n\
           |> conv2d(32, 3, groups: 16) |> batchnorm\n\
           |> relu |> maxpool(2) |> flatten |> dense(32, activation: relu) |> dense(10)\n\
         loss cross_entropy(out, y)\ntrain { batch: 8, optimizer: sgd(lr: 0.01, momentum: 0.9) }\n",
    );
    let p = compile(&m, &CompileOptions::default()).expect("compile");
    let rows: Vec<[f64; dmc_plan::cpu::TERMS]> =
        p.kernels.iter().map(|k| r.terms(&k.cpu_work())).collect();
    let truth = CpuRates {
        gemm_flops: 70e9,
        pack_bytes: 25e9,
        gemm_call_s: 1.3e-6,
        im2col_elems: 3e9,
        im2col_fwd_elems: 2e9,
        col2im_elems: 5e9,
        direct_madds: 6e9,
        stream_bytes: 12e9,
        loop_s: 2e-6,
        launch_s: 4e-7,
        pack_run_bytes: 9e9,
        ..r.clone()
    }
    .coefs();
    let t: Vec<f64> = rows
        .iter()
        .map(|row| row.iter().zip(&truth).map(|(a, b)| a * b).sum())
        .collect();
    let step: f64 = t.iter().sum();
    for x in [
        calibrate::fit_nonneg_n(&rows, &t),
        calibrate::fit_nonneg_scaled(&rows, &t, &vec![step; t.len()]),
    ] {
        // every weight some kernel exercises is recovered (the depthwise conv's direct
        // multiply-adds among them)
        assert!(rows.iter().any(|row| row[6] > 0.0), "no direct term");
        for i in 0..truth.len() {
            if rows.iter().any(|row| row[i] > 0.0) {
                assert!(
                    (x[i] / truth[i] - 1.0).abs() < 1e-4,
                    "term {i}: {x:?} vs {truth:?}"
                );
            }
        }
    }
    let noise: Vec<f64> = t
        .iter()
        .enumerate()
        .map(|(i, v)| if i % 2 == 0 { v * 9.0 } else { v * 1e-3 })
        .collect();
    assert!(calibrate::fit_nonneg_n(&rows, &noise)
        .iter()
        .all(|v| *v >= 0.0));
}

/// The CPU backend runs a depthwise convolution (one channel per group) directly: the model
/// gives it no GEMM and no gather, only its multiply-adds (one per tap, channel and output pixel)
/// and the bytes it streams; a grouped convolution with more channels per group keeps its GEMMs.
/// Batchnorm's sums over at most `BN_SUM_BLOCK` channels run on one thread: their bytes are
/// weighed as the threads' share; its normalised values are written over blocks of rows in
/// parallel, and over more channels the sums run in parallel blocks too.
#[test]
fn depthwise_convolutions_are_direct_work_and_batchnorm_sums_few_channels_on_one_thread() {
    let m = model(
        "input x: [16, 16, 8]\ntarget y: int\n\
         out = x |> conv2d(16, 3, padding: 1) |> conv2d(16, 3, padding: 1, groups: 16, bias: false)\n\
           |> conv2d(16, 3, groups: 8)\n\
           |> batchnorm |> relu |> global_avgpool |> dense(10)\n\
         loss cross_entropy(out, y)\ntrain { batch: 4, optimizer: adam(lr: 0.001) }\n",
    );
    let p = compile(&m, &CompileOptions::default()).expect("compile");
    // the depthwise conv's kernels, by its weight's shape
    let depthwise: Vec<_> = p
        .kernels
        .iter()
        .filter(|k| k.name.starts_with("conv2d"))
        .filter(|k| k.arg_shapes.iter().any(|s| s == &vec![3, 3, 1, 16]))
        .collect();
    assert_eq!(depthwise.len(), 3, "forward, data gradient, fused update");
    for k in &depthwise {
        let w = k.cpu_work();
        assert!(
            w.gemms.is_empty() && w.im2col + w.im2col_fwd + w.col2im == 0,
            "{}",
            k.name
        );
        // 4 images of 16 x 16 (padded: the output is the input's size), 16 channels, 9 taps
        assert_eq!(w.direct, 4 * 16 * 16 * 16 * 9, "{}", k.name);
        assert!(w.streamed > 0, "{}", k.name);
    }
    let grouped = p
        .kernels
        .iter()
        .find(|k| {
            k.name.starts_with("conv2d") && k.arg_shapes.iter().any(|s| s == &vec![3, 3, 2, 16])
        })
        .expect("the grouped conv");
    let w = grouped.cpu_work();
    assert!(!w.gemms.is_empty() && w.direct == 0, "{}", grouped.name);
    let bn = p
        .kernels
        .iter()
        .find(|k| k.name.starts_with("batchnorm_"))
        .expect("batchnorm");
    let w = bn.cpu_work();
    let x = 4 * bn.arg_shapes[0].iter().product::<usize>() as u64;
    assert_eq!(bn.arg_shapes[0].last(), Some(&16));
    // the sum and the squared deviations on one thread, y (x read, y written) in one loop
    assert!(
        w.serial == 2 * x && w.streamed == 2 * x && w.loops == 1,
        "{w:?}"
    );
    let wide = dmc_plan::op::NormOp::BatchNorm {
        eps: dmc_plan::unary::Coef(1e-5),
        ranks: 1,
    }
    .cpu_work(&[vec![4, 14, 14, 64], vec![64], vec![64]], &[]);
    let xw = 4 * 4 * 14 * 14 * 64;
    assert!(
        wide.serial == 0 && wide.streamed == 4 * xw && wide.loops == 3,
        "{wide:?}"
    );
    let w = CpuWork {
        streamed: 0,
        loops: 0,
        ..w
    };
    let r = CpuRates::nominal();
    let one = CpuRates {
        threads: 1,
        ..r.clone()
    };
    // one thread streams what the pool streams, at the pool's rate / threads
    assert!((r.work_s(&w) - r.launch_s) > 1.9 * (one.work_s(&w) - one.launch_s));
}

/// Few rows against a weight larger than a cache (the seed network's 37.7 MB convolutions at 16
/// rows) are bound by reading it from memory: a GEMM block's B counts as streamed bytes once the
/// whole B is larger than `CACHED_OPERAND_BYTES`, every block of a wave reading its own columns;
/// a smaller B counts nothing; the launch's time is still its terms weighed by the rates.
#[test]
fn a_gemm_against_a_weight_larger_than_a_cache_streams_it() {
    use dmc_plan::cpu::CACHED_OPERAND_BYTES;
    let r = CpuRates::nominal();
    assert_eq!(r.threads, 2);
    let work = |n, k| CpuWork {
        gemms: vec![GemmCalls {
            m: 16,
            n,
            k,
            calls: 1,
            outer: 1,
            accumulate: false,
            per_thread_rows: false,
            a_t: false,
            b_t: false,
        }],
        ..Default::default()
    };
    // 9216 x 1024: two column blocks of 512 at once, 18.9 MB each
    let big = work(1024, 9216);
    const { assert!(4 * 9216 * 512 > CACHED_OPERAND_BYTES) };
    assert_eq!(r.terms(&big)[7], (2 * 4 * 9216 * 512) as f64);
    // 1024 x 256: blocks of 128 columns, 512 KiB each, cached
    let small = work(256, 1024);
    assert_eq!(r.terms(&small)[7], 0.0);
    // 1024 x 9216 (a data gradient's w^T): blocks of 512 columns, 2 MiB each, but the whole B is
    // 37.7 MB: every block's columns come from memory, the whole B once a call
    let wide = work(9216, 1024);
    const { assert!(4 * 1024 * 512 <= CACHED_OPERAND_BYTES) };
    assert_eq!(r.terms(&wide)[7], (4 * 1024 * 9216) as f64);
    for w in [big, small, wide] {
        let dot: f64 = r.terms(&w).iter().zip(r.coefs()).map(|(t, c)| t * c).sum();
        let s = r.work_s(&w);
        assert!((dot - s).abs() <= 1e-9 * s, "{dot} vs {s}");
    }
}

/// A gather's short runs cost as much as a line: a first layer's im2col copies 3-channel runs,
/// each costed at `MIN_RUN_ELEMS` elements (its copy's overhead, not its floats), while a
/// 32-channel layer's runs count their elements.
#[test]
fn a_gathers_short_runs_cost_a_line_each() {
    use dmc_plan::cpu::MIN_RUN_ELEMS;
    let work = |ci: usize| {
        let x = vec![2, 8, 8, ci];
        let y = vec![2, 6, 6, 16];
        let op = ConvOp::Conv2dBwdWeight {
            geom: ConvGeom::square(3, 1, 0),
        };
        op.cpu_work(&[x, y], &[vec![3, 3, ci, 16]])
    };
    let rows = 2 * 6 * 6;
    assert_eq!(work(3).im2col, (rows * 9 * MIN_RUN_ELEMS) as u64);
    assert_eq!(work(32).im2col, (rows * 9 * 32) as u64);
}

/// A fused update's block of fewer than `SERIAL_UPDATE_ELEMS` elements runs on the calling
/// thread: no parallel loop, its elements streamed (a row's at a time, vectorized) and a line
/// touched per row of each array when the block is strided; a larger block is one
/// parallel loop streaming its lines. A dense layer's update in one-column chunks costs one
/// micro-tile-wide GEMM per column and no loop; its chunks cost more per column as they narrow.
#[test]
fn a_small_update_block_runs_serially_and_costs_its_rows_lines() {
    use dmc_plan::cpu::{strided_bytes, update_block_work, SERIAL_UPDATE_ELEMS};
    let (streamed, loops) = update_block_work(784, 1, 256, 2);
    assert_eq!(loops, 0);
    assert_eq!(streamed, 2 * 784 * 64 + 2 * 2 * 784 * 4);
    // a whole-width block touches no line beyond its elements
    assert_eq!(update_block_work(4, 16, 16, 3), (2 * 3 * 4 * 16 * 4, 0));
    let big = SERIAL_UPDATE_ELEMS / 64;
    let (streamed, loops) = update_block_work(big, 64, 256, 2);
    assert_eq!(loops, 1);
    assert_eq!(streamed, 2 * 2 * strided_bytes(big, 64, 256));

    let op = |chunk| dmc_plan::op::DenseOp::DenseBwdWeightUpdate {
        shards: 1,
        keep_rows: false,
        rule: sgd_momentum(),
        chunk,
        bias: false,
    };
    let (x, dy, w) = (vec![64, 784], vec![64, 256], vec![784, 256]);
    let work = |chunk| {
        op(chunk).cpu_work(
            &[x.clone(), dy.clone(), w.clone(), w.clone()],
            &[w.clone(), w.clone()],
        )
    };
    let one = work(1);
    assert_eq!(one.loops, 0, "{one:?}");
    assert_eq!(one.gemms.len(), 1);
    assert_eq!((one.gemms[0].n, one.gemms[0].calls), (1, 256));
    let r = CpuRates::nominal();
    let per_col = |c: usize| r.work_s(&work(c)) / 256.0;
    assert!(
        per_col(1) > per_col(8) && per_col(8) > per_col(64),
        "{}",
        per_col(1)
    );
}

/// A kernel whose loops stream less than `SPLIT_BYTES` runs them as one task on the calling
/// thread: the model counts no parallel loop for it; a larger one pays each of its loops.
#[test]
fn only_loops_that_split_pay_the_pools_hand_off() {
    use dmc_plan::cpu::SPLIT_BYTES;
    let r = CpuRates::nominal();
    let small = CpuWork::stream(SPLIT_BYTES / 2);
    let large = CpuWork::stream(SPLIT_BYTES * 2);
    assert_eq!(r.terms(&small)[8], 0.0);
    assert_eq!(r.terms(&large)[8], 1.0);
}

#[test]
fn a_transposed_operand_is_packed_at_the_other_rate_and_no_byte_is_lost() {
    let r = CpuRates::nominal();
    let (m, n, k) = (96, 40, 72);
    let (a, b, c) = (
        4.0 * (m * k) as f64,
        4.0 * (k * n) as f64,
        4.0 * (m * n) as f64,
    );
    // the micro-benchmark's layout: A (row-major) gathered, B (row-major) in runs
    let plain = r.gemm_terms(m, n, k, false);
    assert_eq!((plain[1], plain[3]), (a + c, b));
    // a weight gradient's x^T: A in runs too
    let at = r.gemm_terms_of(m, n, k, false, (true, false));
    assert_eq!((at[1], at[3]), (c, a + b));
    // a data gradient's w^T: B gathered too
    let bt = r.gemm_terms_of(m, n, k, false, (false, true));
    assert_eq!((bt[1], bt[3]), (a + b + c, 0.0));
    let both = r.gemm_terms_of(m, n, k, true, (true, true));
    assert_eq!((both[1], both[3]), (b + 2.0 * c, a));
    for t in [plain, at, bt, both] {
        assert_eq!(
            (t[0], t[2]),
            (plain[0], 1.0),
            "FLOPs and the call do not move"
        );
    }
    // the ops say which: a dense layer's data and weight gradients
    let shapes = |x: &[usize], y: &[usize]| (x.to_vec(), y.to_vec());
    let (x, y) = shapes(&[32, 64], &[32, 16]);
    let bwd_data = dmc_plan::op::DenseOp::DenseBwdData {
        epi: dmc_plan::op::Epilogue::NONE,
    }
    .cpu_work(&[y.clone(), vec![64, 16]], std::slice::from_ref(&x));
    assert!(
        bwd_data.gemms.iter().all(|g| g.b_t && !g.a_t),
        "{bwd_data:?}"
    );
    let bwd_weight = dmc_plan::op::DenseOp::DenseBwdWeight.cpu_work(&[x, y], &[vec![64, 16]]);
    assert!(
        bwd_weight.gemms.iter().all(|g| g.a_t && !g.b_t),
        "{bwd_weight:?}"
    );
}

#[test]
fn a_kernel_whose_operands_stay_in_the_caches_streams_at_the_cached_rate() {
    let p = small_plan();
    let r = CpuRates {
        cached_stream_bytes: 4.0 * CpuRates::nominal().stream_bytes,
        ..CpuRates::nominal()
    };
    // every kernel of this small step is cached; none is with a cache of 0 bytes
    assert!(p.kernels.iter().all(|k| r.kernel_cached(k)));
    let in_cache = plan_time(&p, &r).step_s;
    let none = CpuRates {
        cache_bytes: 0,
        ..r.clone()
    };
    assert!(p.kernels.iter().all(|k| !none.kernel_cached(k)));
    let from_memory = plan_time(&p, &none).step_s;
    assert!(in_cache < from_memory, "{in_cache} vs {from_memory}");
    // the threshold is the kernel's operands' bytes: one byte less, from memory
    let conv = p
        .kernels
        .iter()
        .find(|k| k.name == "conv2d_0")
        .expect("conv");
    let bytes: usize = conv
        .arg_shapes
        .iter()
        .map(|s| 4 * s.iter().product::<usize>())
        .sum();
    let exact = CpuRates {
        cache_bytes: bytes as u64,
        ..r.clone()
    };
    assert!(exact.kernel_cached(conv));
    let less = CpuRates {
        cache_bytes: bytes as u64 - 1,
        ..r.clone()
    };
    assert!(!less.kernel_cached(conv));
    // the difference is the streamed bytes' alone: at equal rates the two agree
    let equal = CpuRates {
        cached_stream_bytes: r.stream_bytes,
        ..r.clone()
    };
    let a = plan_time(&p, &equal).step_s;
    let b = plan_time(
        &p,
        &CpuRates {
            cache_bytes: 0,
            ..equal.clone()
        },
    )
    .step_s;
    assert!((a - b).abs() <= 1e-12 * a, "{a} vs {b}");
    // each kernel: its streamed bytes move from term 7 to term 11, nothing else changes
    for k in &p.kernels {
        let w = k.cpu_work();
        let (mem, cache) = (r.terms_in(&w, false), r.terms_in(&w, true));
        let streamed = (w.streamed + w.serial * r.threads as u64) as f64;
        assert_eq!(cache[11], streamed, "{}", k.name);
        assert_eq!(mem[11], 0.0, "{}", k.name);
        assert!(
            (mem[7] - cache[7] - streamed).abs() <= 1e-9 * streamed.max(1.0),
            "{}",
            k.name
        );
        for i in (0..11).filter(|&i| i != 7) {
            assert_eq!(mem[i], cache[i], "{} term {i}", k.name);
        }
    }
}
