//! The vocabulary of the ops' facts: element types, value types, geometries, kernel signatures
//! (argument names, roles, dtypes), shape errors, and the [`OpFacts`] trait every family of ops
//! implements.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    I32,
    /// Compact indices (max-pool argmax within its window).
    U8,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::U8 => 1,
        }
    }
}

/// 2-D convolution geometry shared by the forward and the two backward ops: kernel `kh x kw`,
/// strides, padding on each side, dilation and groups. Input pixel of output `(oy, ox)` and tap
/// `(ky, kx)`: `(oy*stride_h + ky*dil_h - pad_top, ox*stride_w + kx*dil_w - pad_left)`; the output
/// extent is `(h + pad_top + pad_bottom - dil_h*(kh-1) - 1) / stride_h + 1` (floor, as PyTorch).
/// With `groups` > 1 the channels are split in `groups` equal parts, group `g`'s outputs reading
/// only group `g`'s inputs: the weight is `[kh, kw, Ci/groups, Co]` (HWIO per group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvGeom {
    pub kh: usize,
    pub kw: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub pad_top: usize,
    pub pad_bottom: usize,
    pub pad_left: usize,
    pub pad_right: usize,
    pub dil_h: usize,
    pub dil_w: usize,
    pub groups: usize,
}

impl ConvGeom {
    /// A square `k x k` kernel with one stride and the same padding on every side, no dilation,
    /// one group.
    pub const fn square(k: usize, stride: usize, pad: usize) -> ConvGeom {
        ConvGeom {
            kh: k,
            kw: k,
            stride_h: stride,
            stride_w: stride,
            pad_top: pad,
            pad_bottom: pad,
            pad_left: pad,
            pad_right: pad,
            dil_h: 1,
            dil_w: 1,
            groups: 1,
        }
    }

    /// The extent of the dilated kernel along the height (`dil_h*(kh-1) + 1`).
    pub fn span_h(&self) -> usize {
        self.dil_h * self.kh.saturating_sub(1) + 1
    }

    /// The extent of the dilated kernel along the width.
    pub fn span_w(&self) -> usize {
        self.dil_w * self.kw.saturating_sub(1) + 1
    }

    /// Output extents for an `h x w` input; `None` when a stride, the dilation, the kernel or the
    /// groups is 0, or the dilated kernel is larger than the padded input.
    pub fn out_hw(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        if self.stride_h == 0
            || self.stride_w == 0
            || self.dil_h == 0
            || self.dil_w == 0
            || self.kh == 0
            || self.kw == 0
            || self.groups == 0
        {
            return None;
        }
        let oh = (h + self.pad_top + self.pad_bottom).checked_sub(self.span_h())? / self.stride_h;
        let ow = (w + self.pad_left + self.pad_right).checked_sub(self.span_w())? / self.stride_w;
        Some((oh + 1, ow + 1))
    }

    /// Output extents of the transposed convolution of an `h x w` input (PyTorch's
    /// `ConvTranspose2d`): `(h - 1)*stride + span + out_pad - pad_top - pad_bottom` (and likewise
    /// along the width). `None` when an extent would be below 1, the input is empty, or an
    /// `out_pad` is not below its stride (then the convolution of the output would not give the
    /// input's extent back: [`ConvGeom::out_hw`] of the result is `(h, w)` exactly when `None` is
    /// not returned).
    pub fn transposed_out_hw(
        &self,
        (h, w): (usize, usize),
        (op_h, op_w): (usize, usize),
    ) -> Option<(usize, usize)> {
        if h == 0 || w == 0 || op_h >= self.stride_h || op_w >= self.stride_w {
            return None;
        }
        let ext = |n: usize, s: usize, span: usize, op: usize, p0: usize, p1: usize| {
            ((n - 1).checked_mul(s)? + span + op)
                .checked_sub(p0 + p1)
                .filter(|&e| e >= 1)
        };
        let ho = ext(
            h,
            self.stride_h,
            self.span_h(),
            op_h,
            self.pad_top,
            self.pad_bottom,
        )?;
        let wo = ext(
            w,
            self.stride_w,
            self.span_w(),
            op_w,
            self.pad_left,
            self.pad_right,
        )?;
        (self.out_hw(ho, wo) == Some((h, w))).then_some((ho, wo))
    }
}

/// A pooling window: `size x size`, moved by `stride`, over the input padded by `pad` on every
/// side (PyTorch's `padding`; max-pooling ignores padded cells, average pooling counts them as
/// zeros, PyTorch's `count_include_pad=True`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolGeom {
    pub size: usize,
    pub stride: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pad: usize,
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

/// How a kernel uses one of its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    In,
    Out,
    /// Read and overwritten in place (optimizer updates).
    InOut,
    /// Scratch, dead after the kernel.
    Workspace,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SigParam {
    pub name: String,
    pub role: Role,
    pub dtype: DType,
}

/// The one description of a kernel's arguments: the CPU backend binds buffers in this order, and the
/// CUDA backend derives both the generated parameter list and the launch arguments from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signature {
    pub params: Vec<SigParam>,
}

/// One parameter of a kernel signature as `Op::params` describes it: name, role, dtype (the
/// [`SigParam`] of the plan, without allocating its name).
pub type ParamKind = (&'static str, Role, DType);

pub(crate) fn p(name: &'static str, role: Role, dtype: DType) -> ParamKind {
    (name, role, dtype)
}

/// The facts of one family of ops, each an exhaustive `match` over the family's enum: adding an
/// op to a family means one arm in each (the compiler lists the missing ones).
pub trait OpFacts {
    /// The kernel signature's parameters: inputs in node-input order (`In`, or `InOut` when an
    /// output aliases them), then the outputs with their own buffer (`Out`), then workspaces.
    fn params(&self) -> Vec<ParamKind>;
    /// Short kernel-style name, e.g. `conv2d`, `sgd_update`.
    fn kind_name(&self) -> &'static str;
    /// Outputs written into the buffer of an input, as `(output, input)` pairs.
    fn aliased_outputs(&self) -> Vec<(usize, usize)>;
    /// Elements (f32) of each `Workspace` parameter, given the full shapes of the other
    /// signature parameters (signature order, workspaces left out).
    fn workspace_elems(&self, shapes: &[Vec<usize>]) -> Vec<usize>;
    /// The shape rule: output types from input types (arity and dtypes already checked against
    /// [`OpFacts::params`]). `hint` is the expected type of output 0, required by the ops whose
    /// output is not a function of their inputs (see [`Op::infer_outputs`]).
    fn infer(
        &self,
        inputs: &[TensorType],
        hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError>;
    /// Floating-point operations of one launch, given the full shapes of the node's inputs (slot
    /// order) and outputs. A multiply-add counts 2; elementwise work one per element read.
    fn flops(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64;
}

/// Type of one value: full shape (batch first) and element type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl TensorType {
    pub fn new(shape: Vec<usize>, dtype: DType) -> Self {
        TensorType { shape, dtype }
    }
    pub fn f32(shape: Vec<usize>) -> Self {
        TensorType {
            shape,
            dtype: DType::F32,
        }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> u64 {
        (self.numel() * self.dtype.size()) as u64
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = match self.dtype {
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::U8 => "u8",
        };
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "{d}[{}]", dims.join(","))
    }
}

/// Formats a list of types as `f32[1,2], i32[1]`.
pub fn fmt_types(ts: &[TensorType]) -> String {
    ts.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// An op applied to values whose types break its shape rule (the message names what is wrong).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(pub String);
