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

/// 2-D convolution geometry shared by the forward and the two backward ops.
/// Padding is explicit (top/left); bottom/right padding follows from the output size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvGeom {
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad_top: usize,
    pub pad_left: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolGeom {
    pub size: usize,
    pub stride: usize,
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
