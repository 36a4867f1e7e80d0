//! The integration tests of dmc-runtime, one test binary: each module was a test file of its own,
//! and one binary links the dependencies once instead of once per file.

mod common;
mod npyfile;

mod comm;
mod determinism;
mod executor;
mod init;
mod io_data;
mod io_data_files;
mod io_interop;
mod io_predict;
mod io_weights;
mod kernels;
mod kernels_attention;
mod kernels_geom;
mod kernels_join;
mod kernels_layernorm;
mod kernels_layers;
mod kernels_norm;
mod kernels_transpose;
mod optim_formulas;
mod zoo_cpu;
