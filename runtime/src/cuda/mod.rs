//! The CUDA backend: the plan's kernels rendered to CUDA C ([`dmc_codegen`]), compiled
//! by NVRTC ([`nvrtc`]) for the device's architecture, run on one device allocation of the planned
//! arena.
//!
//! * The driver (`libcuda.so.1`) is loaded at run time through cudarc's dynamic loading, after
//!   checking it is present (cudarc panics otherwise): a machine without CUDA gets an error, never
//!   a panic.
//! * One `cuMemAlloc` of `arena_bytes`; inputs and parameters are copied into their planned slots;
//!   every step is one launch on one stream whose arguments are built by iterating the kernel's
//!   [`kernel_params`](dmc_codegen::kernel_params) (the same list that rendered the
//!   kernel's parameter list): `arena base + offset` per signature slot, then `seed`, `step`.
//!   Nothing is allocated on the device during a step.
//! * Device memory is measured with `cuMemGetInfo` around the arena allocation.
//! * Streaming (`copies.rs`): a plan with a host store gets it as pinned host memory
//!   (`cuMemHostAlloc` of `host_bytes`), and its copy steps run on a second stream: each waits
//!   (an event) for the compute work queued before it, and the compute stream waits (the copy's
//!   completion event) before the copy's `ready` step; a run ends by synchronising the copy
//!   stream. Not with `--cuda-graph` (one captured stream).
//! * Opt-in: the step's launches captured once into CUDA graphs and replayed ([`graph`],
//!   `--cuda-graph`), and timing events around each launch ([`events`], `--profile`).
//! * Data parallel (`set_collective`): one GPU per rank ([`open_device_for_rank`]), NCCL
//!   ([`nccl`]) bootstrapped over the job's host collective; a sharded kernel's program queues its
//!   launches and NCCL's collectives on the one stream.

mod copies;
pub use copies::measure_link;
mod events;
mod graph;
pub mod nccl;
pub mod nvrtc;
pub mod nvrtc_search;
pub mod selftest;

use std::sync::Arc;

use cudarc::driver::{
    result as cu, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use dmc_codegen::{render_plan, CodegenOptions, CudaKernel, Launch, Phase, Scalars};
use dmc_plan::plan::{Plan, Store};

use crate::comm::Collective;
pub use crate::error::CudaError;
use crate::error::RuntimeError;
use crate::host_arena::{run_steps, step_launch, HostArena, StepFlags, StepLauncher};
use crate::validate::validate;

fn drv(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver {
        what: what.into(),
        message: e.to_string(),
    }
}

/// Whether the driver library can be loaded (without cudarc's panic on absence).
pub fn driver_present() -> bool {
    // SAFETY: tries `dlopen` of the driver's library names; no other precondition.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// A CUDA device ready to run kernels: its context, one stream, its architecture.
#[derive(Clone)]
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    /// e.g. `sm_90`
    pub arch: String,
}

/// Opens GPU 0, or says why it cannot.
pub fn open_device() -> Result<Device, CudaError> {
    open_ordinal(0)
}

/// The rank of this process among the ranks of its node, from the launcher's environment (Open
/// MPI's, MPICH's, Slurm's or torchrun's variable); `None` when no launcher says.
pub fn local_rank() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
        "LOCAL_RANK",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// The GPU of a data-parallel rank: GPU `local_rank` of this node ([`local_rank`], 0 when no
/// launcher says), or an error when the node has fewer GPUs than that (NCCL needs one GPU per
/// rank).
pub fn open_device_for_rank() -> Result<Device, CudaError> {
    let lr = local_rank().unwrap_or(0);
    open_ordinal(lr).map_err(|e| match e {
        CudaError::NoDevice(why) if lr > 0 => CudaError::NoDevice(format!(
            "this process is rank {lr} of its node, which needs GPU {lr}: {why}; start at most one \
             rank per GPU (`mpirun -np <GPUs>` on one node)"
        )),
        e => e,
    })
}

/// Opens GPU `ordinal`, or says why it cannot (no driver, fewer GPUs).
fn open_ordinal(ordinal: usize) -> Result<Device, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    let n = CudaContext::device_count().map_err(|e| CudaError::NoDevice(e.to_string()))?;
    if n < 1 {
        return Err(CudaError::NoDevice("the driver reports no GPU".into()));
    }
    if ordinal >= n as usize {
        return Err(CudaError::NoDevice(format!(
            "the driver reports {n} GPU(s), no GPU {ordinal}"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice(e.to_string()))?;
    let name = ctx.name().map_err(drv("cuDeviceGetName"))?;
    let (maj, min) = ctx
        .compute_capability()
        .map_err(drv("compute capability"))?;
    let stream = ctx.default_stream();
    Ok(Device {
        ctx,
        stream,
        name,
        arch: format!("sm_{maj}{min}"),
    })
}

/// A short description of the GPU for `--device auto`, or why there is none.
pub fn probe() -> Result<String, CudaError> {
    let d = open_device()?;
    Ok(format!("{} ({})", d.name, d.arch))
}

/// Free and total device memory (`cuMemGetInfo`).
pub fn mem_info(d: &Device) -> Result<(usize, usize), CudaError> {
    d.ctx.mem_get_info().map_err(drv("cuMemGetInfo"))
}

/// Compiles `kernels` with NVRTC for the device and loads their entry points: per kernel, one
/// function per distinct entry of its launches ([`CudaKernel::entries`]).
pub fn load_kernels(
    d: &Device,
    kernels: &[CudaKernel],
) -> Result<Vec<Vec<CudaFunction>>, CudaError> {
    let nv = nvrtc::nvrtc()?;
    kernels
        .iter()
        .map(|k| {
            let c = nv.compile(&k.name, &k.source, &d.arch, nvrtc::Output::Cubin)?;
            let m = d
                .ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(c.image))
                .map_err(drv("cuModuleLoadData"))?;
            k.entries()
                .iter()
                .map(|e| m.load_function(e).map_err(drv("cuModuleGetFunction")))
                .collect()
        })
        .collect()
}

/// Launches `k` (each of its launches, in order on the stream, with the functions `fs` that
/// [`load_kernels`] loaded for it) with its pointer arguments `ptrs` (one per signature slot, in
/// order).
///
/// # Safety
/// Every pointer must address device memory at least as large as the kernel's argument `i`
/// (per its shapes) and written arguments must not overlap other arguments.
pub unsafe fn launch(
    d: &Device,
    fs: &[CudaFunction],
    k: &CudaKernel,
    ptrs: &[u64],
    scalars: &Scalars,
) -> Result<(), CudaError> {
    for l in k.launches() {
        // SAFETY: per this function's contract.
        unsafe { launch_entry(&d.stream, fs, k, &l, ptrs, scalars) }?;
    }
    Ok(())
}

/// Launches `l`, one of `k`'s launches, with the function `fs` holds for its entry (per
/// [`CudaKernel::entries`]).
///
/// # Safety
/// As [`launch`].
pub(crate) unsafe fn launch_entry(
    s: &CudaStream,
    fs: &[CudaFunction],
    k: &CudaKernel,
    l: &Launch,
    ptrs: &[u64],
    scalars: &Scalars,
) -> Result<(), CudaError> {
    let f = k
        .entries()
        .iter()
        .position(|e| *e == l.entry)
        .and_then(|i| fs.get(i))
        .ok_or_else(|| CudaError::Driver {
            what: "launch".into(),
            message: format!("no function loaded for entry `{}` of {}", l.entry, k.name),
        })?;
    // The launch arguments, built from the same list that rendered the parameter list.
    let vals = k.launch_values(ptrs, scalars, l.col0);
    // SAFETY: per this function's contract.
    unsafe { launch_one(s, f, l, &vals) }
}

/// Launches entry `f` with the geometry of `l` and the launch values `vals` on `s` (recorded as a
/// node when `s` is capturing).
///
/// # Safety
/// As [`launch`]'s: `vals` are [`CudaKernel::launch_values`] of valid pointers for `f`'s kernel.
pub(crate) unsafe fn launch_one(
    s: &CudaStream,
    f: &CudaFunction,
    l: &Launch,
    vals: &[u64],
) -> Result<(), CudaError> {
    let mut b = s.launch_builder(f);
    for v in vals {
        b.arg(v);
    }
    let cfg = LaunchConfig {
        grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
        block_dim: (l.block[0], l.block[1], l.block[2]),
        shared_mem_bytes: 0,
    };
    // SAFETY: per this function's contract; the argument count and types (pointers, u64 scalars
    // and the learning rate's double, all 8 bytes) match the generated parameter list by
    // construction, the same for every entry of the translation unit.
    unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel"))?;
    Ok(())
}

/// One plain `cuMemAlloc` allocation (no stream-ordered pool), freed on drop. Copies are
/// synchronous and bounds-checked.
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    pub ptr: u64,
    pub bytes: usize,
}

impl DeviceBuffer {
    pub fn new(d: &Device, bytes: usize) -> Result<Self, CudaError> {
        d.ctx.bind_to_thread().map_err(drv("bind context"))?;
        // SAFETY: the context is current on this thread; the size is non-zero.
        let ptr = unsafe { cu::malloc_sync(bytes.max(1)) }.map_err(|e| CudaError::Driver {
            what: format!("cuMemAlloc of {bytes} bytes"),
            message: e.to_string(),
        })?;
        let b = DeviceBuffer {
            ctx: d.ctx.clone(),
            ptr,
            bytes,
        };
        // SAFETY: `ptr` addresses `bytes` bytes just allocated.
        unsafe { cu::memset_d8_sync(ptr, 0, bytes) }.map_err(drv("cuMemsetD8"))?;
        Ok(b)
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), CudaError> {
        if !matches!(offset.checked_add(len), Some(e) if e <= self.bytes) {
            return Err(CudaError::Driver {
                what: "copy".into(),
                message: format!(
                    "[{offset}, +{len}) is outside the {}-byte buffer",
                    self.bytes
                ),
            });
        }
        Ok(())
    }

    /// Copies `src` to `offset` (synchronous).
    pub fn upload(&self, offset: usize, src: &[u8]) -> Result<(), CudaError> {
        self.check(offset, src.len())?;
        self.ctx.bind_to_thread().map_err(drv("bind context"))?;
        // SAFETY: the range lies inside the allocation (checked); `src` is a valid host slice.
        unsafe { cu::memcpy_htod_sync(self.ptr + offset as u64, src) }.map_err(drv("cuMemcpyHtoD"))
    }

    /// Copies `dst.len()` bytes from `offset` (synchronous; waits for prior work on the context).
    pub fn download(&self, offset: usize, dst: &mut [u8]) -> Result<(), CudaError> {
        self.check(offset, dst.len())?;
        self.ctx.bind_to_thread().map_err(drv("bind context"))?;
        self.ctx.synchronize().map_err(drv("synchronize"))?;
        // SAFETY: the range lies inside the allocation (checked); `dst` is a valid host slice.
        unsafe { cu::memcpy_dtoh_sync(dst, self.ptr + offset as u64) }.map_err(drv("cuMemcpyDtoH"))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            let _ = self.ctx.synchronize();
            // SAFETY: allocated by `cuMemAlloc` in `new`, freed once; no kernel uses it any more.
            let _ = unsafe { cu::free_sync(self.ptr) };
        }
    }
}

/// The CUDA backend for one plan (mirrors [`CpuBackend`](crate::CpuBackend)'s API).
pub struct CudaBackend {
    plan: Plan,
    dev: Device,
    arena: DeviceBuffer,
    base: u64,
    kernels: Vec<Option<usize>>,
    rendered: Vec<CudaKernel>,
    functions: Vec<Vec<CudaFunction>>,
    flags: StepFlags,
    /// The captured graphs when runs replay them (`set_cuda_graph`).
    graphs: Option<graph::StepGraphs>,
    /// The timing events when runs are profiled (`set_profile`).
    profiler: Option<events::Profiler>,
    /// The host store (streaming; empty without one).
    host: copies::PinnedStore,
    /// The copy stream, when the plan has copy steps.
    copies: Option<copies::Copies>,
    /// Device memory taken by the arena allocation (free before - free after).
    pub measured_arena_bytes: u64,
    /// The job's ranks (data parallel, `set_collective`) and their NCCL communicator.
    comm: Option<(Arc<dyn Collective>, nccl::Nccl)>,
}

impl CudaBackend {
    /// Opens the GPU (a data-parallel plan's: this rank's, [`open_device_for_rank`]), renders and
    /// compiles the plan's kernels, allocates the arena (zeroed).
    pub fn new(plan: Plan) -> Result<Self, RuntimeError> {
        let dev = if plan.ranks > 1 {
            open_device_for_rank()?
        } else {
            open_device()?
        };
        Self::with_device(plan, dev)
    }

    /// The group of processes a data-parallel plan runs with: NCCL joined over `c` (every rank
    /// calls this at the same point), on this backend's GPU. With one rank NCCL still carries the
    /// loss' sum, so the path is the same as with several.
    pub fn set_collective(&mut self, c: Arc<dyn Collective>) -> Result<(), RuntimeError> {
        if self.graphs.is_some() {
            return Err(RuntimeError::Unsupported(
                "--cuda-graph with --data-parallel: NCCL's collectives are not captured into the step's graphs yet; run without --cuda-graph"
                    .into(),
            ));
        }
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        let n = nccl::Nccl::init(c.as_ref())?;
        self.comm = Some((c, n));
        Ok(())
    }

    /// What carries the data-parallel collectives, e.g. "NCCL 2.21.5 (libnccl.so.2)".
    pub fn collective_name(&self) -> Option<&str> {
        self.comm.as_ref().map(|(_, n)| n.name.as_str())
    }

    pub fn with_device(plan: Plan, dev: Device) -> Result<Self, RuntimeError> {
        Self::with_codegen(plan, dev, &CodegenOptions::default())
    }

    /// [`CudaBackend::with_device`], rendering the kernels with `codegen`.
    pub fn with_codegen(
        plan: Plan,
        dev: Device,
        codegen: &CodegenOptions,
    ) -> Result<Self, RuntimeError> {
        validate(&plan)?;
        let rendered = render_plan(&plan, codegen).map_err(CudaError::from)?;
        let functions = load_kernels(&dev, &rendered)?;
        let mut kernels = vec![None; plan.kernels.len()];
        for (i, k) in rendered.iter().enumerate() {
            kernels[k.id] = Some(i);
        }
        dev.stream.synchronize().map_err(drv("synchronize"))?;
        let (free0, _) = mem_info(&dev)?;
        let arena = DeviceBuffer::new(&dev, plan.arena_bytes as usize)?;
        dev.ctx.synchronize().map_err(drv("synchronize"))?;
        let (free1, _) = mem_info(&dev)?;
        let base = arena.ptr;
        let host_bytes = usize::try_from(plan.host_bytes).map_err(|_| {
            RuntimeError::BadPlan(format!("a host store of {} bytes", plan.host_bytes))
        })?;
        let host = copies::PinnedStore::new(&dev.ctx, host_bytes)?;
        let copies = (0..plan.steps.len())
            .any(|si| plan.transfer_op(si).is_some())
            .then(|| copies::Copies::new(&dev.ctx, plan.steps.len()))
            .transpose()?;
        let flags = StepFlags::new(&plan);
        Ok(CudaBackend {
            plan,
            dev,
            arena,
            base,
            kernels,
            rendered,
            functions,
            flags,
            graphs: None,
            profiler: None,
            host,
            copies,
            measured_arena_bytes: free0.saturating_sub(free1) as u64,
            comm: None,
        })
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }
    pub fn arena_bytes(&self) -> u64 {
        self.plan.arena_bytes
    }

    /// Poison mode, as the CPU backend's: dead buffers are filled with NaN (`cuMemsetD8Async` on
    /// the stream) after each step.
    pub fn set_poison(&mut self, on: bool) {
        self.flags.set_poison(&self.plan, on);
        if let Some(g) = self.graphs.as_mut() {
            g.clear();
        }
    }

    /// Stop right after the loss when it is not finite (no backward, no update): the step is
    /// queued in two parts with one synchronisation between them.
    pub fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
        self.flags.halt = on;
        if let Some(g) = self.graphs.as_mut() {
            g.clear();
        }
    }

    /// Runs replay CUDA graphs of their launches (captured at the first run of each pass) instead
    /// of launching kernel by kernel; see [`graph`]. Off by default. Profiled runs launch kernel
    /// by kernel whatever this says. Refused for a plan that streams (a graph is captured on one
    /// stream; the copies run on a second).
    pub fn set_cuda_graph(&mut self, on: bool) -> Result<(), RuntimeError> {
        if on && (self.comm.is_some() || self.plan.ranks > 1) {
            return Err(RuntimeError::Unsupported(
                "--cuda-graph with --data-parallel: NCCL's collectives are not captured into the step's graphs yet; run without --cuda-graph"
                    .into(),
            ));
        }
        if on && self.plan.streams() {
            return Err(RuntimeError::Unsupported(
                "CUDA graphs capture one stream; this plan streams parameters through the host \
                 store (--vram-cap below its parameters): run without --cuda-graph"
                    .into(),
            ));
        }
        self.graphs = match (on, self.graphs.take()) {
            (true, Some(g)) => Some(g),
            (true, None) => Some(graph::StepGraphs::new(&self.dev)?),
            (false, _) => None,
        };
        Ok(())
    }

    /// Times every launch of the following runs with CUDA events ([`events`]); the times
    /// accumulate per plan kernel ([`CudaBackend::profile`]). Turning it off drops them.
    pub fn set_profile(&mut self, on: bool) {
        self.profiler = match (on, self.profiler.take()) {
            (true, Some(p)) => Some(p),
            (true, None) => {
                let names = self.plan.kernels.iter().map(|k| k.name.clone()).collect();
                Some(events::Profiler::new(self.dev.ctx.clone(), names))
            }
            (false, _) => None,
        };
    }

    /// The per-kernel times of the profiled runs so far (`None` unless profiling).
    pub fn profile(&self) -> Option<crate::profile::KernelProfile> {
        self.profiler.as_ref().map(events::Profiler::profile)
    }

    /// Launches every step in plan order on the stream (or replays the graphs) and returns the
    /// loss (synchronises, the copy stream included).
    pub fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        if self.graphs.is_some() && self.profiler.is_none() {
            return self.run_graphed(step_counter, seed);
        }
        let r = run_steps(self, step_counter, seed);
        // every copy lands before the run returns (also after an error or the NaN halt)
        let landed = match self.copies.as_mut() {
            Some(c) => c.finish(),
            None => Ok(()),
        };
        let r = r.and_then(|l| landed.map(|()| l).map_err(RuntimeError::from));
        if let Some(p) = self.profiler.as_mut() {
            match r {
                // the run's loss read synchronised the stream
                Ok(_) => p.collect(step_counter)?,
                Err(_) => p.discard(),
            }
        }
        r
    }

    /// The learning rate of the next `run`s (the plan's optimizer's until set).
    pub fn set_learning_rate(&mut self, lr: f32) {
        self.flags.lr = lr;
    }

    /// Which steps the next `run`s execute (see `Backend::set_run_pass`).
    pub fn set_run_pass(&mut self, pass: dmc_plan::plan::RunPass) {
        self.flags.pass = pass;
    }

    /// Waits for the stream (and the copy stream).
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.dev.stream.synchronize().map_err(drv("synchronize"))?;
        if let Some(c) = &self.copies {
            c.synchronize()?;
        }
        Ok(())
    }
}

impl CudaBackend {
    /// A poison range must lie inside the arena.
    fn check_poison_range(&self, offset: u64, bytes: u64) -> Result<(), RuntimeError> {
        if !matches!(offset.checked_add(bytes), Some(e) if e <= self.plan.arena_bytes) {
            return Err(RuntimeError::BadPlan(format!(
                "poison outside the arena at {offset}"
            )));
        }
        Ok(())
    }
}

impl StepLauncher for CudaBackend {
    fn flags(&self) -> &StepFlags {
        &self.flags
    }

    fn flags_mut(&mut self) -> &mut StepFlags {
        &mut self.flags
    }

    fn async_copies(&self) -> bool {
        true
    }

    fn launch_step(&mut self, si: usize, scalars: &Scalars) -> Result<(), RuntimeError> {
        if let Some(c) = self.copies.as_mut() {
            // the copies due by this step land first (also before a profiled launch's start event)
            c.wait_ready(&self.dev.stream, si)?;
            if self.plan.transfer_op(si).is_some() {
                // not a kernel: not profiled
                return c.issue(&self.dev.stream, &self.plan, si, self.base, &self.host);
            }
        }
        let Some((ki, ptrs)) = step_launch(&self.plan, &self.kernels, si, self.base) else {
            return Ok(()); // leaves and reshapes: no kernel
        };
        let kernel = self.plan.steps[si].kernel;
        if let Some(p) = self.profiler.as_mut() {
            p.start(&self.dev.stream, kernel)?;
        }
        let (k, fs) = (&self.rendered[ki], &self.functions[ki]);
        for phase in k.phases() {
            match phase {
                Phase::Launch(l) => {
                    // SAFETY: `validate` (in `with_device`) checked that the plan's buffers lie
                    // inside the arena with their slots' sizes and that written arguments do not
                    // overlap others.
                    unsafe { launch_entry(&self.dev.stream, fs, k, &l, &ptrs, scalars) }?
                }
                Phase::Collective(c) => {
                    let Some((_, n)) = self.comm.as_ref() else {
                        return Err(RuntimeError::Comm(format!(
                            "{} is a data-parallel step, but no ranks were set (a bug: the run \
                             checks the ranks first)",
                            k.name
                        )));
                    };
                    // SAFETY: as above; the collective's regions were sized from the same shapes;
                    // the stream is this backend's, of its context.
                    unsafe { n.run(&c, &ptrs, self.dev.stream.cu_stream().cast()) }?;
                }
            }
        }
        if let Some(p) = self.profiler.as_mut() {
            p.end(&self.dev.stream)?;
        }
        Ok(())
    }

    fn ranks(&self) -> (usize, usize) {
        self.comm
            .as_ref()
            .map_or((1, 0), |(c, _)| (c.world(), c.rank()))
    }

    fn sum_loss(&mut self) -> Result<(), RuntimeError> {
        let Some((_, n)) = self.comm.as_ref() else {
            return Ok(());
        };
        let p = self.base + self.plan.buffers[self.plan.loss].offset;
        // SAFETY: the loss buffer (one f32 at least) lies inside the arena (validated); the
        // all-reduce is queued on the stream after the step that wrote it.
        unsafe { n.all_reduce(p, 1, self.dev.stream.cu_stream().cast()) }?;
        Ok(())
    }

    fn fill_poison(&mut self, offset: u64, bytes: u64) -> Result<(), RuntimeError> {
        self.check_poison_range(offset, bytes)?;
        if let Some(c) = self.copies.as_mut() {
            // a write-back may still read the range (released right before its `ready`)
            c.wait_overlapping(&self.dev.stream, &self.plan, offset, bytes)?;
        }
        // SAFETY: the range lies inside the arena allocation (checked); the memset is ordered on
        // the stream after the kernels launched so far.
        unsafe {
            cu::memset_d8_async(
                self.base + offset,
                0xFF,
                bytes as usize,
                self.dev.stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemsetD8Async"))?;
        Ok(())
    }
}

impl HostArena for CudaBackend {
    fn shard_rank(&self) -> usize {
        self.comm.as_ref().map_or(0, |(c, _)| c.rank())
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn write_bytes(&mut self, store: Store, offset: u64, bytes: &[u8]) -> Result<(), RuntimeError> {
        // the streams' earlier launches and copies may still read this memory
        self.synchronize()?;
        match store {
            Store::Arena => Ok(self.arena.upload(offset as usize, bytes)?),
            Store::Host => self.host.write(offset, bytes),
        }
    }

    fn read_bytes(&self, store: Store, offset: u64, len: usize) -> Result<Vec<u8>, RuntimeError> {
        self.synchronize()?;
        match store {
            Store::Arena => {
                let mut out = vec![0u8; len];
                self.arena.download(offset as usize, &mut out)?;
                Ok(out)
            }
            Store::Host => self.host.read(offset, len),
        }
    }
}

crate::host_arena::impl_backend_over_host_arena!(CudaBackend, measured_arena_bytes: |b| Some(b.measured_arena_bytes), extra: {
    fn set_profile(&mut self, on: bool) -> Result<(), crate::error::RuntimeError> {
        CudaBackend::set_profile(self, on);
        Ok(())
    }

    fn profile(&self) -> Option<crate::profile::KernelProfile> {
        CudaBackend::profile(self)
    }

    fn set_cuda_graph(&mut self, on: bool) -> Result<(), crate::error::RuntimeError> {
        CudaBackend::set_cuda_graph(self, on)
    }

    fn set_collective(&mut self, c: Arc<dyn Collective>) -> Result<(), crate::error::RuntimeError> {
        CudaBackend::set_collective(self, c)
    }

    fn collective(&self) -> Option<&dyn Collective> {
        self.comm.as_ref().map(|(c, _)| c.as_ref())
    }

    fn device_collective(&self) -> Option<String> {
        self.collective_name().map(str::to_string)
    }
});
