//! Streaming on the CUDA backend: the pinned host store and the copy steps
//! ([`TransferOp`]) run asynchronously on a second stream.
//!
//! * **The host store** ([`PinnedStore`]) is one `cuMemHostAlloc` of the plan's `host_bytes`
//!   (page-locked, so the copies are truly asynchronous; not write-combined, since the host reads
//!   written-back tensors from it), zeroed, freed on drop. Nothing is allocated when the plan has
//!   no host store.
//! * **A copy step** ([`Copies::issue`]) records an event on the compute stream and makes the copy
//!   stream wait on it, so the copy starts only after every step launched before it (its window's
//!   previous occupants are done with it, and poison mode's NaN fill of a host-to-device window is
//!   ordered before the copy), then queues the `cuMemcpyHtoDAsync`/`cuMemcpyDtoHAsync` on the copy
//!   stream and records the copy's completion event there. The copy stream runs its copies in
//!   issue order.
//! * **`ready`**: before any step `s` is launched, the compute stream waits for every pending copy
//!   whose `ready <= s` ([`Copies::wait_ready`]). Poison fills (which the plan's order does not
//!   cover: a write-back's window is released right before its `ready`) also wait for the pending
//!   copies that touch their range ([`Copies::wait_overlapping`]). The end of a run synchronises
//!   the copy stream ([`Copies::finish`]), so the host store and the next run see every copy.
//! * **Events** are created once per plan: one shared "issued" event (a stream's wait takes the
//!   event's latest record at the time of the call, so re-recording it later is harmless) and one
//!   completion event per copy step, created at its first copy; all without timing.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result as cu, sys, CudaContext, CudaEvent, CudaStream};
use dmc_plan::op::TransferOp;
use dmc_plan::plan::Plan;

use super::drv;
use crate::error::{CudaError, RuntimeError};

/// The host store: page-locked host memory, zeroed, freed on drop (null when empty).
pub(crate) struct PinnedStore {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: the store is uniquely owned memory (like a `Box<[u8]>`); the host accesses it through
// `&self` / `&mut self` of the backend, after synchronising the streams whose copies use it.
unsafe impl Send for PinnedStore {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for PinnedStore {}

impl PinnedStore {
    /// `bytes` bytes of zeroed page-locked memory (none when `bytes` is 0).
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, CudaError> {
        let mut s = PinnedStore {
            ctx: ctx.clone(),
            ptr: std::ptr::null_mut(),
            bytes: 0,
        };
        if bytes == 0 {
            return Ok(s);
        }
        ctx.bind_to_thread().map_err(drv("bind context"))?;
        // SAFETY: the context is current on this thread; the size is non-zero; the memory is
        // uninitialised until zeroed below and nothing reads it before.
        let p = unsafe { cu::malloc_host(bytes, 0) }.map_err(|e| CudaError::Driver {
            what: format!("cuMemHostAlloc of {bytes} bytes (the host store)"),
            message: e.to_string(),
        })?;
        s.ptr = p.cast::<u8>();
        s.bytes = bytes;
        // SAFETY: `s.ptr` addresses `bytes` writable bytes just allocated, used by nothing else.
        unsafe { std::ptr::write_bytes(s.ptr, 0, bytes) };
        Ok(s)
    }

    /// The start of `[offset, +len)` as an index, when the range lies inside the store.
    fn range(&self, offset: u64, len: usize) -> Result<usize, RuntimeError> {
        usize::try_from(offset)
            .ok()
            .filter(|&o| matches!(o.checked_add(len), Some(e) if e <= self.bytes))
            .ok_or_else(|| {
                RuntimeError::BadPlan(format!(
                    "[{offset}, +{len}) is outside the {}-byte host store",
                    self.bytes
                ))
            })
    }

    /// Copies `src` to `offset` (the caller has synchronised the copy stream).
    pub(crate) fn write(&mut self, offset: u64, src: &[u8]) -> Result<(), RuntimeError> {
        let o = self.range(offset, src.len())?;
        if !src.is_empty() {
            // SAFETY: `[o, +len)` lies inside the allocation (checked; non-empty, so `ptr` is not
            // null); no copy is in flight (the caller synchronised); `src` is a distinct host slice.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(o), src.len()) };
        }
        Ok(())
    }

    /// Copies `len` bytes from `offset` (the caller has synchronised the copy stream).
    pub(crate) fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let o = self.range(offset, len)?;
        let mut out = vec![0u8; len];
        if len > 0 {
            // SAFETY: `[o, +len)` lies inside the allocation (checked; non-empty, so `ptr` is not
            // null); no copy is writing it (the caller synchronised); `out` has `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(o), out.as_mut_ptr(), len) };
        }
        Ok(out)
    }

    /// The address of `[offset, +len)` (`len > 0`), for an asynchronous copy.
    fn at(&self, offset: u64, len: usize) -> Result<*mut c_void, RuntimeError> {
        let o = self.range(offset, len)?;
        // SAFETY: `o + len <= bytes` (checked) and `len > 0`, so `ptr` is the live allocation and
        // `ptr + o` stays inside it.
        Ok(unsafe { self.ptr.add(o) }.cast::<c_void>())
    }
}

impl Drop for PinnedStore {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        if self.ctx.bind_to_thread().is_ok() {
            // no copy may still read or write it
            let _ = self.ctx.synchronize();
            // SAFETY: allocated by `cuMemHostAlloc` in `new`, freed once; no copy uses it any more.
            let _ = unsafe { cu::free_host(self.ptr.cast::<c_void>()) };
        }
    }
}

/// The copy stream, its events, and the copies of the current run not yet waited for.
pub(crate) struct Copies {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Recorded on the compute stream right before each copy is queued; the copy stream waits on it.
    issued: CudaEvent,
    /// Per plan step, the event recorded on the copy stream after its copy (created at its first).
    done: Vec<Option<CudaEvent>>,
    /// Copies queued in this run that the compute stream has not waited for: (ready, step).
    pending: Vec<(usize, usize)>,
}

fn event(ctx: &Arc<CudaContext>) -> Result<CudaEvent, CudaError> {
    ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(drv("cuEventCreate"))
}

impl Copies {
    /// The copy stream of a plan of `steps` steps.
    pub(crate) fn new(ctx: &Arc<CudaContext>, steps: usize) -> Result<Self, CudaError> {
        Ok(Copies {
            ctx: ctx.clone(),
            stream: ctx.new_stream().map_err(drv("cuStreamCreate (copies)"))?,
            issued: event(ctx)?,
            done: (0..steps).map(|_| None).collect(),
            pending: Vec::new(),
        })
    }

    /// Makes `compute` wait for the pending copies for which `due(ready, step)` holds, and forgets
    /// them (the compute stream's later work is ordered after them).
    fn wait_where(
        &mut self,
        compute: &CudaStream,
        mut due: impl FnMut(usize, usize) -> bool,
    ) -> Result<(), CudaError> {
        let mut i = 0;
        while i < self.pending.len() {
            let (ready, step) = self.pending[i];
            if due(ready, step) {
                if let Some(e) = &self.done[step] {
                    compute.wait(e).map_err(drv("cuStreamWaitEvent"))?;
                }
                self.pending.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Before step `si` is launched on `compute`: the copies that must have landed by then.
    pub(crate) fn wait_ready(&mut self, compute: &CudaStream, si: usize) -> Result<(), CudaError> {
        self.wait_where(compute, |ready, _| ready <= si)
    }

    /// Before `compute` writes arena bytes `[offset, +bytes)` outside the plan's steps (a poison
    /// fill): the pending copies whose window overlaps them.
    pub(crate) fn wait_overlapping(
        &mut self,
        compute: &CudaStream,
        plan: &Plan,
        offset: u64,
        bytes: u64,
    ) -> Result<(), CudaError> {
        let end = offset.saturating_add(bytes);
        self.wait_where(compute, |_, step| {
            window(plan, step)
                .is_some_and(|w| w.offset < end && offset < w.offset.saturating_add(w.bytes))
        })
    }

    /// Queues copy step `si` on the copy stream, after the work queued so far on `compute` (see
    /// the module doc); `base` is the arena's device address.
    pub(crate) fn issue(
        &mut self,
        compute: &CudaStream,
        plan: &Plan,
        si: usize,
        base: u64,
        host: &PinnedStore,
    ) -> Result<(), RuntimeError> {
        let bad = || RuntimeError::BadPlan(format!("step {si} is not a copy step"));
        let op = plan.transfer_op(si).ok_or_else(bad)?;
        let s = &plan.steps[si];
        let arg = |i: usize| s.args.get(i).and_then(|&id| plan.buffers.get(id));
        let (src, dst) = arg(0).zip(arg(1)).ok_or_else(bad)?;
        let (h, d) = match op {
            TransferOp::HostToDevice => (src, dst),
            TransferOp::DeviceToHost => (dst, src),
        };
        let n = usize::try_from(src.bytes).map_err(|_| bad())?;
        let ready = s.ready.unwrap_or(plan.steps.len());
        // checked before anything is queued
        let hp = if n > 0 {
            Some(host.at(h.offset, n)?)
        } else {
            None
        };
        if self.done[si].is_none() {
            self.done[si] = Some(event(&self.ctx)?);
        }
        self.ctx.bind_to_thread().map_err(drv("bind context"))?;
        self.issued.record(compute).map_err(drv("cuEventRecord"))?;
        self.stream
            .wait(&self.issued)
            .map_err(drv("cuStreamWaitEvent"))?;
        if let Some(hp) = hp {
            let dp = base + d.offset;
            let cs = self.stream.cu_stream();
            // SAFETY: `dp` addresses `n` bytes inside the arena allocation (`validate` checked
            // the window lies inside the arena, and the copied buffers have the same size); `hp`
            // addresses `n` bytes inside the pinned host store (checked), which outlives the copy
            // (the store is touched or freed only after synchronising the copy stream); the copy
            // stream waits for the compute work before it, and the compute stream waits for the
            // copy before step `ready`, so nothing else uses the range meanwhile.
            let r = unsafe {
                match op {
                    TransferOp::HostToDevice => sys::cuMemcpyHtoDAsync_v2(dp, hp, n, cs),
                    TransferOp::DeviceToHost => sys::cuMemcpyDtoHAsync_v2(hp, dp, n, cs),
                }
            };
            r.result().map_err(drv(match op {
                TransferOp::HostToDevice => "cuMemcpyHtoDAsync",
                TransferOp::DeviceToHost => "cuMemcpyDtoHAsync",
            }))?;
        }
        if let Some(e) = &self.done[si] {
            e.record(&self.stream).map_err(drv("cuEventRecord"))?;
        }
        self.pending.push((ready, si));
        Ok(())
    }

    /// Waits for every copy queued (the end of a run): nothing is pending any more.
    pub(crate) fn finish(&mut self) -> Result<(), CudaError> {
        self.pending.clear();
        self.synchronize()
    }

    /// Waits for the copy stream.
    pub(crate) fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(drv("synchronize the copy stream"))
    }
}

/// The arena buffer (window) copy step `si` reads or writes.
fn window(plan: &Plan, si: usize) -> Option<&dmc_plan::plan::Buffer> {
    let s = plan.steps.get(si)?;
    let i = match plan.transfer_op(si)? {
        TransferOp::HostToDevice => 1,
        TransferOp::DeviceToHost => 0,
    };
    plan.buffers.get(*s.args.get(i)?)
}

/// This device's pinned-copy bandwidth, bytes/s (host-to-device, device-to-host): four copies of
/// 64 MiB each way between a pinned host buffer and device memory, timed around a synchronised
/// stream. For `dmc plan`'s streaming line on a machine with a GPU.
pub fn measure_link(d: &super::Device) -> Result<(f64, f64), RuntimeError> {
    const N: usize = 64 << 20;
    const REPS: u32 = 4;
    let mut host = PinnedStore::new(&d.ctx, N)?;
    host.write(0, &vec![1u8; N])?;
    let hp = host.at(0, N)?;
    d.ctx.bind_to_thread().map_err(drv("bind context"))?;
    // SAFETY: the context is current; a non-zero size.
    let dp = unsafe { cu::malloc_sync(N) }.map_err(drv("cuMemAlloc (link bandwidth)"))?;
    let cs = d.stream.cu_stream();
    let time = |up: bool| -> Result<f64, RuntimeError> {
        let t = std::time::Instant::now();
        for _ in 0..REPS {
            // SAFETY: `dp` and `hp` address N bytes each (allocated above, freed below, after the
            // stream is synchronised); nothing else uses them.
            let r = unsafe {
                if up {
                    sys::cuMemcpyHtoDAsync_v2(dp, hp, N, cs)
                } else {
                    sys::cuMemcpyDtoHAsync_v2(hp, dp, N, cs)
                }
            };
            r.result().map_err(drv("cuMemcpyAsync (link bandwidth)"))?;
        }
        d.stream.synchronize().map_err(drv("synchronize"))?;
        Ok(f64::from(REPS) * N as f64 / t.elapsed().as_secs_f64().max(1e-9))
    };
    // a first copy each way wakes the link up
    let r = time(true)
        .and_then(|_| time(false))
        .and_then(|_| Ok((time(true)?, time(false)?)));
    let _ = d.stream.synchronize();
    // SAFETY: allocated above; the stream is synchronised, so no copy uses it any more.
    let _ = unsafe { cu::free_sync(dp) };
    r
}
