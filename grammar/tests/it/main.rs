//! The integration tests of dmc-grammar, one test binary: each module was a test file of its own,
//! and one binary links the dependencies once instead of once per file.

mod diagnostics;
mod errors;
mod fuzz;
mod language;
mod layers;
mod loss_terms;
mod reliability;
