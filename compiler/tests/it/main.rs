//! The integration tests of dmc-compiler, one test binary: each module was a test file of its own,
//! and one binary links the dependencies once instead of once per file.

mod autodiff;
mod check;
mod fixtures;
mod infer;
mod json;
mod lower;
mod memory;
mod optimizer;
mod placement;
mod prop;
mod remat;
mod report;
mod scaling;
mod schedule;
mod seed;
mod verify;
