//! Data parallel (ZeRO-1) in one process: N ranks, each a CPU backend on its own thread with an
//! in-process group (`LocalComm`), train on their parts of the same global batches and must end
//! with the weights of one process training on the whole batches (up to the summation order of
//! the gradients), every rank holding bit-identical weights and 1/N of the optimizer state. The
//! fused weight-gradient + update (dense and conv, with and without a folded bias), the unfused
//! update (`--no-fuse`, layernorm's scale, accumulated gradients), the bias update of a position
//! embedding and an embedding table's are all sharded updates here; dropout draws one process's
//! masks. The MPI runs of the examples are in
//! `data_parallel_mpi.rs`.

use std::sync::Arc;

use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::{compile, CompileError, CompileOptions};
use dmc_runtime::comm::local::LocalComm;
use dmc_runtime::comm::Collective;
use dmc_runtime::compare::Batch;
use dmc_runtime::{Backend, CpuBackend, RunPass};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const STEPS: u64 = 3;

pub(super) const CONV: &str = "input x: [6, 6, 2]\ntarget y: int\n\
     out = x |> conv2d(4, 3, activation: relu) |> conv2d(5, 3) |> flatten |> dense(7, activation: relu) |> dense(3)\n\
     loss cross_entropy(out, y)\n";

pub(super) const GPT: &str = "input t: int[8]\ntarget n: int[8]\n\
     x = t |> embedding(16, 8) |> pos_embedding\n\
     h = x + (x |> layernorm |> attention(2))\n\
     out = h + (h |> layernorm |> dense(12, activation: gelu) |> dense(8))\n\
     logits = out |> layernorm |> dense(16)\n\
     loss cross_entropy(logits, n)\n";

pub(super) fn plan(src: &str, train: &str, ranks: usize, fuse: bool) -> Result<Plan, CompileError> {
    plan_capped(src, train, ranks, fuse, None)
}

pub(super) fn plan_capped(
    src: &str,
    train: &str,
    ranks: usize,
    fuse: bool,
    cap: Option<u64>,
) -> Result<Plan, CompileError> {
    plan_with(
        src,
        train,
        CompileOptions {
            mode: Mode::Train,
            fuse,
            ranks,
            cap,
            ..CompileOptions::default()
        },
    )
}

/// The plan of `src` with the training settings `train`, compiled with `opts`.
pub(super) fn plan_with(
    src: &str,
    train: &str,
    opts: CompileOptions,
) -> Result<Plan, CompileError> {
    let src = format!("{src}train {{ {train} }}\n");
    let m = dmc_grammar::compile_source(&src, "t.dm")
        .unwrap_or_else(|d| panic!("{}", dmc_grammar::render_plain(&d)));
    compile(&m, &opts)
}

/// The global (micro-)batches of `STEPS` steps of `plan` (one process's plan: its batch is the
/// global batch; `accumulate` of them a step).
pub(super) fn batches(plan: &Plan) -> Vec<Batch> {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    (0..STEPS * plan.accumulate as u64)
        .map(|_| Batch::random(plan, &mut rng))
        .collect()
}

/// Rank `r` of `n`'s part of a global batch (every tensor's first axis split in `n` parts).
fn part(b: &Batch, r: usize, n: usize) -> Batch {
    let cut = |len: usize| {
        let per = len / n;
        r * per..(r + 1) * per
    };
    Batch(
        b.0.iter()
            .map(|(name, f, i)| {
                (
                    name.clone(),
                    f[cut(f.len())].to_vec(),
                    i[cut(i.len())].to_vec(),
                )
            })
            .collect(),
    )
}

/// Every parameter after training `plan` on `data` (each step's loss too), as one rank of
/// `comm` (or alone).
pub(super) fn train(
    plan: Plan,
    data: &[Batch],
    comm: Option<Arc<dyn Collective>>,
) -> (Vec<f32>, Vec<f32>) {
    let mut be = CpuBackend::new(plan).expect("backend");
    if let Some(c) = comm {
        be.set_collective(c);
    }
    train_on(&mut be, data)
}

/// Every parameter after training `be` (its parameters initialised here) on `data`, and each
/// step's loss: `accumulate` micro-batches a step, the last one updating (as `dmc run` does).
pub(super) fn train_on(be: &mut dyn Backend, data: &[Batch]) -> (Vec<f32>, Vec<f32>) {
    be.init_params(5).expect("init");
    let mut losses = vec![];
    let micro = be.plan().accumulate;
    for (s, step) in data.chunks(micro).enumerate() {
        for (j, b) in step.iter().enumerate() {
            be.set_run_pass(if j + 1 == micro {
                RunPass::Whole
            } else {
                RunPass::Accumulate
            });
            b.feed(|n, d| be.set_input(n, d)).expect("input");
            losses.push(be.run(s as u64 + 1, 9).expect("step"));
        }
    }
    let w = be
        .params()
        .expect("params")
        .into_iter()
        .flat_map(|(_, _, d)| d.to_vec())
        .collect();
    (w, losses)
}

/// `n` ranks on threads, each on its part of `data`: every rank's weights and losses.
fn ranks(plan: &Plan, data: &[Batch], n: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    on_ranks(n, data, |mine, c| {
        // each rank its own pool: a step runs on a worker of its pool and blocks there on the
        // others, so ranks sharing one pool could wait for each other's worker
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        pool.install(|| train(plan.clone(), &mine, Some(c)))
    })
}

/// `run` for each of `n` ranks of one in-process group, on threads, each with its part of
/// `data`: the ranks' results in rank order.
pub(super) fn on_ranks<T: Send>(
    n: usize,
    data: &[Batch],
    run: impl Fn(Vec<Batch>, Arc<dyn Collective>) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let run = &run;
        let handles: Vec<_> = LocalComm::group(n)
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                let mine: Vec<Batch> = data.iter().map(|b| part(b, r, n)).collect();
                s.spawn(move || run(mine, Arc::new(c)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    })
}

pub(super) fn rel(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (d / n.max(1e-30)).sqrt()
}

fn ranks_train_like_one_process(src: &str, train_line: &str, fuse: bool) {
    let one = plan(src, train_line, 1, fuse).expect("one process");
    let data = batches(&one);
    let (w1, l1) = train(one.clone(), &data, None);
    for n in [2, 3] {
        let p = plan(src, train_line, n, fuse).expect("data parallel");
        assert_eq!(p.ranks, n);
        assert_eq!(p.batch * n, one.batch, "each rank's part of the batch");
        assert!(
            p.kernels.iter().any(|k| k.op.shards() == n),
            "the updates are sharded"
        );
        let all = ranks(&p, &data, n);
        for (r, (w, l)) in all.iter().enumerate() {
            assert_eq!(
                w, &all[0].0,
                "rank {r} of {n} holds rank 0's weights, bit for bit"
            );
            for (a, b) in l.iter().zip(&l1) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "rank {r} of {n}: loss {a} against one process's {b}"
                );
            }
        }
        let e = rel(&all[0].0, &w1);
        assert!(
            e < 1e-6,
            "{n} ranks ({train_line}, fuse {fuse}): weights {e:e} from one process's"
        );
        // a fixed summation order: the same run again gives the same bits
        assert_eq!(
            ranks(&p, &data, n)[0].0,
            all[0].0,
            "reproducible at {n} ranks"
        );
    }
}

#[test]
fn fused_dense_and_conv_updates_with_momentum() {
    ranks_train_like_one_process(
        CONV,
        "batch: 6, optimizer: sgd(lr: 0.05, momentum: 0.9, weight_decay: 0.001)",
        true,
    );
}

#[test]
fn unfused_updates_with_adam() {
    ranks_train_like_one_process(CONV, "batch: 6, optimizer: adam(lr: 0.01)", false);
}

/// SGD here: Adam divides each element's step by its own gradient's magnitude, so an element whose
/// gradient nearly cancels (an embedding row whose positions pull both ways) moves by up to the
/// learning rate whichever way its rounding falls, and the weights would part by Adam's choice
/// of sign, not by the ranks' sums (the losses stay within 1e-6 either way). Adam is checked on
/// the convolutional network above.
#[test]
fn a_transformers_embedding_layernorm_and_attention() {
    ranks_train_like_one_process(
        GPT,
        "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9, weight_decay: 0.01)",
        true,
    );
}

/// Dropout draws, on each rank, the masks one process draws for those samples (the rank's
/// offset in the global batch), and accumulated micro-batches are summed over the ranks when the
/// last one updates.
#[test]
fn dropout_and_accumulated_micro_batches() {
    let src = "input x: [12]\ntarget y: int\n\
         out = x |> dense(16, activation: relu) |> dropout(0.3) |> dense(4)\n\
         loss cross_entropy(out, y)\n";
    ranks_train_like_one_process(
        src,
        "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9)",
        true,
    );
    ranks_train_like_one_process(
        CONV,
        "batch: 6, accumulate: 2, optimizer: adam(lr: 0.01)",
        true,
    );
}

/// Batchnorm normalises by the whole batch's statistics on every rank (the ranks' sums; its
/// running statistics are one process's, and they are compared too: they are saved with the
/// weights).
#[test]
fn batchnorm_takes_the_statistics_of_the_whole_batch() {
    let bn = "input x: [6, 6, 2]\ntarget y: int\n\
         out = x |> conv2d(4, 3) |> batchnorm |> relu |> flatten |> dense(3)\n\
         loss cross_entropy(out, y)\n";
    ranks_train_like_one_process(bn, "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9)", true);
}

/// `clip_norm` clips by the norm of the ranks' summed gradient: each held gradient is summed over
/// the ranks before the norm (a norm small enough that every step clips).
#[test]
fn clip_norm_takes_the_norm_of_the_summed_gradient() {
    ranks_train_like_one_process(
        CONV,
        "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9), clip_norm: 0.05",
        true,
    );
    ranks_train_like_one_process(
        GPT,
        "batch: 6, optimizer: sgd(lr: 0.1), clip_norm: 0.1, accumulate: 2",
        true,
    );
}

/// Under a cap a rank's plan narrows its gradient chunks (each chunk summed over the ranks on its
/// own) and streams its shards: it still trains like one process.
#[test]
fn a_capped_rank_chunks_and_streams_and_trains_the_same() {
    let mlp = "input x: [64]\ntarget y: int\n\
         out = x |> dense(256, activation: relu) |> dense(256, activation: relu) |> dense(4)\n\
         loss cross_entropy(out, y)\n";
    let train_line = "batch: 6, optimizer: adam(lr: 0.01)";
    let one = plan(mlp, train_line, 1, true).expect("one");
    let data = batches(&one);
    let (w1, _) = train(one, &data, None);
    let free = plan(mlp, train_line, 2, true).expect("uncapped");
    // (its floor is about 0.62 of the uncapped arena)
    for frac in [0.9, 0.7] {
        let cap = (free.arena_bytes as f64 * frac) as u64;
        let p = plan_capped(mlp, train_line, 2, true, Some(cap)).expect("capped");
        assert!(p.arena_bytes <= cap, "{} > cap {cap}", p.arena_bytes);
        let narrowed = p.kernels.iter().any(|k| {
            matches!(k.op, dmc_plan::op::Op::Dense(dmc_plan::op::DenseOp::DenseBwdWeightUpdate { chunk, .. }) if chunk < 256)
        });
        assert!(
            narrowed || p.streams(),
            "cap {cap}: neither narrower chunks nor streaming"
        );
        let all = ranks(&p, &data, 2);
        assert_eq!(all[0].0, all[1].0, "both ranks hold the same weights");
        let e = rel(&all[0].0, &w1);
        assert!(e < 1e-6, "cap {cap}: {e:e} from one process");
    }
}

#[test]
fn each_rank_holds_its_share_of_the_optimizer_state() {
    let train_line = "batch: 8, optimizer: adam(lr: 0.01)";
    let one = plan(CONV, train_line, 1, true).expect("one");
    let (_, whole) = dmc_plan::shard::state_bytes(&one);
    for n in [2, 4] {
        let p = plan(CONV, train_line, n, true).expect("ranks");
        let (mine, all) = dmc_plan::shard::state_bytes(&p);
        assert_eq!(all, whole, "the whole state is the same tensors");
        // each tensor's largest shard: at most one row of it more than an even split
        let slack: u64 = p
            .opt_state
            .iter()
            .map(|b| b.shard.map_or(0, |l| l.cols as u64 * 4))
            .sum();
        assert!(
            mine <= whole / n as u64 + slack,
            "{n} ranks: {mine} B of state per rank, whole {whole} B"
        );
        assert!(
            p.opt_state.iter().all(|b| b.shard.is_some()),
            "every state is sharded"
        );
        assert!(p.arena_bytes < one.arena_bytes, "a smaller arena per rank");
        assert!(dmc_plan::shard::sent_bytes(&p, 0) > 0);
    }
}

#[test]
fn what_data_parallel_does_not_do_yet_is_refused() {
    let err = |src: &str, train: &str, n: usize| -> String {
        match plan(src, train, n, true) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{train} over {n} ranks compiled"),
        }
    };
    let e = err(CONV, "batch: 6, optimizer: sgd(lr: 0.1)", 4);
    assert!(
        e.contains("batch of 6 does not split evenly") && e.contains("multiple of 4"),
        "{e}"
    );
}

/// A loss that is not finite on one rank's part of the batch is every rank's (the ranks' summed
/// loss): all of them halt before any update, their weights as they were.
#[test]
fn a_non_finite_loss_on_one_rank_halts_every_rank() {
    let p = plan(CONV, "batch: 4, optimizer: sgd(lr: 0.1)", 2, true).expect("plan");
    let one = plan(CONV, "batch: 4, optimizer: sgd(lr: 0.1)", 1, true).expect("one");
    let mut bad = batches(&one).remove(0);
    bad.0[0].1[0] = f32::NAN; // the first sample's input: rank 0's part
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = LocalComm::group(2)
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                let (p, b) = (p.clone(), part(&bad, r, 2));
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .expect("pool");
                s.spawn(move || {
                    pool.install(|| {
                        let mut be = CpuBackend::new(p).expect("backend");
                        be.set_collective(Arc::new(c));
                        be.init_params(5);
                        be.set_halt_on_nonfinite_loss(true);
                        let w0: Vec<f32> = be.params().flat_map(|(_, _, d)| d.to_vec()).collect();
                        b.feed(|n, d| be.set_input(n, d)).expect("input");
                        let l = be.run(1, 9).expect("step");
                        let w1: Vec<f32> = be.params().flat_map(|(_, _, d)| d.to_vec()).collect();
                        (l, w0 == w1)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect::<Vec<_>>()
    });
    for (r, (l, unchanged)) in results.iter().enumerate() {
        assert!(!l.is_finite(), "rank {r} sees the non-finite loss");
        assert!(unchanged, "rank {r} halted before its updates");
    }
}

#[test]
fn a_plan_of_two_ranks_refuses_to_run_alone() {
    let p = plan(CONV, "batch: 4, optimizer: sgd(lr: 0.1)", 2, true).expect("plan");
    let data = batches(&plan(CONV, "batch: 2, optimizer: sgd(lr: 0.1)", 1, true).expect("one"));
    let mut be = CpuBackend::new(p).expect("backend");
    be.init_params(1);
    data[0].feed(|n, d| be.set_input(n, d)).expect("input");
    let e = be.run(1, 1).expect_err("ran alone").to_string();
    assert!(e.contains("2 ranks") && e.contains("mpirun -np 2"), "{e}");
}
