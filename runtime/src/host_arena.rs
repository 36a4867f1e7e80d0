//! Host-side access to an arena the host does not index directly (the CUDA device arena, the
//! emulator's arena): the one implementation of parameter initialisation, inputs and read-back
//! shared by [`CudaBackend`](crate::cuda::CudaBackend) and [`EmuBackend`](crate::emu::EmuBackend).
//! A backend only says how bytes move in and out.

use dmc_codegen::Scalars;
use dmc_plan::op::{DType, LossOp, Op, SeqOp};
use dmc_plan::plan::{BufferId, ParamBinding, Plan, RunPass, Store};

use crate::backend::{InputData, Params};
use crate::error::RuntimeError;
use crate::init::{init_values, name_seed};
use crate::poison::poison_lists;
use crate::stream::WindowCheck;

/// (name, shape, values) of a tensor copied back from an arena.
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// Copied-back tensors as the [`Backend`](crate::Backend) trait's [`Params`].
pub(crate) fn owned_params(v: Vec<NamedTensor>) -> Params<'static> {
    v.into_iter()
        .map(|(n, s, d)| (n, s, std::borrow::Cow::Owned(d)))
        .collect()
}

/// Implements [`Backend`](crate::Backend) for a backend whose arena is a [`HostArena`] (the CUDA
/// backend and the emulator): parameters, inputs and the output go through [`HostArena`]; the plan,
/// the device memory, poison mode, the NaN halt and the step are the backend's own inherent methods
/// (`measured_arena_bytes` given as an expression of `self`). The trait is named by path: its method
/// names are [`HostArena`]'s, so both in scope would be ambiguous. `extra: { ... }` adds methods
/// (the trait's optional ones a backend has).
macro_rules! impl_backend_over_host_arena {
    ($ty:ident, measured_arena_bytes: |$s:ident| $bytes:expr) => {
        crate::host_arena::impl_backend_over_host_arena!($ty, measured_arena_bytes: |$s| $bytes, extra: {});
    };
    ($ty:ident, measured_arena_bytes: |$s:ident| $bytes:expr, extra: { $($extra:tt)* }) => {
        impl crate::backend::Backend for $ty {
            fn plan(&self) -> &dmc_plan::plan::Plan {
                &self.plan
            }

            fn measured_arena_bytes(&self) -> Option<u64> {
                let $s = self;
                $bytes
            }

            fn set_poison(&mut self, on: bool) {
                $ty::set_poison(self, on);
            }

            fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
                $ty::set_halt_on_nonfinite_loss(self, on);
            }

            fn init_params(&mut self, seed: u64) -> Result<(), crate::error::RuntimeError> {
                crate::host_arena::HostArena::init_params(self, seed)
            }

            fn set_param(
                &mut self,
                name: &str,
                data: &[f32],
            ) -> Result<(), crate::error::RuntimeError> {
                crate::host_arena::HostArena::set_param(self, name, data)
            }

            fn params(&self) -> Result<crate::backend::Params<'_>, crate::error::RuntimeError> {
                Ok(crate::host_arena::owned_params(
                    crate::host_arena::HostArena::params(self)?,
                ))
            }

            fn opt_states(&self) -> Result<crate::backend::Params<'_>, crate::error::RuntimeError> {
                Ok(crate::host_arena::owned_params(
                    crate::host_arena::HostArena::opt_states(self)?,
                ))
            }

            fn set_opt_state(
                &mut self,
                name: &str,
                data: &[f32],
            ) -> Result<(), crate::error::RuntimeError> {
                crate::host_arena::HostArena::set_opt_state(self, name, data)
            }

            fn set_input(
                &mut self,
                name: &str,
                data: crate::backend::InputData,
            ) -> Result<(), crate::error::RuntimeError> {
                crate::host_arena::HostArena::set_input(self, name, data)
            }

            fn run(
                &mut self,
                step_counter: u64,
                seed: u64,
            ) -> Result<f32, crate::error::RuntimeError> {
                $ty::run(self, step_counter, seed)
            }

            fn set_learning_rate(&mut self, lr: f32) {
                $ty::set_learning_rate(self, lr);
            }

            fn set_run_pass(&mut self, pass: dmc_plan::plan::RunPass) {
                $ty::set_run_pass(self, pass);
            }

            fn output(&self) -> Result<std::borrow::Cow<'_, [f32]>, crate::error::RuntimeError> {
                Ok(std::borrow::Cow::Owned(
                    crate::host_arena::HostArena::output(self)?,
                ))
            }

            $($extra)*
        }
    };
}
pub(crate) use impl_backend_over_host_arena;

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

pub(crate) fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The buffers and byte ranges (id, offset, bytes) to fill with NaN after each step in poison mode (see
/// [`CpuBackend::set_poison`](crate::CpuBackend::set_poison)).
pub(crate) fn poison_ranges(plan: &Plan) -> Vec<Vec<(BufferId, u64, u64)>> {
    poison_lists(plan)
        .into_iter()
        .map(|ids| {
            ids.into_iter()
                .map(|id| (id, plan.buffers[id].offset, plan.buffers[id].bytes))
                .collect()
        })
        .collect()
}

/// Labels must index a class of the cross-entropy that reads them, tokens a row of their embedding
/// table: the CPU backend's `BadLabel`
/// error, raised when the labels are set (a GPU kernel cannot stop a step with a message).
pub(crate) fn check_labels(
    plan: &Plan,
    buffer: BufferId,
    labels: &[i32],
) -> Result<(), RuntimeError> {
    let Some((si, step, k)) = plan.steps.iter().enumerate().find_map(|(si, s)| {
        let k = &plan.kernels[s.kernel];
        (matches!(
            k.op,
            Op::Loss(LossOp::CrossEntropyLoss { .. })
                | Op::Loss(LossOp::CrossEntropyLossBwd { .. })
                | Op::Seq(SeqOp::Embedding)
        ) && s.args.contains(&buffer))
        .then_some((si, s, k))
    }) else {
        return Ok(());
    };
    // the logits' classes, or the embedding table's rows
    let classes = match k.op {
        Op::Seq(_) => k.arg_shapes[1].first().copied().unwrap_or(0),
        _ => k.arg_shapes[0].get(1).copied().unwrap_or(0),
    };
    match labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l < 0 || l as usize >= classes)
    {
        Some((row, &l)) => Err(RuntimeError::BadLabel {
            step: si,
            label: step.label.clone(),
            row,
            label_value: l,
            classes,
        }),
        None => Ok(()),
    }
}

/// What launching plan step `si` needs: the index of its rendered kernel in `kernels` (plan kernel
/// id -> rendered index) and its argument pointers (`base + offset` of each argument buffer, in
/// signature order); `None` for leaves and reshapes, which have no kernel.
pub(crate) fn step_launch(
    plan: &Plan,
    kernels: &[Option<usize>],
    si: usize,
    base: u64,
) -> Option<(usize, Vec<u64>)> {
    let step = &plan.steps[si];
    let ki = kernels.get(step.kernel).copied().flatten()?;
    Some((
        ki,
        step.args
            .iter()
            .map(|&id| base + plan.buffers[id].offset)
            .collect(),
    ))
}

/// Poison mode, the halt on a non-finite loss and the learning rate, for a backend that launches
/// steps itself.
#[derive(Debug)]
pub(crate) struct StepFlags {
    /// Per step, the buffers and their byte ranges (id, offset, bytes) to fill with NaN after it
    /// (poison mode).
    poison: Option<Vec<Vec<(BufferId, u64, u64)>>>,
    /// Stop right after the step that computes the loss when it is not finite.
    pub(crate) halt: bool,
    /// The learning rate the update kernels get (`Backend::set_learning_rate`).
    pub(crate) lr: f32,
    /// Which steps runs execute (`Backend::set_run_pass`).
    pub(crate) pass: RunPass,
    /// Poison mode's checks of the copy steps (streaming, [`crate::stream`]).
    windows: WindowCheck,
}

impl StepFlags {
    /// Off, with the plan's optimizer's learning rate.
    pub(crate) fn new(plan: &Plan) -> Self {
        StepFlags {
            poison: None,
            halt: false,
            lr: plan.optimizer.lr(),
            pass: RunPass::Whole,
            windows: WindowCheck::new(plan),
        }
    }

    pub(crate) fn set_poison(&mut self, plan: &Plan, on: bool) {
        self.poison = on.then(|| poison_ranges(plan));
    }

    pub(crate) fn poison_after(&self, si: usize) -> &[(BufferId, u64, u64)] {
        self.poison
            .as_ref()
            .and_then(|p| p.get(si))
            .map_or(&[], |v| v.as_slice())
    }
}

/// A backend that launches the plan's steps one by one; [`run_steps`] adds poison mode and the halt
/// on a non-finite loss on top, as the CPU backend has them.
pub(crate) trait StepLauncher: HostArena {
    fn flags(&self) -> &StepFlags;
    fn flags_mut(&mut self) -> &mut StepFlags;
    /// Whether copy steps run asynchronously for real (the CUDA backend's second stream): then
    /// poison mode only marks a window NaN before its copy is issued; otherwise it lands each
    /// copy as late as the plan allows (see [`crate::stream`]).
    fn async_copies(&self) -> bool {
        false
    }
    /// Launches (or queues) plan step `si` with the launch's scalars; a step without a kernel does
    /// nothing.
    fn launch_step(&mut self, si: usize, scalars: &Scalars) -> Result<(), RuntimeError>;
    /// Fills `bytes` bytes at `offset` with 0xFF (NaN), after the work launched so far.
    fn fill_poison(&mut self, offset: u64, bytes: u64) -> Result<(), RuntimeError>;
    /// The ranks this backend runs with (data parallel; 1 alone) and this process' rank.
    fn ranks(&self) -> (usize, usize) {
        (1, 0)
    }
    /// Data parallel: the loss (each rank's weighted by 1/ranks at lowering) summed over the
    /// ranks in place, right after the step that computes it, so every rank sees the global loss
    /// and halts alike.
    fn sum_loss(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// A run's steps cut where the halt on a non-finite loss reads the loss: the CUDA backend captures
/// one graph per segment ([`crate::cuda::graph`]), and [`run_steps`] launches them one by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Plan steps, in order, that run in the pass (leaves and reshapes included: they launch
    /// nothing).
    pub steps: Vec<usize>,
    /// Read the loss after the segment (its last step has the loss among its arguments and the
    /// halt is on) and stop the run when it is not finite.
    pub check_loss: bool,
}

/// The steps of a run in `pass`, cut after every step that has the loss among its arguments when
/// `halt` is on (one segment otherwise). Empty segments are dropped.
pub fn segments(plan: &Plan, pass: RunPass, halt: bool) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for si in 0..plan.steps.len() {
        if !plan.runs_step(si, pass) {
            continue;
        }
        cur.push(si);
        if halt && plan.steps[si].args.contains(&plan.loss) {
            out.push(Segment {
                steps: std::mem::take(&mut cur),
                check_loss: true,
            });
        }
    }
    if !cur.is_empty() {
        out.push(Segment {
            steps: cur,
            check_loss: false,
        });
    }
    out
}

/// The scalars of a run (`Backend::run`'s step counter and seed, the learning rate set).
pub(crate) fn run_scalars(flags: &StepFlags, step_counter: u64, seed: u64, rank: usize) -> Scalars {
    Scalars {
        seed,
        step: step_counter,
        lr: flags.lr,
        rank: rank as u64,
    }
}

/// Fails unless the backend runs with as many ranks as the plan is for.
pub(crate) fn check_ranks(plan: &Plan, world: usize) -> Result<(), RuntimeError> {
    if world != plan.ranks {
        return Err(RuntimeError::Comm(format!(
            "the plan is one rank's of a data-parallel step of {} ranks, but this process runs as one of {world}: launch it with `mpirun -np {}` (and `--data-parallel`)",
            plan.ranks, plan.ranks
        )));
    }
    Ok(())
}

/// Runs every step in plan order and returns the loss: after each step the poison ranges of
/// [`StepFlags`] are filled with NaN, and with `halt` the run stops right after the step that
/// computes the loss (and its poison fills) when it is not finite, so no backward or update step
/// runs and the weights stay the last good ones.
pub(crate) fn run_steps<B: StepLauncher>(
    b: &mut B,
    step_counter: u64,
    seed: u64,
) -> Result<f32, RuntimeError> {
    let mut windows = std::mem::take(&mut b.flags_mut().windows);
    let r = run_steps_with(b, &mut windows, step_counter, seed);
    b.flags_mut().windows = windows;
    r
}

/// [`run_steps`], with poison mode's checks of the copy steps in `w` (see [`crate::stream`]).
fn run_steps_with<B: StepLauncher>(
    b: &mut B,
    w: &mut WindowCheck,
    step_counter: u64,
    seed: u64,
) -> Result<f32, RuntimeError> {
    let (world, rank) = b.ranks();
    check_ranks(b.plan(), world)?;
    let scalars = run_scalars(b.flags(), step_counter, seed, rank);
    let pass = b.flags().pass;
    let mut loss_summed = world <= 1;
    b.plan()
        .check_run_pass(pass)
        .map_err(RuntimeError::RunPass)?;
    let copies = b.flags().poison.is_some() && w.any();
    // Poison mode lands each copy as late as its `ready` allows, unless the copies are
    // asynchronous for real.
    let deferred = copies && !b.async_copies();
    w.reset();
    if copies {
        // an offloaded activation's home holds NaN until its write-back lands
        let homes: Vec<(u64, u64)> = b
            .plan()
            .buffers
            .iter()
            .filter(|h| h.store == Store::Host && !h.persistent)
            .map(|h| (h.offset, h.bytes))
            .collect();
        for (off, n) in homes {
            b.write_bytes(Store::Host, off, &vec![0xFF; n as usize])?;
        }
    }
    // the steps whose due copies have landed
    let mut landed = 0;
    for seg in segments(b.plan(), pass, b.flags().halt) {
        for &si in &seg.steps {
            let op = b.plan().transfer_op(si);
            if copies && op == Some(dmc_plan::op::TransferOp::HostToDevice) {
                // the window holds NaN until its copy lands
                let win = &b.plan().buffers[b.plan().steps[si].args[1]];
                let (off, bytes) = (win.offset, win.bytes);
                b.fill_poison(off, bytes)?;
            }
            if !(deferred && op.is_some()) {
                b.launch_step(si, &scalars)?;
                if copies {
                    w.ran(b.plan(), si);
                }
            }
            if !loss_summed && b.plan().steps[si].args.contains(&b.plan().loss) {
                loss_summed = true;
                b.sum_loss()?;
            }
            if deferred {
                for j in landed..=si {
                    for c in w.land_after(j).to_vec() {
                        b.launch_step(c, &scalars)?;
                        w.ran(b.plan(), c);
                    }
                }
                landed = si + 1;
            }
            let ranges = b.flags().poison_after(si).to_vec();
            for (id, off, n) in ranges {
                if copies {
                    w.check_released(b.plan(), Some(id))?;
                }
                b.fill_poison(off, n)?;
            }
        }
        if seg.check_loss {
            let l = b.loss()?;
            if !l.is_finite() {
                return Ok(l);
            }
        }
    }
    if deferred {
        for j in landed..b.plan().steps.len() {
            for c in w.land_after(j).to_vec() {
                b.launch_step(c, &scalars)?;
                w.ran(b.plan(), c);
            }
        }
    }
    if copies {
        w.check_released(b.plan(), None)?;
    }
    b.loss()
}

/// A backend whose arena is reached by copies. The provided methods mirror
/// [`CpuBackend`](crate::CpuBackend)'s API.
/// What parameter `p`'s buffer holds after initialisation with `seed`: its values per its `Init`
/// (from an RNG seeded by `(seed, name)`), or, sharded (data parallel with sharded parameters),
/// rank `rank`'s rows of them at the start of a buffer of the largest rank's.
pub fn param_values(p: &ParamBinding, seed: u64, rank: usize) -> Vec<f32> {
    let all = init_values(p.init, name_seed(seed, &p.name)).take(numel(&p.shape));
    match p.shard {
        None => all.collect(),
        Some(l) => {
            let mine = l.elems_of(rank);
            let mut v: Vec<f32> = all.skip(mine.start).take(mine.len()).collect();
            v.resize(l.shard_elems(), 0.0);
            v
        }
    }
}

pub trait HostArena {
    fn plan(&self) -> &Plan;
    /// Copies `bytes` to the arena (or the host store) at `offset`.
    fn write_bytes(&mut self, store: Store, offset: u64, bytes: &[u8]) -> Result<(), RuntimeError>;
    /// Copies `len` bytes from the arena (or the host store) at `offset` (after the work
    /// launched so far).
    fn read_bytes(&self, store: Store, offset: u64, len: usize) -> Result<Vec<u8>, RuntimeError>;

    /// Copies `bytes` into buffer `id` (in whichever memory it lives).
    fn write_buffer(&mut self, id: BufferId, bytes: &[u8]) -> Result<(), RuntimeError> {
        let b = &self.plan().buffers[id];
        let (store, off) = (b.store, b.offset);
        self.write_bytes(store, off, bytes)
    }

    /// The first `len` bytes of buffer `id`.
    fn read_buffer(&self, id: BufferId, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let b = &self.plan().buffers[id];
        self.read_bytes(b.store, b.offset, len)
    }

    /// This process's rank in the data-parallel group the backend runs with (0 alone): the rows
    /// of a sharded parameter its buffer holds.
    fn shard_rank(&self) -> usize {
        0
    }

    /// Initialises the parameters exactly as the CPU backend does, then copies them; zeroes the
    /// optimizer state.
    fn init_params(&mut self, seed: u64) -> Result<(), RuntimeError> {
        let rank = self.shard_rank();
        for i in 0..self.plan().params.len() {
            let p = &self.plan().params[i];
            let vals: Vec<u8> = param_values(p, seed, rank)
                .into_iter()
                .flat_map(f32::to_ne_bytes)
                .collect();
            let id = p.buffer;
            self.write_buffer(id, &vals)?;
        }
        for i in 0..self.plan().opt_state.len() {
            let p = &self.plan().opt_state[i];
            // (a data-parallel plan's shard: the largest rank's rows)
            let zeros = vec![0u8; numel(&p.buffer_shape()) * 4];
            let id = p.buffer;
            self.write_buffer(id, &zeros)?;
        }
        // the accumulated gradients (`accumulate: N`) start at zero
        for i in 0..self.plan().buffers.len() {
            let b = &self.plan().buffers[i];
            if b.kind == dmc_plan::plan::BufferKind::GradAccum {
                let (id, zeros) = (b.id, vec![0u8; b.bytes as usize]);
                self.write_buffer(id, &zeros)?;
            }
        }
        Ok(())
    }

    fn set_param(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let p = self
            .plan()
            .params
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| RuntimeError::UnknownParam(name.into()))?;
        let (shape, buffer) = (p.buffer_shape(), p.buffer);
        self.write_f32(name, &shape, buffer, data)
    }

    /// Overwrites an optimizer state tensor.
    fn set_opt_state(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        let p = self
            .plan()
            .opt_state
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| RuntimeError::UnknownOptState(name.into()))?;
        let (shape, buffer) = (p.buffer_shape(), p.buffer);
        self.write_f32(name, &shape, buffer, data)
    }

    /// Writes the f32 values of tensor `name` (of `shape`) into `buffer`.
    fn write_f32(
        &mut self,
        name: &str,
        shape: &[usize],
        buffer: BufferId,
        data: &[f32],
    ) -> Result<(), RuntimeError> {
        let n = numel(shape);
        if data.len() != n {
            return Err(RuntimeError::SizeMismatch {
                name: name.into(),
                expected: n,
                got: data.len(),
            });
        }
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.write_buffer(buffer, &bytes)
    }

    /// Every parameter, copied back: (name, shape, values), in plan order.
    fn params(&self) -> Result<Vec<NamedTensor>, RuntimeError> {
        self.read_tensors(&self.plan().params)
    }

    /// Every optimizer state tensor, copied back: (name, shape, values), in plan order (a
    /// data-parallel plan's: this rank's shard, [`ParamBinding::buffer_shape`]).
    fn opt_states(&self) -> Result<Vec<NamedTensor>, RuntimeError> {
        self.plan()
            .opt_state
            .iter()
            .map(|p| {
                let shape = p.buffer_shape();
                let b = self.read_buffer(p.buffer, numel(&shape) * 4)?;
                Ok((p.name.clone(), shape, to_f32(&b)))
            })
            .collect()
    }

    /// The tensors of `bindings`, copied back (a sharded parameter's: this rank's rows,
    /// [`ParamBinding::buffer_shape`]).
    fn read_tensors(&self, bindings: &[ParamBinding]) -> Result<Vec<NamedTensor>, RuntimeError> {
        bindings
            .iter()
            .map(|p| {
                let shape = p.buffer_shape();
                let b = self.read_buffer(p.buffer, numel(&shape) * 4)?;
                Ok((p.name.clone(), shape, to_f32(&b)))
            })
            .collect()
    }

    fn set_input(&mut self, name: &str, data: InputData) -> Result<(), RuntimeError> {
        let b = self
            .plan()
            .inputs
            .iter()
            .chain(&self.plan().targets)
            .find(|b| b.name == name)
            .ok_or_else(|| RuntimeError::UnknownInput(name.into()))?;
        let (n, dtype, id) = (numel(&b.shape), b.dtype, b.buffer);
        if let InputData::I32(l) = data {
            check_labels(self.plan(), id, l)?;
        }
        let (got, bytes): (DType, Vec<u8>) = match data {
            InputData::F32(d) => (DType::F32, d.iter().flat_map(|v| v.to_ne_bytes()).collect()),
            InputData::I32(d) => (DType::I32, d.iter().flat_map(|v| v.to_ne_bytes()).collect()),
        };
        if got != dtype {
            return Err(RuntimeError::DTypeMismatch {
                name: name.into(),
                expected: dtype,
                got,
            });
        }
        if bytes.len() != n * 4 {
            return Err(RuntimeError::SizeMismatch {
                name: name.into(),
                expected: n,
                got: bytes.len() / 4,
            });
        }
        self.write_buffer(id, &bytes)
    }

    /// The loss of the last step.
    fn loss(&self) -> Result<f32, RuntimeError> {
        let b = self.read_buffer(self.plan().loss, 4)?;
        Ok(to_f32(&b)[0])
    }

    /// The network output of the last step.
    fn output(&self) -> Result<Vec<f32>, RuntimeError> {
        let o = &self.plan().output;
        let b = self.read_buffer(o.buffer, numel(&o.shape) * 4)?;
        Ok(to_f32(&b))
    }
}
