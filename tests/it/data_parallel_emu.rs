//! Data parallel on the CUDA path without a GPU: each rank an emulated CUDA backend
//! (`dmc_runtime::emu`, the generated kernels compiled by g++) on its own thread, the sharded
//! steps' programs running their collectives with the in-process group (`LocalComm`) where the
//! CUDA backend calls NCCL (the only difference between the two paths). Each run must end with
//! the weights of one process on the CPU backend training on the whole batches (up to the
//! summation order), every rank holding bit-identical weights and its shard of the state.
//!
//! Needs g++ (ignored without it, unless `CI` is set); the NVRTC compilation of the same
//! programs is in `runtime_nvrtc.rs`.

use std::sync::Arc;

use dmc_codegen::{render_plan, CodegenOptions, Phase};
use dmc_compiler::plan::Plan;
use dmc_runtime::comm::Collective;
use dmc_runtime::compare::Batch;
use dmc_runtime::emu::EmuBackend;
use dmc_runtime::Backend;

use super::data_parallel::{batches, on_ranks, plan, plan_capped, rel, train, train_on, CONV, GPT};

/// Every parameter and every step's loss after training `plan` on `data` on the emulator, as one
/// rank of `comm`; and the elements of this rank's optimizer state.
fn train_emu(plan: Plan, data: &[Batch], comm: Arc<dyn Collective>) -> (Vec<f32>, Vec<f32>, usize) {
    let mut be = EmuBackend::new(plan).expect("emulated backend");
    be.set_threads(1);
    Backend::set_collective(&mut be, comm).expect("ranks");
    let (w, losses) = train_on(&mut be, data);
    let state = Backend::opt_states(&be)
        .expect("state")
        .iter()
        .map(|(_, _, d)| d.len())
        .sum();
    (w, losses, state)
}

/// `n` emulated ranks on threads, each on its part of `data`.
fn emu_ranks(plan: &Plan, data: &[Batch], n: usize) -> Vec<(Vec<f32>, Vec<f32>, usize)> {
    on_ranks(n, data, |mine, c| train_emu(plan.clone(), &mine, c))
}

/// The largest number of chunks a sharded step of `p` works through.
fn most_chunks(p: &Plan) -> usize {
    render_plan(p, &CodegenOptions::default())
        .expect("render")
        .iter()
        .map(|k| {
            k.program
                .iter()
                .filter(|ph| matches!(ph, Phase::Launch(l) if l.entry.ends_with("_grad")))
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// `p` (a 2-rank plan of `src`) on two emulated ranks against one CPU process on the whole
/// batches.
fn emulated_ranks_train_like_one_process(src: &str, train_line: &str, fuse: bool, p: Plan) {
    let one = plan(src, train_line, 1, fuse).expect("one process");
    let data = batches(&one);
    let (w1, l1) = train(one.clone(), &data, None);
    assert!(
        p.kernels.iter().any(|k| k.op.shards() == 2),
        "the updates are sharded"
    );
    let all = emu_ranks(&p, &data, 2);
    let whole: usize = one
        .opt_state
        .iter()
        .map(|b| b.shape.iter().product::<usize>())
        .sum();
    for (r, (w, l, state)) in all.iter().enumerate() {
        assert_eq!(w, &all[0].0, "rank {r} holds rank 0's weights, bit for bit");
        for (a, b) in l.iter().zip(&l1) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "rank {r}: loss {a} against one process's {b}"
            );
        }
        assert!(
            *state < whole && *state * 2 <= whole + 2 * p.opt_state.len(),
            "rank {r} holds {state} of the {whole} state elements: not its half"
        );
    }
    let e = rel(&all[0].0, &w1);
    assert!(
        e < 1e-5,
        "2 emulated ranks ({train_line}, fuse {fuse}): weights {e:e} from one CPU process's"
    );
}

fn check(src: &str, train_line: &str, fuse: bool) {
    let p = plan(src, train_line, 2, fuse).expect("data parallel");
    emulated_ranks_train_like_one_process(src, train_line, fuse, p);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn fused_conv_and_dense_updates_with_momentum_on_the_emulated_gpu() {
    check(
        CONV,
        "batch: 6, optimizer: sgd(lr: 0.05, momentum: 0.9, weight_decay: 0.001)",
        true,
    );
}

/// A grouped convolution (its gradient one thread per element: a row's group is its column's) and
/// a stride-2 padded one (the tiled gradient's implicit rows in the padding).
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn grouped_and_strided_convolutions_on_the_emulated_gpu() {
    let src = "input x: [8, 8, 4]\ntarget y: int\n\
         out = x |> conv2d(4, 3, padding: 1, groups: 4, activation: relu) |> conv2d(6, 3, stride: 2, padding: 1) |> flatten |> dense(3)\n\
         loss cross_entropy(out, y)\n";
    check(
        src,
        "batch: 4, optimizer: sgd(lr: 0.05, momentum: 0.9)",
        true,
    );
}

/// Unfused: whole-tensor updates and bias-gradient updates, their gradients summed into the
/// planned workspace; with accumulated micro-batches the accumulated gradient is consumed.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn unfused_adam_with_accumulation_on_the_emulated_gpu() {
    check(
        CONV,
        "batch: 6, accumulate: 2, optimizer: adam(lr: 0.01)",
        false,
    );
}

/// `clip_norm`: the held gradients all-reduced (a step that is the collective alone), then
/// updates of gradients already summed.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn clip_norm_all_reduces_on_the_emulated_gpu() {
    check(
        CONV,
        "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9), clip_norm: 0.05",
        true,
    );
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_transformer_on_the_emulated_gpu() {
    // (SGD: see `data_parallel.rs` on Adam and an embedding's cancelling gradients)
    check(
        GPT,
        "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9, weight_decay: 0.01)",
        true,
    );
}

/// Under a cap the gradient chunks narrow: a step works through several chunks, each summed over
/// the ranks before its rows are updated.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn several_chunks_under_a_cap_on_the_emulated_gpu() {
    let mlp = "input x: [64]\ntarget y: int\n\
         out = x |> dense(256, activation: relu) |> dense(256, activation: relu) |> dense(4)\n\
         loss cross_entropy(out, y)\n";
    let line = "batch: 6, optimizer: adam(lr: 0.01)";
    let free = plan(mlp, line, 2, true).expect("uncapped");
    let cap = (free.arena_bytes as f64 * 0.7) as u64;
    let p = plan_capped(mlp, line, 2, true, Some(cap)).expect("capped");
    assert!(
        most_chunks(&p) > 1 && most_chunks(&p) > most_chunks(&free),
        "the cap narrows a chunk ({} chunks capped, {} not)",
        most_chunks(&p),
        most_chunks(&free)
    );
    emulated_ranks_train_like_one_process(mlp, line, true, p);
}

/// Batchnorm normalises by the whole batch's statistics on every rank (its per-channel f64 sums
/// all-reduced between the program's launches, forward and backward; the running statistics are
/// one process's), and dropout draws one process's masks (each rank's elements keyed by their
/// place in the global batch).
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn batchnorm_and_dropout_on_the_emulated_gpu() {
    let bn = "input x: [6, 6, 2]\ntarget y: int\n\
         out = x |> conv2d(4, 3) |> batchnorm |> relu |> flatten |> dense(8) |> batchnorm |> dense(3)\n\
         loss cross_entropy(out, y)\n";
    let line = "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9)";
    let p = plan(bn, line, 2, true).expect("plan");
    let programs = render_plan(&p, &CodegenOptions::default())
        .expect("render")
        .iter()
        .filter(|k| k.name.starts_with("batchnorm") && !k.program.is_empty())
        .count();
    assert!(
        programs >= 4,
        "{programs} batchnorm programs (two forwards, two backwards)"
    );
    emulated_ranks_train_like_one_process(bn, line, true, p);
    let drop = "input x: [12]\ntarget y: int\n\
         out = x |> dense(16, activation: relu) |> dropout(0.3) |> dense(4)\n\
         loss cross_entropy(out, y)\n";
    check(
        drop,
        "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9)",
        true,
    );
}

/// The running statistics after training on emulated ranks are one process's: they are saved
/// with the weights (`params` includes them), so the weights check above covers them; here the
/// plan's count is the whole batch's rows.
#[test]
fn a_data_parallel_batchnorm_counts_the_whole_batch() {
    let bn = "input x: [12]\ntarget y: int\nout = x |> dense(8) |> batchnorm |> dense(3)\nloss cross_entropy(out, y)\n";
    let count = |ranks: usize| {
        plan(bn, "batch: 6, optimizer: sgd(lr: 0.1)", ranks, true)
            .expect("plan")
            .kernels
            .iter()
            .find_map(|k| match k.op {
                dmc_plan::op::Op::Norm(dmc_plan::op::NormOp::BatchNormStats { count, .. }) => {
                    Some(count)
                }
                _ => None,
            })
            .expect("a running statistics' update")
    };
    assert_eq!(count(1), 6);
    assert_eq!(count(2), 6, "2 ranks of 3 rows each: the whole batch's 6");
    assert_eq!(count(3), 6);
}

/// A 2-rank plan on an emulated backend without its ranks is refused before any step.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_two_rank_plan_does_not_run_alone_on_the_emulator() {
    let p = plan(CONV, "batch: 6, optimizer: sgd(lr: 0.1)", 2, true).expect("plan");
    let mut be = EmuBackend::new(p).expect("emulated backend");
    Backend::init_params(&mut be, 1).expect("init");
    let e = be.run(1, 1).expect_err("alone").to_string();
    assert!(e.contains("mpirun -np 2"), "{e}");
}

/// Sharded parameters (ZeRO-3) on the emulated GPU: the gather and keep programs (this rank's
/// rows placed in the window, then the all-gather; this rank's rows of an updated window back
/// home) give every rank's rows, and the weights are the CPU ranks' bit for bit.
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn sharded_parameters_on_the_emulated_gpu() {
    use super::data_parallel_zero3::{whole, zero3};
    let line = "batch: 6, optimizer: sgd(lr: 0.05, momentum: 0.9)";
    let p = zero3(CONV, line, 2, true, None);
    let one = plan(CONV, line, 1, true).expect("one process");
    let data = batches(&one);
    let (w1, _) = train(one, &data, None);
    let bufs = |be: &dyn Backend| -> Vec<Vec<f32>> {
        be.params()
            .expect("params")
            .into_iter()
            .map(|(_, _, d)| d.to_vec())
            .collect()
    };
    let emu = on_ranks(2, &data, |mine, c| {
        let mut be = EmuBackend::new(p.clone()).expect("emulated backend");
        be.set_threads(1);
        Backend::set_collective(&mut be, c).expect("ranks");
        train_on(&mut be, &mine);
        bufs(&be)
    });
    let cpu = on_ranks(2, &data, |mine, c| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        pool.install(|| {
            let mut be = dmc_runtime::CpuBackend::new(p.clone()).expect("backend");
            be.set_collective(c);
            train_on(&mut be, &mine);
            bufs(&be)
        })
    });
    let (we, wc) = (whole(&p, &emu), whole(&p, &cpu));
    let e = rel(&we, &w1);
    assert!(e < 1e-5, "emulated ranks: {e:e} from one CPU process");
    assert!(rel(&we, &wc) < 1e-5, "emulated and CPU ranks agree");
}
