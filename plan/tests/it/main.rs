//! The integration tests of dmc-plan, one test binary: each module was a test file of its own,
//! and one binary links the dependencies once instead of once per file.

mod cpu_special;
mod epilogue;
mod facts;
mod lr_schedule;
mod shard;
mod unary_exp;
