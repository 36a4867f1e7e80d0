//! `--profile` on the CUDA backend: a pair of timing events recorded on the stream around each
//! kernel launch, read after the run's closing synchronisation and fed into a
//! [`ProfileAccumulator`].
//!
//! The events are created once and reused (creating two per launch would put driver calls that
//! allocate between the launches). An event pair measures the GPU time from the end of the work
//! before the launch to the end of the launch, so a GPU that waits for the host to submit the
//! kernel counts the wait: the profile runs without the CUDA graph, launch by launch, and its
//! step is slower than an unprofiled one by about the launch overhead.

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;

use super::drv;
use crate::error::CudaError;
use crate::profile::{KernelProfile, ProfileAccumulator};

/// Events around the launches of one run, then their times per plan kernel.
pub(crate) struct Profiler {
    ctx: Arc<CudaContext>,
    /// Reused (start, end) pairs; the first `used` are recorded in the current run.
    pairs: Vec<(CudaEvent, CudaEvent)>,
    /// The plan kernel of each recorded pair.
    kernels: Vec<usize>,
    acc: ProfileAccumulator,
}

impl Profiler {
    /// For a plan whose kernel `i` is named `names[i]`.
    pub(crate) fn new(ctx: Arc<CudaContext>, names: Vec<String>) -> Self {
        Profiler {
            ctx,
            pairs: Vec::new(),
            kernels: Vec::new(),
            acc: ProfileAccumulator::new(names, "CUDA events around each launch"),
        }
    }

    fn event(&self) -> Result<CudaEvent, CudaError> {
        // timing events (the driver's default flags), unlike cudarc's default
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventCreate"))
    }

    /// Records the start event of the next launch, of plan kernel `kernel`, on `stream`.
    pub(crate) fn start(&mut self, stream: &CudaStream, kernel: usize) -> Result<(), CudaError> {
        let i = self.kernels.len();
        if self.pairs.len() <= i {
            let pair = (self.event()?, self.event()?);
            self.pairs.push(pair);
        }
        self.pairs[i]
            .0
            .record(stream)
            .map_err(drv("cuEventRecord"))?;
        self.kernels.push(kernel);
        Ok(())
    }

    /// Records the end event of the launch [`Profiler::start`] began.
    pub(crate) fn end(&mut self, stream: &CudaStream) -> Result<(), CudaError> {
        let Some(i) = self.kernels.len().checked_sub(1) else {
            return Ok(());
        };
        self.pairs[i].1.record(stream).map_err(drv("cuEventRecord"))
    }

    /// Reads the times of the launches recorded since the last call (the stream has been
    /// synchronised by the run's loss read; `elapsed_ms` waits for the events anyway) as those
    /// of training step `step`.
    pub(crate) fn collect(&mut self, step: u64) -> Result<(), CudaError> {
        for (i, &k) in self.kernels.iter().enumerate() {
            let (a, b) = &self.pairs[i];
            let ms = a.elapsed_ms(b).map_err(drv("cuEventElapsedTime"))?;
            self.acc.record(step, k, f64::from(ms));
        }
        self.kernels.clear();
        Ok(())
    }

    /// Forgets the launches of a run that failed before [`Profiler::collect`].
    pub(crate) fn discard(&mut self) {
        self.kernels.clear();
    }

    pub(crate) fn profile(&self) -> KernelProfile {
        self.acc.profile()
    }
}
