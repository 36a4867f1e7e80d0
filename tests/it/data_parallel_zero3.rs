//! Sharded parameters (ZeRO-3, `--shard-parameters`) in one process: N ranks, each a CPU backend
//! on its own thread with an in-process group, keep only their rows of every updated parameter
//! and gather a parameter whole into a window for each cluster of its uses. The plan's shape is
//! checked (homes of a shard's size, every use reading a window its gather filled, updates kept
//! back), and training must give, bit for bit, the weights of the same ranks keeping the
//! parameters whole (ZeRO-1): the gathers and keeps move values, they compute nothing.

use std::sync::Arc;

use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::{compile, CompileOptions};
use dmc_plan::op::{Op, OptimOp};
use dmc_plan::plan::BufferKind;
use dmc_runtime::comm::Collective;
use dmc_runtime::compare::Batch;
use dmc_runtime::CpuBackend;

use super::data_parallel::{batches, on_ranks, plan, plan_with, rel, train, train_on, CONV, GPT};

/// `src` with `train` over `ranks` ranks, its parameters sharded.
pub(super) fn zero3(src: &str, train: &str, ranks: usize, fuse: bool, cap: Option<u64>) -> Plan {
    let opts = CompileOptions {
        mode: Mode::Train,
        fuse,
        ranks,
        cap,
        shard_params: true,
        ..CompileOptions::default()
    };
    plan_with(src, train, opts).expect("a plan with sharded parameters")
}

/// One rank's buffers of its parameters after training (this rank's rows of a sharded one).
fn train_rank(plan: Plan, data: &[Batch], c: Arc<dyn Collective>) -> Vec<Vec<f32>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    pool.install(|| {
        let mut be = CpuBackend::new(plan).expect("backend");
        be.set_collective(c);
        train_on(&mut be, data);
        be.params().map(|(_, _, d)| d.to_vec()).collect()
    })
}

/// The whole parameters of `p` from every rank's buffers: each sharded parameter's rows from the
/// rank that holds them; the others from rank 0, after checking every rank holds the same.
pub(super) fn whole(p: &Plan, ranks: &[Vec<Vec<f32>>]) -> Vec<f32> {
    let mut out = vec![];
    for (i, b) in p.params.iter().enumerate() {
        match b.shard {
            None => {
                for (r, mine) in ranks.iter().enumerate() {
                    assert_eq!(mine[i], ranks[0][i], "rank {r}: `{}` as rank 0's", b.name);
                }
                out.extend_from_slice(&ranks[0][i]);
            }
            Some(l) => {
                let mut full = vec![f32::NAN; l.rows * l.cols];
                for (r, mine) in ranks.iter().enumerate() {
                    let e = l.elems_of(r);
                    full[e.clone()].copy_from_slice(&mine[i][..e.len()]);
                }
                out.extend(full);
            }
        }
    }
    out
}

/// Sharded parameters against sharded state alone, and one process, at 2 and 3 ranks.
fn like_zero1(src: &str, train_line: &str, fuse: bool) {
    let one = plan(src, train_line, 1, fuse).expect("one process");
    let data = batches(&one);
    let (w1, _) = train(one, &data, None);
    for n in [2, 3] {
        let z1 = plan(src, train_line, n, fuse).expect("ZeRO-1");
        let z3 = zero3(src, train_line, n, fuse, None);
        assert!(
            z3.params.iter().any(|b| b.shard.is_some()),
            "{n} ranks: some parameter is sharded"
        );
        let w_z1 = on_ranks(n, &data, |mine, c| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("pool");
            pool.install(|| train(z1.clone(), &mine, Some(c)).0)
        });
        let w_z3 = whole(
            &z3,
            &on_ranks(n, &data, |mine, c| train_rank(z3.clone(), &mine, c)),
        );
        assert!(
            w_z3 == w_z1[0],
            "{n} ranks ({train_line}): sharded parameters train as whole ones, bit for bit ({:e} apart)",
            rel(&w_z3, &w_z1[0])
        );
        let e = rel(&w_z3, &w1);
        assert!(e < 1e-6, "{n} ranks: {e:e} from one process");
    }
}

#[test]
fn fused_conv_and_dense_updates_with_momentum() {
    like_zero1(
        CONV,
        "batch: 6, optimizer: sgd(lr: 0.05, momentum: 0.9)",
        true,
    );
}

#[test]
fn unfused_updates_with_adam_and_plain_sgd() {
    like_zero1(CONV, "batch: 6, optimizer: adam(lr: 0.01)", false);
    // (plain SGD keeps no optimizer state: the layouts come from the updates)
    like_zero1(CONV, "batch: 6, optimizer: sgd(lr: 0.05)", true);
}

/// (Adam on the transformer moves its weights by the sign of tiny gradients, which the ranks'
/// summation order flips: SGD here, as in `data_parallel.rs`.)
#[test]
fn a_transformer_and_accumulated_micro_batches() {
    like_zero1(
        GPT,
        "batch: 6, optimizer: sgd(lr: 0.1, momentum: 0.9, weight_decay: 0.01)",
        true,
    );
    like_zero1(
        CONV,
        "batch: 6, accumulate: 2, optimizer: adam(lr: 0.01)",
        true,
    );
}

/// The plan: each sharded parameter's home holds a shard (the largest rank's rows), only gathers
/// read it and only keeps write it; every other use reads a window, which a gather fills before
/// that use; a window an update writes is kept back after it; and the rank's arena is smaller
/// than with whole parameters, by about (N-1)/N of them less the windows in flight.
#[test]
fn homes_hold_shards_and_every_use_reads_a_gathered_window() {
    let train_line = "batch: 8, optimizer: adam(lr: 0.01)";
    let mlp = "input x: [256]\ntarget y: int\n\
         out = x |> dense(512, activation: relu) |> dense(512, activation: relu) |> dense(512, activation: relu) |> dense(4)\n\
         loss cross_entropy(out, y)\n";
    for n in [2, 4] {
        let z1 = plan(mlp, train_line, n, true).expect("ZeRO-1");
        let p = zero3(mlp, train_line, n, true, None);
        let homes: Vec<_> = p
            .params
            .iter()
            .filter_map(|b| Some((b.buffer, b.shard?)))
            .collect();
        assert_eq!(
            homes.len(),
            p.params.len(),
            "every parameter is updated, so sharded"
        );
        for &(h, l) in &homes {
            assert_eq!(p.buffers[h].bytes, 4 * l.shard_elems() as u64);
            assert!(p.buffers[h].persistent);
        }
        let mut filled = std::collections::HashSet::new();
        for (si, s) in p.steps.iter().enumerate() {
            let k = &p.kernels[s.kernel];
            match &k.op {
                Op::Optim(OptimOp::GatherShard { .. }) => {
                    assert!(
                        homes.iter().any(|(h, _)| *h == s.args[0]),
                        "step {si}: gathers a home"
                    );
                    filled.insert(s.args[1]);
                }
                Op::Optim(OptimOp::KeepShard { .. }) => {
                    assert!(
                        filled.contains(&s.args[0]),
                        "step {si}: keeps a gathered window"
                    );
                    assert!(
                        homes.iter().any(|(h, _)| *h == s.args[1]),
                        "step {si}: into a home"
                    );
                }
                _ => {
                    for a in &s.args {
                        assert!(
                            !homes.iter().any(|(h, _)| h == a),
                            "step {si} `{}` reads a home, not a window",
                            s.label
                        );
                        if p.buffers[*a].kind == BufferKind::Parameter {
                            assert!(
                                filled.contains(a),
                                "step {si}: window `{}` used before its gather",
                                p.buffers[*a].name
                            );
                        }
                    }
                }
            }
        }
        // every update's window is kept back
        let keeps = p
            .steps
            .iter()
            .filter(|s| matches!(p.kernels[s.kernel].op, Op::Optim(OptimOp::KeepShard { .. })))
            .count();
        assert_eq!(keeps, p.params.len(), "one keep per updated parameter");
        let params: u64 = z1.params.iter().map(|b| z1.buffers[b.buffer].bytes).sum();
        let largest = z1
            .params
            .iter()
            .map(|b| z1.buffers[b.buffer].bytes)
            .max()
            .unwrap_or(0);
        assert!(
            p.arena_bytes + params * (n as u64 - 1) / n as u64 <= z1.arena_bytes + 3 * largest,
            "{n} ranks: arena {} B with sharded parameters, {} B without ({} B of parameters)",
            p.arena_bytes,
            z1.arena_bytes,
            params
        );
        assert!(p.arena_bytes < z1.arena_bytes, "{n} ranks: a smaller arena");
        // the updates keep this rank's rows of their windows and gather none (their programs on
        // the GPU end with no all-gather); the windows' gathers send this rank's rows twice a
        // step (forward, backward) where ZeRO-1 gathers once: 1.5x ZeRO-1's bytes (the gradient
        // reduction being the third)
        for k in p.kernels.iter().filter(|k| k.op.shards() > 1) {
            if !matches!(
                k.op,
                Op::Optim(OptimOp::GatherShard { .. } | OptimOp::KeepShard { .. })
            ) {
                assert!(k.op.keeps_rows(), "`{}` keeps its rows", k.name);
            }
        }
        let programs =
            dmc_codegen::render_plan(&p, &dmc_codegen::CodegenOptions::default()).expect("render");
        for k in programs.iter().filter(|k| k.name.contains("update")) {
            assert!(
                !k.program.iter().any(|ph| matches!(
                    ph,
                    dmc_codegen::Phase::Collective(dmc_codegen::Collective::AllGatherRows { .. })
                )),
                "`{}`: no all-gather in an update",
                k.name
            );
        }
        let (s1, s3) = (
            dmc_plan::shard::sent_bytes(&z1, 0),
            dmc_plan::shard::sent_bytes(&p, 0),
        );
        assert!(
            s3 > s1 && (s3 as f64) < 1.6 * s1 as f64,
            "sent a step: {s3} B sharded, {s1} B whole"
        );
    }
}

/// The smallest cap sharded parameters fit (without streaming) is below the smallest whole ones
/// fit, and a rank trains there as one process does.
#[test]
fn sharded_parameters_fit_a_cap_whole_ones_do_not() {
    let train_line = "batch: 8, optimizer: sgd(lr: 0.05, momentum: 0.9)";
    // (deep enough that each weight's forward and backward uses are windows of their own: a
    // shallow net's last layers use their weights in one window from forward to update)
    let mlp = "input x: [256]\ntarget y: int\n\
         out = x |> repeat 6 { dense(384, activation: relu) } |> dense(4)\n\
         loss cross_entropy(out, y)\n";
    let src = format!("{mlp}train {{ {train_line} }}\n");
    let m = dmc_grammar::compile_source(&src, "t.dm").expect("model");
    let floor = |shard_params: bool| {
        let opts = CompileOptions {
            ranks: 2,
            stream: false,
            shard_params,
            ..CompileOptions::default()
        };
        dmc_compiler::sweep::sweep(&m, &opts, 2)
            .expect("sweep")
            .points[0]
            .cap
    };
    let (whole_floor, shard_floor) = (floor(false), floor(true));
    assert!(
        shard_floor < whole_floor,
        "floors: {shard_floor} B sharded, {whole_floor} B whole"
    );
    let refused = compile(
        &m,
        &CompileOptions {
            ranks: 2,
            stream: false,
            cap: Some(shard_floor),
            ..CompileOptions::default()
        },
    );
    assert!(
        refused.is_err(),
        "whole parameters do not fit {shard_floor} B"
    );
    let capped = zero3(mlp, train_line, 2, true, Some(shard_floor));
    assert!(capped.arena_bytes <= shard_floor && !capped.streams());
    let one = plan(mlp, train_line, 1, true).expect("one");
    let data = batches(&one);
    let (w1, _) = train(one, &data, None);
    let w = whole(
        &capped,
        &on_ranks(2, &data, |mine, c| train_rank(capped.clone(), &mine, c)),
    );
    let free = zero3(mlp, train_line, 2, true, None);
    let w_free = whole(
        &free,
        &on_ranks(2, &data, |mine, c| train_rank(free.clone(), &mine, c)),
    );
    assert!(w == w_free, "capped trains as uncapped, bit for bit");
    let e = rel(&w, &w1);
    assert!(e < 1e-6, "{e:e} from one process");
}
