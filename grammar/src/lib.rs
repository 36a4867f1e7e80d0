//! The dmc model language: AST, parser, shape checker and diagnostics.
pub mod model;
