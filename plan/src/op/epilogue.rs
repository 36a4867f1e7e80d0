//! Elementwise work folded into the output loop of a GEMM kernel (the compiler's `fuse_epilogues`
//! pass makes them; `--no-fuse` leaves every epilogue empty). One description serves the forward
//! GEMMs (`Conv2d`, `Dense`) and the data-gradient GEMMs (`Conv2dBwdData`, `DenseBwdData`); the
//! CPU kernels apply it in their output loops and the CUDA templates render it into their store
//! (`codegen`), both with the formulas below, in the order the unfused kernels apply them, so a
//! fused step computes exactly what the unfused one does.

use serde::{Deserialize, Serialize};

use super::facts::{p, DType, ParamKind, Role, ShapeError, TensorType};
use super::shape::same;
use crate::unary::UnaryKind;

/// What a GEMM does to each output element `acc` before storing it. Empty by default.
///
/// - In a **forward** GEMM: `y = act(acc + b + r)`: `b` the op's own bias (if any), `r` an extra
///   input of y's shape when `add` (a residual connection's other operand), `act` an activation.
/// - In a **data-gradient** GEMM: `dx = act'(saved) * (acc + g)`: `g` an extra input of dx's shape
///   when `add` (the gradient of a value used twice, accumulated), and the backward of the
///   activation `act` whose output gradient dx is, reading `saved` (an extra input of dx's shape:
///   what [`UnaryKind::saved`] names, the activation's input or output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Epilogue {
    /// An extra input of the output's shape is added (`r` forward, `g` data gradient).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub add: bool,
    /// An activation applied last (forward), or its backward (data gradient).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<UnaryKind>,
}

/// Which GEMM an epilogue belongs to: its extra parameters and formula differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpilogueSide {
    /// `y = act(acc + b + r)`.
    Forward,
    /// `dx = act'(saved) * (acc + g)`.
    DataGradient,
}

impl Epilogue {
    /// The empty epilogue: the GEMM stores `acc` (plus its bias).
    pub const NONE: Epilogue = Epilogue {
        add: false,
        act: None,
    };

    pub fn is_none(&self) -> bool {
        *self == Epilogue::NONE
    }

    /// The CPU work of its activation on `elems` outputs ([`crate::cpu::CpuWork::special`]): the
    /// forward formula in a forward GEMM, the backward one in a data gradient.
    pub fn special(&self, side: EpilogueSide, elems: u64) -> Option<(crate::cpu::Special, u64)> {
        use crate::cpu::Special;
        self.act.map(|k| match side {
            EpilogueSide::Forward => (Special::Forward(k), elems),
            EpilogueSide::DataGradient => (Special::Backward(k), elems),
        })
    }

    /// The extra inputs of the op's signature, in order, after the op's own inputs: `r` (forward)
    /// or `g` (data gradient) when `add`, then `saved` (data gradient with an activation).
    pub fn params(&self, side: EpilogueSide) -> Vec<ParamKind> {
        let mut v = vec![];
        match side {
            EpilogueSide::Forward => {
                if self.add {
                    v.push(p("r", Role::In, DType::F32));
                }
            }
            EpilogueSide::DataGradient => {
                if self.add {
                    v.push(p("g", Role::In, DType::F32));
                }
                if self.act.is_some() {
                    v.push(p("saved", Role::In, DType::F32));
                }
            }
        }
        v
    }

    /// Number of extra inputs ([`Epilogue::params`]; without building them: the CPU executor asks
    /// on every step).
    pub fn num_inputs(&self, side: EpilogueSide) -> usize {
        match side {
            EpilogueSide::Forward => self.add as usize,
            EpilogueSide::DataGradient => self.add as usize + self.act.is_some() as usize,
        }
    }

    /// The shape rule of the extra inputs: each has the output's shape.
    pub fn check(&self, out: &TensorType, extra: &[TensorType]) -> Result<(), ShapeError> {
        for t in extra {
            same(out, t, "epilogue input and output")?;
        }
        Ok(())
    }

    /// FLOPs of the epilogue over `n` output elements (one per add, one per activation, as the
    /// unfused elementwise kernels count them).
    pub fn flops(&self, n: u64) -> u64 {
        n * (self.add as u64 + self.act.is_some() as u64)
    }

    /// The forward formula: `act(v + r)`, `v` the GEMM's result with its bias already added.
    #[inline]
    pub fn forward(&self, v: f32, r: Option<f32>) -> f32 {
        let s = match r {
            Some(r) => v + r,
            None => v,
        };
        match self.act {
            Some(k) => k.forward(s),
            None => s,
        }
    }

    /// The data-gradient formula: `act'(saved) * (v + g)`.
    #[inline]
    pub fn backward(&self, v: f32, g: Option<f32>, saved: Option<f32>) -> f32 {
        let s = match g {
            Some(g) => v + g,
            None => v,
        };
        match (self.act, saved) {
            (Some(k), Some(sv)) => k.backward(sv, s),
            _ => s,
        }
    }

    /// A short description for kernel comments and reports: `+ r, relu`.
    pub fn describe(&self, side: EpilogueSide) -> String {
        let mut parts = vec![];
        if self.add {
            parts.push(match side {
                EpilogueSide::Forward => "+ r".to_string(),
                EpilogueSide::DataGradient => "+ g".to_string(),
            });
        }
        if let Some(k) = self.act {
            parts.push(match side {
                EpilogueSide::Forward => k.name().to_string(),
                EpilogueSide::DataGradient => format!("{}'", k.name()),
            });
        }
        parts.join(", ")
    }
}
