//! The type of an IR value: full shape (batch first) and element type.

use std::fmt;

use crate::op::DType;

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
