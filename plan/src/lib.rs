//! dmc's execution plan: the closed set of operations ([`op::Op`]) with their facts (signature,
//! aliasing, workspaces, names), the activations ([`unary::UnaryKind`]) and optimizer rules
//! ([`update::UpdateRule`]) they carry, and the plan itself ([`plan::Plan`]), plain serde data.
//!
//! This is the only contract between the compiler, which writes plans, and the runtimes (CPU, CUDA,
//! the CUDA emulator) and the CUDA code generator, which read them. It depends on no other dmc
//! crate; the language re-exports its activations and optimizers under their `.dm` names.

pub mod cpu;
pub mod link;
pub mod op;
pub mod plan;
pub mod schedule;
pub mod shard;
pub mod unary;
pub mod update;
