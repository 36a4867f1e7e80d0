//! The type of an IR value: full shape (batch first) and element type. Defined in dmc-plan with
//! the ops' shape rule, which the runtime's plan check shares.

pub use crate::op::{fmt_types, TensorType};
