//! `dmc run --data-parallel`: one process per rank, started by the engine's own launcher
//! (`mpirun -np N dmc run net.dm --data-parallel`). Every rank compiles the same plan (one
//! rank's: its part of the global batch, its shard of the optimizer state; see
//! `dmc_plan::shard`), draws the same global batches and feeds its part of each. The weights are
//! the same on every rank after every step; rank 0 alone prints and writes files, and a
//! checkpoint's optimizer state is gathered to it whole, so a run resumes at any world size.

use std::borrow::Cow;
use std::sync::Arc;

use dmc_plan::plan::{Plan, RunPass};
use dmc_runtime::backend::{InputData, Params};
use dmc_runtime::comm::{self, Collective};
use dmc_runtime::profile::KernelProfile;
use dmc_runtime::{Backend, RuntimeError};

use crate::report::CliError;

/// The launcher's group of processes when `--data-parallel [N]` asks for one (`Some(0)`: any
/// number of ranks, the launcher's), checked against `N`. `None` without the flag.
pub fn open(asked: Option<usize>) -> Result<Option<Arc<dyn Collective>>, CliError> {
    let Some(n) = asked else {
        return Ok(None);
    };
    let c: Arc<dyn Collective> = Arc::from(comm::open_collective()?);
    if n != 0 && n != c.world() {
        return Err(CliError::Usage(format!(
            "--data-parallel {n}, but this process is rank {} of {} ({}): start {n} processes (`mpirun -np {n} dmc run ...`), or drop the number",
            c.rank(),
            c.world(),
            c.describe()
        )));
    }
    Ok(Some(c))
}

/// This rank's samples of a global batch of `idx` (`world` equal parts, in order).
pub fn part<'a>(idx: &'a [usize], c: Option<&dyn Collective>) -> &'a [usize] {
    match c {
        Some(c) if c.world() > 1 => {
            let r = dmc_plan::shard::rows(idx.len(), c.world(), c.rank());
            &idx[r]
        }
        _ => idx,
    }
}

/// One rank's backend: the optimizer state is read whole (gathered to rank 0, for a checkpoint)
/// and written whole (each rank keeps its rows), so the checkpoint code does not know ranks.
pub struct RankBackend {
    inner: Box<dyn Backend>,
    comm: Arc<dyn Collective>,
}

impl RankBackend {
    /// `inner` running with the group `comm` (set on it here).
    pub fn new(mut inner: Box<dyn Backend>, comm: Arc<dyn Collective>) -> Result<Self, CliError> {
        inner.set_collective(comm.clone())?;
        Ok(RankBackend { inner, comm })
    }
}

/// Rank `rank`'s rows of the whole tensor `data` sharded as `l`, at the start of a buffer of
/// the largest rank's.
fn mine(
    name: &str,
    l: dmc_plan::shard::Layout,
    data: &[f32],
    rank: usize,
) -> Result<Vec<f32>, RuntimeError> {
    if data.len() != l.rows * l.cols {
        return Err(RuntimeError::SizeMismatch {
            name: name.into(),
            expected: l.rows * l.cols,
            got: data.len(),
        });
    }
    let mut mine = data[l.elems_of(rank)].to_vec();
    mine.resize(l.shard_elems(), 0.0);
    Ok(mine)
}

/// The tensors `local` (this rank's buffers of `bindings`) whole: a sharded one's rows gathered
/// from the ranks, on every rank (`to_all`) or on rank 0 alone (the others keep their rows).
fn whole<'a>(
    bindings: &[dmc_plan::plan::ParamBinding],
    local: Params<'a>,
    c: &dyn Collective,
    to_all: bool,
) -> Result<Params<'a>, RuntimeError> {
    let mut out = Vec::with_capacity(local.len());
    for (b, (name, shape, data)) in bindings.iter().zip(local) {
        match b.shard {
            None => out.push((name, shape, data)),
            Some(l) => {
                let mut full = vec![0.0f32; l.rows * l.cols];
                let mine = l.elems_of(c.rank());
                full[mine.clone()].copy_from_slice(&data[..mine.len()]);
                match to_all {
                    true => comm::all_gather_rows(c, &mut full, l.cols, l.rows)?,
                    false => comm::gather_rows_to_root(c, &mut full, l.cols, l.rows)?,
                }
                out.push((name, b.shape.clone(), Cow::Owned(full)));
            }
        }
    }
    Ok(out)
}

impl Backend for RankBackend {
    fn plan(&self) -> &Plan {
        self.inner.plan()
    }
    fn measured_arena_bytes(&self) -> Option<u64> {
        self.inner.measured_arena_bytes()
    }
    fn set_poison(&mut self, on: bool) {
        self.inner.set_poison(on)
    }
    fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
        self.inner.set_halt_on_nonfinite_loss(on)
    }
    fn init_params(&mut self, seed: u64) -> Result<(), RuntimeError> {
        self.inner.init_params(seed)
    }
    /// `data` is the whole parameter; a sharded one's rank keeps its rows.
    fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let b = self
            .inner
            .plan()
            .params
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| RuntimeError::UnknownParam(name.into()))?;
        match b.shard {
            None => self.inner.set_param(name, data),
            Some(l) => {
                let mine = mine(name, l, data, self.comm.rank())?;
                self.inner.set_param(name, &mine)
            }
        }
    }

    /// Every parameter whole on every rank (a sharded one's rows gathered from the ranks: the
    /// validation runs on every rank with them).
    fn params(&self) -> Result<Params<'_>, RuntimeError> {
        let local = self.inner.params()?;
        whole(&self.inner.plan().params, local, self.comm.as_ref(), true)
    }

    /// Every state whole on rank 0 (the other ranks' copies hold only their own rows).
    fn opt_states(&self) -> Result<Params<'_>, RuntimeError> {
        let local = self.inner.opt_states()?;
        whole(
            &self.inner.plan().opt_state,
            local,
            self.comm.as_ref(),
            false,
        )
    }

    /// `data` is the whole state (a checkpoint's); this rank keeps its rows.
    fn set_opt_state(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let b = self
            .inner
            .plan()
            .opt_state
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| RuntimeError::UnknownOptState(name.into()))?;
        let Some(l) = b.shard else {
            return self.inner.set_opt_state(name, data);
        };
        let mine = mine(name, l, data, self.comm.rank())?;
        self.inner.set_opt_state(name, &mine)
    }

    fn set_input(&mut self, name: &str, data: InputData) -> Result<(), RuntimeError> {
        self.inner.set_input(name, data)
    }
    fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        self.inner.run(step_counter, seed)
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.inner.set_learning_rate(lr)
    }
    fn set_run_pass(&mut self, pass: RunPass) {
        self.inner.set_run_pass(pass)
    }
    fn output(&self) -> Result<Cow<'_, [f32]>, RuntimeError> {
        self.inner.output()
    }
    fn set_profile(&mut self, on: bool) -> Result<(), RuntimeError> {
        self.inner.set_profile(on)
    }
    fn profile(&self) -> Option<KernelProfile> {
        self.inner.profile()
    }
    fn set_cuda_graph(&mut self, on: bool) -> Result<(), RuntimeError> {
        self.inner.set_cuda_graph(on)
    }
    fn set_collective(&mut self, c: Arc<dyn Collective>) -> Result<(), RuntimeError> {
        self.comm = c.clone();
        self.inner.set_collective(c)
    }
    fn collective(&self) -> Option<&dyn Collective> {
        Some(self.comm.as_ref())
    }
    fn device_collective(&self) -> Option<String> {
        self.inner.device_collective()
    }
}

/// A step's classified-right counts summed over the ranks (each counted its part of the batch).
pub fn sum_correct(
    be: &dyn Backend,
    c: Option<super::metrics::Correct>,
) -> Result<Option<super::metrics::Correct>, CliError> {
    let (Some(g), Some(mut c)) = (be.collective().filter(|g| g.world() > 1), c) else {
        return Ok(c);
    };
    let mut v = [c.top1 as f64, c.top_k as f64, c.positions as f64];
    comm::all_reduce_sum_f64(g, &mut v)?;
    (c.top1, c.top_k, c.positions) = (v[0] as usize, v[1] as usize, v[2] as usize);
    Ok(Some(c))
}

/// The flags of rank `g.rank()`: the number of ranks the launcher's, and on every rank but 0 no
/// output (no progress, no loss log, no summary, no profile table) and no written files.
pub fn rank_args(args: &super::args::RunArgs, g: &dyn Collective) -> super::args::RunArgs {
    let mut a = args.clone();
    a.train.data_parallel = Some(g.world());
    if g.rank() > 0 {
        a.common.quiet = true;
        a.loss_log = None;
        a.summary_json = None;
        a.profile = false;
        a.silent = true;
        super::progress::silence();
    }
    a
}

/// Whether `v` holds on any rank (every rank gets the same answer; `v` itself alone).
pub fn any_rank(be: &dyn Backend, v: bool) -> Result<bool, CliError> {
    match be.collective().filter(|g| g.world() > 1) {
        None => Ok(v),
        Some(g) => {
            let mut s = [v as u8 as f64];
            comm::all_reduce_sum_f64(g, &mut s)?;
            Ok(s[0] > 0.0)
        }
    }
}

/// Rank 0's `v`, on every rank (a decision about files, which rank 0 alone writes).
pub fn rank0(be: &dyn Backend, v: bool) -> Result<bool, CliError> {
    match be.collective().filter(|g| g.world() > 1) {
        None => Ok(v),
        Some(g) => {
            let mut s = [if g.rank() == 0 { v as u8 as f64 } else { 0.0 }];
            comm::all_reduce_sum_f64(g, &mut s)?;
            Ok(s[0] > 0.0)
        }
    }
}

/// Whether this process writes the run's files (rank 0, or no data parallel).
pub fn writes(be: &dyn Backend) -> bool {
    match be.collective() {
        Some(g) => g.rank() == 0,
        None => true,
    }
}

/// The line `dmc run` ends a data-parallel run with (rank 0): the ranks, each one's share of the
/// optimizer state, and the bytes rank 0 sent per step against the plan's model of them.
pub fn report(plan: &Plan, carrier: String, sent: Option<u64>, steps: usize) {
    let (mine, whole) = dmc_plan::shard::state_bytes(plan);
    let model = crate::size::human(dmc_plan::shard::sent_bytes(plan, 0));
    let sent = match sent {
        Some(b) => format!(
            "rank 0 sent {} a step (the plan's model: {model}, the rest the metrics and stop checks)",
            crate::size::human(b / steps.max(1) as u64)
        ),
        // NCCL's traffic is not counted
        None => format!("the plan's model: rank 0 sends {model} a step"),
    };
    let (pm, pw) = dmc_plan::shard::param_bytes(plan);
    let params = match pm < pw {
        true => format!(
            ", {} of the {} parameters (sharded: each gathered whole for its uses)",
            crate::size::human(pm),
            crate::size::human(pw)
        ),
        false => String::new(),
    };
    println!(
        "data parallel: {} rank{} over {carrier}, each with the arena above and {} of the {} optimizer state{params}; {sent}",
        plan.ranks,
        if plan.ranks == 1 { "" } else { "s" },
        crate::size::human(mine),
        crate::size::human(whole),
    );
}
