//! Errors of the compiler crate.

use thiserror::Error;

use crate::check::PlanCheckError;
use crate::plan::BufferKind;
use crate::verify::VerifyError;

/// A shape-inference failure (the caller adds the node and op).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct ShapeError(pub String);

#[derive(Debug, Clone, PartialEq, Error)]
pub enum CompileError {
    /// The checked model is not what the compiler expects (dangling reference, missing param...).
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// Shape inference rejected a node while building the graph.
    #[error("node `{node}` ({op}): {source} [inputs: {inputs}]")]
    Shape {
        node: String,
        op: &'static str,
        inputs: String,
        source: ShapeError,
    },
    /// The IR verifier rejected the graph; names the pass that produced it.
    #[error(transparent)]
    Verify(Box<VerifyError>),
    /// The scheduler could not order the kernels (cycle through an in-place hazard).
    #[error("schedule: {0}")]
    Schedule(String),
    /// The plan needs more memory than the cap allows.
    #[error(
        "the plan needs {needed} bytes but the cap is {cap} bytes ({})",
        fmt_breakdown(breakdown)
    )]
    CapExceeded {
        needed: u64,
        cap: u64,
        breakdown: Vec<(BufferKind, u64)>,
    },
    /// The emitted plan failed the independent plan checker.
    #[error("emitted plan is invalid: {0}")]
    PlanCheck(Box<PlanCheckError>),
    /// A compiler invariant was broken (a bug, not a user error).
    #[error("internal compiler error: {0}")]
    Internal(String),
}

fn fmt_breakdown(b: &[(BufferKind, u64)]) -> String {
    b.iter()
        .map(|(k, n)| format!("{k:?}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl From<VerifyError> for CompileError {
    fn from(e: VerifyError) -> Self {
        CompileError::Verify(Box::new(e))
    }
}

impl From<PlanCheckError> for CompileError {
    fn from(e: PlanCheckError) -> Self {
        CompileError::PlanCheck(Box::new(e))
    }
}
