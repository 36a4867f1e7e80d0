//! The transfer family: copies between the host store and the device arena, for parameters and
//! optimizer state that do not stay resident and activations offloaded between their forward and
//! backward uses (streaming, [`crate::plan::Store::Host`]). A `HostToDevice` step fills a
//! *window* (an arena buffer with a live range, placed like any other) from the tensor's home in
//! the host store; a `DeviceToHost` step writes an updated (or freshly produced) window back. Neither computes: the CPU backend copies with `memcpy`, the CUDA backend with
//! asynchronous copies on a second stream ([`crate::plan::Step::ready`] says when each must have
//! landed). They have no CUDA kernel.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::shape::{err, numel};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransferOp {
    /// host (a host-store buffer) -> window (an arena buffer of the same shape).
    HostToDevice,
    /// window (an arena buffer) -> host (the host-store buffer it was copied from).
    DeviceToHost,
}

impl OpFacts for TransferOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        vec![p("src", In, F32), p("dst", Out, F32)]
    }

    fn kind_name(&self) -> &'static str {
        match self {
            TransferOp::HostToDevice => "host_to_device",
            TransferOp::DeviceToHost => "device_to_host",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        vec![]
    }

    fn workspace_elems(&self, _shapes: &[Vec<usize>]) -> Vec<usize> {
        vec![]
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        if let Some(h) = hint {
            if h != &inputs[0] {
                return err(format!("a copy of {} cannot be {h}", inputs[0]));
            }
        }
        Ok(vec![inputs[0].clone()])
    }

    fn flops(&self, _ins: &[Vec<usize>], _outs: &[Vec<usize>]) -> u64 {
        0
    }

    /// One copy (`memcpy`, on the calling thread). A copy that fits a cache
    /// ([`crate::cpu::CACHED_OPERAND_BYTES`]): its bytes counted once, streamed — its reads and
    /// writes overlap in its string instructions, where the kernels the streaming rate is fitted
    /// on compute between them (at twice its bytes, the copies of mlp's floor were predicted
    /// 2.5-4x slow). A larger one reads and writes memory on one thread: twice its bytes,
    /// serial (the seed network's 37.7 MB weights copied in and back under a cap were predicted
    /// at a quarter of their measured time as cached copies).
    fn cpu_work(&self, ins: &[Vec<usize>], _outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        let bytes = ins.first().map_or(0, |s| numel(s)) * 4;
        if bytes > crate::cpu::CACHED_OPERAND_BYTES as u64 {
            crate::cpu::CpuWork {
                from_memory: 2 * bytes,
                ..Default::default()
            }
        } else {
            crate::cpu::CpuWork::stream(bytes)
        }
    }
}
