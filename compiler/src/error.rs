//! Errors of the compiler crate.

use thiserror::Error;

use crate::check::PlanCheckError;
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
    /// The batch makes the step's values too large to plan (or to count in 64 bits).
    #[error(
        "batch {batch}: the step's forward values alone would need {bytes} bytes, more than dmc plans ({limit} bytes); use a smaller --batch"
    )]
    TooLarge {
        batch: usize,
        /// Saturating: at most `u128::MAX`.
        bytes: u128,
        limit: u64,
    },
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
    /// Even the smallest achievable arena (smallest fused-gradient chunks and, with `--remat auto`,
    /// the smallest-memory recomputation strategy) exceeds the cap; `needed` is that arena.
    /// `needed` = `params + opt_state + working_set`, exact bytes (aligned buffers).
    #[error(
        "parameters {} + optimizer state {} + smallest working set {} = {} > cap {}; \
         the smallest cap that works is {} ({} bytes): pass --vram-cap {}MiB or more",
        fmt_bytes(*params),
        fmt_bytes(*opt_state),
        fmt_bytes(*working_set),
        fmt_bytes(*needed),
        fmt_bytes(*cap),
        fmt_bytes(*needed),
        fmt_thousands(*needed),
        needed.div_ceil(1 << 20)
    )]
    CapExceeded {
        /// The smallest arena the compiler can plan, in bytes.
        needed: u64,
        cap: u64,
        /// Parameter bytes (aligned, persistent).
        params: u64,
        /// Optimizer-state bytes (aligned, persistent).
        opt_state: u64,
        /// The rest: the smallest peak of transient buffers the plan reaches.
        working_set: u64,
    },
    /// The emitted plan failed the independent plan checker.
    #[error("emitted plan is invalid: {0}")]
    PlanCheck(Box<PlanCheckError>),
    /// A compiler invariant was broken (a bug, not a user error).
    #[error("internal compiler error: {0}")]
    Internal(String),
}

/// `1234` -> `1.2 KiB`; one decimal (dropped when zero), binary units.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        return format!("{b} B");
    }
    let s = format!("{v:.1}");
    let s = s.strip_suffix(".0").unwrap_or(&s).to_string();
    format!("{s} {}", UNITS[u])
}

/// `827359744` -> `827,359,744`.
pub fn fmt_thousands(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::new();
    for (i, c) in d.chars().enumerate() {
        if i > 0 && matches!((d.len() - i) % 3, 0) {
            out.push(',');
        }
        out.push(c);
    }
    out
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
