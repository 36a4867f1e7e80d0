//! `--cuda-graph`: a run's launches captured once into CUDA graphs and replayed, one graph launch
//! per segment instead of one `cuLaunchKernel` per kernel.
//!
//! * **What is captured.** A run in one pass ([`RunPass`]: the whole step, an accumulating
//!   micro-batch, clip_norm's norm or update pass) launches its own subset of the plan's steps, so
//!   each pass gets its own graphs, captured at its first run. The steps are cut into
//!   [`segments`] where the NaN halt reads the loss: with the halt on (as `dmc run` has it), the
//!   forward up to the loss is one graph, the host reads the loss (the step's one synchronisation
//!   besides the end of the step), and the backward and update are a second graph launched only
//!   when it is finite. Poison mode's NaN fills are memset nodes in the graphs. Changing poison
//!   mode or the halt drops the graphs (they are captured again).
//! * **Per-step scalars.** Every kernel takes `seed`, `step` and `lr` by value, and they change
//!   from step to step. Before a replay whose scalars differ from the ones the graph holds, each
//!   kernel node gets its new arguments with `cuGraphExecKernelNodeSetParams` (same function, same
//!   geometry, same pointers). That is one cheap driver call per node on the host, which does not
//!   wait for the GPU, and it keeps the kernels and the plan as they are; re-capturing and
//!   `cuGraphExecUpdate` would cost as much host time as launching, and reading the scalars from
//!   a device buffer would change every kernel's parameter list. The node handles come from
//!   `cuStreamGetCaptureInfo` right after each captured launch, so they are in launch order.
//! * **Streams.** Capturing needs a stream other than the legacy default stream the backend works
//!   on, so the graphs are captured on a stream of their own and launched on the backend's
//!   stream: copies in and out and the loss read stay ordered with them exactly as with plain
//!   launches.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result as cu, sys, CudaFunction, CudaGraph, CudaStream};
use dmc_codegen::{CudaKernel, Scalars};
use dmc_plan::plan::RunPass;

use super::{drv, launch_one, CudaBackend, Device};
use crate::error::{CudaError, RuntimeError};
use crate::host_arena::{run_scalars, segments, step_launch, HostArena, Segment};

/// A captured kernel launch: its node and what its arguments are rebuilt from.
struct KernelNode {
    node: sys::CUgraphNode,
    /// The rendered kernel and which of its launches ([`CudaKernel::launches`]).
    kernel: usize,
    launch: usize,
    grid: [u32; 3],
    block: [u32; 3],
    /// The step's argument pointers, one per signature slot.
    ptrs: Vec<u64>,
}

/// One segment's graph, instantiated.
struct SegmentGraph {
    /// `None` for a segment that launched nothing (leaves and reshapes only).
    graph: Option<CudaGraph>,
    nodes: Vec<KernelNode>,
    check_loss: bool,
    /// The scalars the kernel nodes hold now.
    scalars: Scalars,
}

/// The graphs of each pass run so far, and the stream they are captured on.
pub(crate) struct StepGraphs {
    capture: Arc<CudaStream>,
    by_pass: Vec<(RunPass, Vec<SegmentGraph>)>,
}

impl StepGraphs {
    pub(crate) fn new(dev: &Device) -> Result<Self, CudaError> {
        let capture = dev.ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        Ok(StepGraphs {
            capture,
            by_pass: Vec::new(),
        })
    }

    /// Drops every graph (poison mode or the halt changed what a run launches).
    pub(crate) fn clear(&mut self) {
        self.by_pass.clear();
    }
}

/// The node the last captured operation on `s` added: the stream's one capture dependency.
fn last_node(s: &CudaStream) -> Result<sys::CUgraphNode, CudaError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut n: usize = 0;
    // SAFETY: every out-pointer addresses a local of the right type; `s` is a live stream of the
    // current context (bound by the launch just made on it).
    unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            s.cu_stream(),
            &mut status,
            &mut id,
            &mut graph,
            &mut deps,
            &mut n,
        )
    }
    .result()
    .map_err(drv("cuStreamGetCaptureInfo"))?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        || n != 1
        || deps.is_null()
    {
        return Err(CudaError::Driver {
            what: "cuStreamGetCaptureInfo".into(),
            message: format!(
                "expected one capture dependency on an active capture, got {n} (status {status:?})"
            ),
        });
    }
    // SAFETY: the driver returned an array of `n` = 1 node handles, valid until the next call on
    // the stream; the handle is copied out now.
    Ok(unsafe { *deps })
}

impl CudaBackend {
    /// Enqueues segment `seg`'s launches and poison fills on the capturing stream `s`, with
    /// `scalars`, and returns its kernel nodes in launch order.
    fn record_segment(
        &self,
        s: &CudaStream,
        seg: &Segment,
        scalars: &Scalars,
    ) -> Result<Vec<KernelNode>, RuntimeError> {
        let mut nodes = Vec::new();
        for &si in &seg.steps {
            if let Some((ki, ptrs)) = step_launch(&self.plan, &self.kernels, si, self.base) {
                let k = &self.rendered[ki];
                // (a graphed plan has no data-parallel programs: one function per launch)
                for (li, (f, l)) in self.functions[ki].iter().zip(k.launches()).enumerate() {
                    let vals = k.launch_values(&ptrs, scalars, l.col0);
                    // SAFETY: `validate` (in `with_codegen`) checked that the plan's buffers lie
                    // inside the arena with their slots' sizes and that written arguments do not
                    // overlap others; a captured launch only records the node.
                    unsafe { launch_one(s, f, &l, &vals) }?;
                    nodes.push(KernelNode {
                        node: last_node(s)?,
                        kernel: ki,
                        launch: li,
                        grid: l.grid,
                        block: l.block,
                        ptrs: ptrs.clone(),
                    });
                }
            }
            for &(_, off, n) in self.flags.poison_after(si) {
                self.check_poison_range(off, n)?;
                // SAFETY: the range lies inside the arena allocation (checked); captured as a
                // memset node ordered after the launches before it.
                unsafe { cu::memset_d8_async(self.base + off, 0xFF, n as usize, s.cu_stream()) }
                    .map_err(drv("cuMemsetD8Async"))?;
            }
        }
        Ok(nodes)
    }

    /// Captures and instantiates the graph of one segment (its nodes holding `scalars`).
    fn capture_segment(
        &self,
        s: &Arc<CudaStream>,
        seg: &Segment,
        scalars: &Scalars,
    ) -> Result<SegmentGraph, RuntimeError> {
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("cuStreamBeginCapture"))?;
        let recorded = self.record_segment(s, seg, scalars);
        // ended whether or not recording failed, so that the stream leaves capture mode
        let ended = s.end_capture(sys::CUgraphInstantiate_flags(0));
        let nodes = recorded?;
        let graph = ended.map_err(drv("cuStreamEndCapture / cuGraphInstantiate"))?;
        if graph.is_none() && !nodes.is_empty() {
            return Err(CudaError::Driver {
                what: "cuStreamEndCapture".into(),
                message: format!(
                    "{} launches were captured but no graph came back",
                    nodes.len()
                ),
            }
            .into());
        }
        Ok(SegmentGraph {
            graph,
            nodes,
            check_loss: seg.check_loss,
            scalars: *scalars,
        })
    }

    /// Runs the steps of the current pass as graphs (capturing them at the pass's first run) and
    /// returns the loss, with the same halt and poison behaviour as
    /// [`run_steps`](crate::host_arena::run_steps).
    pub(super) fn run_graphed(
        &mut self,
        step_counter: u64,
        seed: u64,
    ) -> Result<f32, RuntimeError> {
        let scalars = run_scalars(&self.flags, step_counter, seed, 0);
        let pass = self.flags.pass;
        self.plan
            .check_run_pass(pass)
            .map_err(RuntimeError::RunPass)?;
        let Some(g) = self.graphs.as_ref() else {
            return Err(RuntimeError::BadPlan("no CUDA graphs set up".into()));
        };
        let pi = match g.by_pass.iter().position(|(p, _)| *p == pass) {
            Some(i) => i,
            None => {
                let s = g.capture.clone();
                let segs = segments(&self.plan, pass, self.flags.halt)
                    .iter()
                    .map(|seg| self.capture_segment(&s, seg, &scalars))
                    .collect::<Result<Vec<_>, _>>()?;
                let Some(g) = self.graphs.as_mut() else {
                    return Err(RuntimeError::BadPlan("no CUDA graphs set up".into()));
                };
                g.by_pass.push((pass, segs));
                g.by_pass.len() - 1
            }
        };
        let n = self.graphs.as_ref().map_or(0, |g| g.by_pass[pi].1.len());
        for i in 0..n {
            let check_loss = match self.graphs.as_mut() {
                Some(g) => {
                    let seg = &mut g.by_pass[pi].1[i];
                    replay(
                        seg,
                        &self.rendered,
                        &self.functions,
                        &self.dev.stream,
                        &scalars,
                    )?;
                    seg.check_loss
                }
                None => false,
            };
            if check_loss {
                let l = self.loss()?;
                if !l.is_finite() {
                    return Ok(l);
                }
            }
        }
        self.loss()
    }
}

/// Gives `seg`'s kernel nodes `scalars` (when they hold others) and launches its graph on
/// `stream`.
fn replay(
    seg: &mut SegmentGraph,
    rendered: &[CudaKernel],
    functions: &[Vec<CudaFunction>],
    stream: &CudaStream,
    scalars: &Scalars,
) -> Result<(), CudaError> {
    let Some(graph) = &seg.graph else {
        return Ok(());
    };
    if seg.scalars != *scalars {
        for n in &seg.nodes {
            let mut vals = rendered[n.kernel].launch_values(&n.ptrs, scalars, 0);
            let mut args: Vec<*mut c_void> = vals
                .iter_mut()
                .map(|v| (v as *mut u64).cast::<c_void>())
                .collect();
            let p = sys::CUDA_KERNEL_NODE_PARAMS {
                func: functions[n.kernel][n.launch].cu_function(),
                gridDimX: n.grid[0],
                gridDimY: n.grid[1],
                gridDimZ: n.grid[2],
                blockDimX: n.block[0],
                blockDimY: n.block[1],
                blockDimZ: n.block[2],
                sharedMemBytes: 0,
                kernelParams: args.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            // SAFETY: the node was captured into this graph's exec from a launch of the same
            // function with the same geometry and parameter list (one 8-byte value per
            // parameter, as `launch_values` builds it); `args` points at `vals`, both alive for
            // the call, which copies them. A replay already in flight keeps its old arguments.
            unsafe { sys::cuGraphExecKernelNodeSetParams_v2(graph.cu_graph_exec(), n.node, &p) }
                .result()
                .map_err(drv("cuGraphExecKernelNodeSetParams"))?;
        }
        seg.scalars = *scalars;
    }
    // SAFETY: the exec is owned by `graph` and alive; `stream` is the backend's stream, of the
    // context the graph was captured in.
    unsafe { cu::graph::launch(graph.cu_graph_exec(), stream.cu_stream()) }
        .map_err(drv("cuGraphLaunch"))
}
