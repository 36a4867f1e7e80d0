//! Poison mode's schedule, shared by every backend: per step, the buffers whose live range ends
//! there and that nothing reads later ([`poison_lists`]), to be filled with NaN after that step;
//! and which buffers are only views of another buffer's value ([`view_buffers`]), which the
//! memory check of [`validate`](crate::validate) also exempts.

use dmc_plan::op::Role;
use dmc_plan::plan::{BufferId, BufferKind, Plan};

/// Buffers that are views of another buffer's value (a `Reshape` output given its own buffer
/// entry): never written by a step and not filled by the runtime.
pub(crate) fn view_buffers(plan: &Plan) -> Vec<bool> {
    let mut written = vec![false; plan.buffers.len()];
    for s in &plan.steps {
        let Some(k) = plan.kernels.get(s.kernel) else {
            continue;
        };
        for (&id, p) in s.args.iter().zip(&k.signature.params) {
            if p.role != Role::In && id < written.len() {
                written[id] = true;
            }
        }
    }
    plan.buffers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            !written[i]
                && !matches!(
                    b.kind,
                    BufferKind::Input | BufferKind::Parameter | BufferKind::OptimizerState
                )
        })
        .collect()
}

/// Per step, the buffers to poison after it (see
/// [`CpuBackend::set_poison`](crate::CpuBackend::set_poison)).
pub(crate) fn poison_lists(plan: &Plan) -> Vec<Vec<BufferId>> {
    let mut out = vec![Vec::new(); plan.steps.len()];
    let views = view_buffers(plan);
    for b in &plan.buffers {
        // (an offloaded activation's home in the host store is not arena memory)
        if b.persistent || plan.read_after_steps(b.id) || b.bytes == 0 || !b.store.is_arena() {
            continue;
        }
        let end = b.live.1;
        if end >= plan.steps.len() {
            continue;
        }
        let view_still_live = plan.buffers.iter().any(|o| {
            o.id != b.id
                && o.store == b.store
                && o.offset == b.offset
                && o.bytes == b.bytes
                && (views[o.id] || views[b.id])
                && (o.persistent || o.live.1 > end)
        });
        if !view_still_live {
            out[end].push(b.id);
        }
    }
    out
}
