//! Errors of the compiler crate: [`CompileError`] and what it wraps (shape inference's
//! [`ShapeError`], the IR verifier's [`VerifyError`], the plan checker's [`PlanCheckError`]).
//! It depends on no pass, so every module can return them.

use std::fmt;

use thiserror::Error;

use crate::plan::{BufferId, BufferKind};
use crate::tensor::{fmt_types, TensorType};

/// A shape-inference failure (the caller adds the node and op): the op's shape rule lives in
/// dmc-plan, shared with the runtime's plan check.
pub use crate::op::ShapeError;

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
    /// the smallest-memory recomputation strategy; streaming every parameter and optimizer state
    /// tensor when they do not fit resident) exceeds the cap; `needed` is that arena.
    /// Resident (`host` 0): `needed` = `params + opt_state + working_set`, exact bytes (aligned
    /// buffers); streamed: `params` and `opt_state` are what stays in the arena (0), `host` the
    /// host store, `working_set` the rest (the windows in flight among it).
    #[error("{}", cap_message(*needed, *cap, *params, *opt_state, *working_set, *host))]
    CapExceeded {
        /// The smallest arena the compiler can plan, in bytes.
        needed: u64,
        cap: u64,
        /// Parameter bytes (aligned, persistent, in the arena).
        params: u64,
        /// Optimizer-state bytes (aligned, persistent, in the arena).
        opt_state: u64,
        /// The rest: the smallest peak of transient buffers the plan reaches.
        working_set: u64,
        /// Bytes of the host store in that smallest plan (0: everything resident).
        host: u64,
    },
    /// The emitted plan failed the independent plan checker.
    #[error("emitted plan is invalid: {0}")]
    PlanCheck(Box<PlanCheckError>),
    /// A compiler invariant was broken (a bug, not a user error).
    #[error("internal compiler error: {0}")]
    Internal(String),
}

/// What the verifier found wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct VerifyError {
    /// The pass after which the graph was checked (`lower` for the initial graph).
    pub pass: String,
    /// Node index and name, when the problem is at a node.
    pub node: Option<(usize, String)>,
    /// The op's kind name (`conv2d`, ...), or empty.
    pub op: String,
    pub inputs: Vec<TensorType>,
    pub outputs: Vec<TensorType>,
    pub msg: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IR verification failed after pass `{}`", self.pass)?;
        if let Some((i, name)) = &self.node {
            write!(f, " at node #{i} `{name}` ({})", self.op)?;
        }
        write!(f, ": {}", self.msg)?;
        if self.node.is_some() {
            write!(
                f,
                " [inputs: {}; outputs: {}]",
                fmt_types(&self.inputs),
                fmt_types(&self.outputs)
            )?;
        }
        Ok(())
    }
}

/// Why the independent plan checker ([`crate::check::check_plan`]) rejected a plan.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanCheckError {
    #[error("format version {got}, expected {expected}")]
    FormatVersion { got: u32, expected: u32 },
    #[error("buffer #{index} has id {id}")]
    BufferId { index: usize, id: usize },
    #[error("buffer #{buffer} `{name}`: offset {offset} is not aligned to {align}")]
    Misaligned {
        buffer: BufferId,
        name: String,
        offset: u64,
        align: u64,
    },
    #[error("buffer #{buffer} `{name}`: bytes {offset}..{end} outside the arena of {arena} bytes")]
    OutOfArena {
        buffer: BufferId,
        name: String,
        offset: u64,
        end: u64,
        arena: u64,
    },
    #[error("buffer #{buffer} `{name}`: empty live range {live:?}")]
    BadLiveRange {
        buffer: BufferId,
        name: String,
        live: (usize, usize),
    },
    #[error("buffers #{a} `{a_name}` and #{b} `{b_name}` overlap in bytes while both live")]
    Overlap {
        a: BufferId,
        a_name: String,
        b: BufferId,
        b_name: String,
    },
    #[error("kernel #{kernel} `{name}`: {msg}")]
    Kernel {
        kernel: usize,
        name: String,
        msg: String,
    },
    #[error("step {step} `{label}`: kernel #{kernel} does not exist")]
    UnknownKernel {
        step: usize,
        label: String,
        kernel: usize,
    },
    #[error("step {step} `{label}`: {got} args, the kernel signature has {expected}")]
    ArgCount {
        step: usize,
        label: String,
        expected: usize,
        got: usize,
    },
    #[error("step {step} `{label}`: arg {arg} is buffer #{buffer}, which does not exist")]
    UnknownBuffer {
        step: usize,
        label: String,
        arg: usize,
        buffer: BufferId,
    },
    #[error("step {step} `{label}`: arg {arg} (`{param}`) is buffer #{buffer} of the wrong {what}: {msg}")]
    ArgMismatch {
        step: usize,
        label: String,
        arg: usize,
        param: String,
        buffer: BufferId,
        what: &'static str,
        msg: String,
    },
    #[error(
        "step {step} `{label}`: buffer #{buffer} `{name}` used outside its live range {live:?}"
    )]
    OutsideLive {
        step: usize,
        label: String,
        buffer: BufferId,
        name: String,
        live: (usize, usize),
    },
    #[error("step {step} `{label}`: buffer #{buffer} `{name}` is passed twice while written")]
    ArgAlias {
        step: usize,
        label: String,
        buffer: BufferId,
        name: String,
    },
    #[error("step {step} `{label}`: buffer #{buffer} `{name}` is in the host store, which only copy steps may touch")]
    HostArg {
        step: usize,
        label: String,
        buffer: BufferId,
        name: String,
    },
    /// Streaming's order of copies and uses: a window read before its copy lands, written back
    /// to another home, released (its bytes reused) before its write-back lands, or written and
    /// never written back.
    #[error("step {step} `{label}`: {msg}")]
    Stream {
        step: usize,
        label: String,
        msg: String,
    },
    #[error("step {step} `{label}`: reads buffer #{buffer} `{name}` before any step writes it")]
    ReadBeforeWrite {
        step: usize,
        label: String,
        buffer: BufferId,
        name: String,
    },
    #[error("step {step} `{label}`: reads buffer #{buffer} `{name}` after step {written_at} overwrote it in place")]
    ReadAfterInPlace {
        step: usize,
        label: String,
        buffer: BufferId,
        name: String,
        written_at: usize,
    },
    #[error(
        "step {step} `{label}`: writes the {kind:?} buffer #{buffer} `{name}` as a fresh output"
    )]
    WritesReadOnly {
        step: usize,
        label: String,
        buffer: BufferId,
        name: String,
        kind: BufferKind,
    },
    #[error("binding `{name}`: {msg}")]
    Binding { name: String, msg: String },
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

/// The message of [`CompileError::CapExceeded`].
fn cap_message(
    needed: u64,
    cap: u64,
    params: u64,
    opt_state: u64,
    working_set: u64,
    host: u64,
) -> String {
    use crate::report::{human, thousands};
    let what = if host == 0 {
        format!(
            "parameters {} + optimizer state {} + smallest working set {} = {} > cap {}",
            human(params),
            human(opt_state),
            human(working_set),
            human(needed),
            human(cap)
        )
    } else {
        format!(
            "even with everything that may stream streamed from the host store (parameters, optimizer state, and activations unless --no-offload: {}), the smallest working set (windows in flight included) is {} > cap {}",
            human(host),
            human(needed),
            human(cap)
        )
    };
    format!(
        "{what}; the smallest cap that works is {} ({} bytes): pass --vram-cap {}MiB or more",
        human(needed),
        thousands(needed),
        needed.div_ceil(1 << 20)
    )
}
