//! `dmc run`, `dmc eval`, `dmc predict`: compile a program, bind data and weights, drive the
//! backend. One job per module: the flags (`args`), what happens before the first step (`setup`),
//! the data (`dataset`), the training loop (`steps`) and its progress bar and loss log
//! (`progress`), the saving flags and `--resume` (`resume`), what happens after it (`outcome`), metrics over a data set (`metrics`), and one
//! module per command (`run`, `eval`, `predict`, `sample`).

pub mod args;
pub mod data_parallel;
pub mod dataset;
pub mod eval;
mod metrics;
mod outcome;
pub mod predict;
mod progress;
mod resume;
pub mod run;
pub mod sample;
mod setup;
mod steps;
