//! Streaming at run time, shared by every backend: which arena buffers are *windows* (filled by a
//! host-to-device copy step), and poison mode's two checks of the copy steps.
//!
//! - **A window read before its copy landed.** In poison mode a host-to-device copy fills its
//!   window with NaN when issued and lands only as late as its step's `ready` allows (right after
//!   step `ready - 1`); a write-back reads its window that late too. So a plan whose `ready`
//!   comes after a read of the window computes with NaN there, as a GPU's asynchronous copy
//!   would race. (The CUDA backend's copies are asynchronous for real; the NaN fill still marks
//!   the window.)
//! - **A write-back that is missing.** Every step that writes a window marks it dirty; its
//!   write-back landing cleans it. Poisoning a dirty window (its memory released), or ending the
//!   run with one, is [`RuntimeError::LostWriteBack`].
//!
//! Without poison mode every copy runs at its own step, synchronously on the CPU backends.

use dmc_plan::op::{Role, TransferOp};
use dmc_plan::plan::{BufferId, Plan};

use crate::error::RuntimeError;

/// What poison mode tracks of a plan's windows during a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct WindowCheck {
    /// Per buffer: whether it is the window of a persistent home (some host-to-device step
    /// fills it from one).
    window: Vec<bool>,
    /// Per step: the copy steps that land right after it (poison mode), `ready - 1` each.
    land_after: Vec<Vec<usize>>,
    /// Per buffer: the step that wrote the window since its last write-back, if any.
    dirty: Vec<Option<usize>>,
}

impl WindowCheck {
    pub(crate) fn new(plan: &Plan) -> Self {
        let mut window = vec![false; plan.buffers.len()];
        let mut land_after = vec![Vec::new(); plan.steps.len()];
        for (si, s) in plan.steps.iter().enumerate() {
            let Some(op) = plan.transfer_op(si) else {
                continue;
            };
            // an offloaded activation's window is dead after its last use: only the windows of
            // persistent homes (parameters, optimizer state) must be written back
            if op == TransferOp::HostToDevice {
                if let (Some(&h), Some(&w)) = (s.args.first(), s.args.get(1)) {
                    window[w] = plan.buffers.get(h).is_some_and(|b| b.persistent);
                }
            }
            // validated: si < ready <= steps
            let r = s.ready.unwrap_or(si + 1).clamp(si + 1, plan.steps.len());
            land_after[r - 1].push(si);
        }
        WindowCheck {
            window,
            land_after,
            dirty: vec![None; plan.buffers.len()],
        }
    }

    /// Whether the plan has copy steps at all.
    pub(crate) fn any(&self) -> bool {
        self.land_after.iter().any(|v| !v.is_empty())
    }

    /// The start of a run: nothing dirty.
    pub(crate) fn reset(&mut self) {
        self.dirty.iter_mut().for_each(|d| *d = None);
    }

    /// The copy steps that land right after step `si` in poison mode.
    pub(crate) fn land_after(&self, si: usize) -> &[usize] {
        self.land_after.get(si).map_or(&[], |v| v.as_slice())
    }

    /// Step `si` ran (a kernel) or landed (a copy): a kernel dirties the windows it writes, a
    /// write-back cleans its window.
    pub(crate) fn ran(&mut self, plan: &Plan, si: usize) {
        let s = &plan.steps[si];
        match plan.transfer_op(si) {
            Some(TransferOp::DeviceToHost) => {
                if let Some(&w) = s.args.first() {
                    self.dirty[w] = None;
                }
            }
            Some(TransferOp::HostToDevice) => {}
            None => {
                let k = &plan.kernels[s.kernel];
                for (&id, p) in s.args.iter().zip(&k.signature.params) {
                    if p.role != Role::In && self.window[id] {
                        self.dirty[id] = Some(si);
                    }
                }
            }
        }
    }

    /// Before buffer `id`'s memory is poisoned (released), or at the end of the run for every
    /// window (`id = None`): a dirty window there lost its update.
    pub(crate) fn check_released(
        &self,
        plan: &Plan,
        id: Option<BufferId>,
    ) -> Result<(), RuntimeError> {
        let lost = match id {
            Some(id) => self.dirty[id].map(|s| (id, s)),
            None => self
                .dirty
                .iter()
                .enumerate()
                .find_map(|(id, d)| d.map(|s| (id, s))),
        };
        match lost {
            Some((id, step)) => Err(RuntimeError::LostWriteBack {
                window: plan.buffers[id].name.clone(),
                step,
                label: plan.steps[step].label.clone(),
            }),
            None => Ok(()),
        }
    }
}
