//! dmc compiler: lowers a checked model to the IR, differentiates it, runs the pass pipeline and
//! emits the execution plan.
pub mod op;
pub mod placement;
pub mod plan;
