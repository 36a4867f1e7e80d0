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

/// A pooling window: `kh x kw`, moved by `(stride_h, stride_w)`, over the input padded by
/// `pad_top`, `pad_bottom`, `pad_left`, `pad_right` cells (PyTorch's `padding`, per side; each at
/// most half its window). Max-pooling ignores padded cells; average pooling counts them as zeros
/// (PyTorch's `count_include_pad=True`) and divides each window by its cells inside the padded
/// input. With `ceil_mode` (PyTorch's) the output extent rounds up, so the last window may hang
/// over the padded input; one that would start in the bottom / right padding is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolGeom {
    pub kh: usize,
    pub kw: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pad_top: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pad_bottom: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pad_left: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pad_right: usize,
    #[serde(default, skip_serializing_if = "is_false")]
    pub ceil_mode: bool,
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl PoolGeom {
    /// A `size x size` window, one stride, `pad` cells on every side, floor windows.
    pub const fn square(size: usize, stride: usize, pad: usize) -> PoolGeom {
        PoolGeom {
            kh: size,
            kw: size,
            stride_h: stride,
            stride_w: stride,
            pad_top: pad,
            pad_bottom: pad,
            pad_left: pad,
            pad_right: pad,
            ceil_mode: false,
        }
    }

    /// The output extent along one axis: `input` cells padded by `before` and `after`, windows of
    /// `k` moved by `s`; floor, or with `ceil_mode` rounded up and then the last window dropped
    /// when it would start in the `after` padding (PyTorch's `pooling_output_shape`).
    pub fn extent(
        input: usize,
        k: usize,
        s: usize,
        before: usize,
        after: usize,
        ceil_mode: bool,
    ) -> Result<usize, String> {
        if k == 0 || s == 0 {
            return Err("pool size and stride must be positive".into());
        }
        if before > k / 2 || after > k / 2 {
            return Err(format!(
                "pool padding ({before}, {after}) more than half the window {k}"
            ));
        }
        let padded = input.saturating_add(before).saturating_add(after);
        let Some(r) = padded.checked_sub(k) else {
            return Err(format!("pool window {k} larger than padded input {padded}"));
        };
        let mut out = if ceil_mode { r.div_ceil(s) } else { r / s } + 1;
        if ceil_mode && (out - 1) * s >= input + before {
            out -= 1;
        }
        Ok(out)
    }

    /// The output (height, width) over an `h x w` input.
    pub fn out_hw(&self, h: usize, w: usize) -> Result<(usize, usize), String> {
        Ok((
            Self::extent(
                h,
                self.kh,
                self.stride_h,
                self.pad_top,
                self.pad_bottom,
                self.ceil_mode,
            )?,
            Self::extent(
                w,
                self.kw,
                self.stride_w,
                self.pad_left,
                self.pad_right,
                self.ceil_mode,
            )?,
        ))
    }

    /// The cells of window `o` along one axis inside the padded input `[-before, n + after)`
    /// (average pooling's divisor along that axis): `k` unless a ceil-mode window hangs over.
    pub fn cells(o: usize, k: usize, s: usize, before: usize, n: usize, after: usize) -> usize {
        let start = o * s; // in padded coordinates
        (start + k).min(n + before + after).saturating_sub(start)
    }

    /// Average pooling's divisor of output `(oy, ox)` over an `h x w` input.
    pub fn divisor(&self, oy: usize, ox: usize, h: usize, w: usize) -> usize {
        Self::cells(oy, self.kh, self.stride_h, self.pad_top, h, self.pad_bottom)
            * Self::cells(ox, self.kw, self.stride_w, self.pad_left, w, self.pad_right)
    }

    /// Whether every window has all `kh * kw` cells inside the padded input (always without
    /// `ceil_mode`), so the divisor is the window's size.
    pub fn full_windows(&self, h: usize, w: usize) -> bool {
        match self.out_hw(h, w) {
            Ok((ho, wo)) => {
                (ho == 0
                    || (ho - 1) * self.stride_h + self.kh <= h + self.pad_top + self.pad_bottom)
                    && (wo == 0
                        || (wo - 1) * self.stride_w + self.kw <= w + self.pad_left + self.pad_right)
            }
            Err(_) => true,
        }
    }
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
    /// [`OpFacts::workspace_elems`] without the room a GPU split-K needs (`super::split`): what
    /// the CPU needs, and what a plan fitted to a tight cap plans.
    fn workspace_elems_unsplit(&self, shapes: &[Vec<usize>]) -> Vec<usize> {
        self.workspace_elems(shapes)
    }
    /// The shape rule: output types from input types (arity and dtypes already checked against
    /// [`OpFacts::params`]). `hint` is the expected type of output 0, required by the ops whose
    /// output is not a function of their inputs (see [`Op::infer_outputs`](super::Op::infer_outputs)).
    fn infer(
        &self,
        inputs: &[TensorType],
        hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError>;
    /// Floating-point operations of one launch, given the full shapes of the node's inputs (slot
    /// order) and outputs. A multiply-add counts 2; elementwise work one per element read.
    fn flops(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64;
    /// What one launch does on the CPU backend (the terms of the CPU time model,
    /// [`crate::cpu`]), given the shapes as for [`OpFacts::flops`]. By default one parallel loop
    /// streaming every input and output once; the GEMM families say their calls.
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        let elems: u64 = ins.iter().chain(outs).map(|s| super::shape::numel(s)).sum();
        crate::cpu::CpuWork::stream(elems * 4)
    }
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
