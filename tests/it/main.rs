//! The integration tests of the dmc CLI and the whole pipeline, one test binary: each module was a test file of its own,
//! and one binary links the dependencies once instead of once per file.

mod common;

mod batchnorm;
mod calibration;
mod cli;
mod cli_flags;
mod clip_accumulate;
mod clip_norm_pass;
mod codegen;
mod cpu_time;
mod cuda;
mod cuda_emu;
mod cuda_emu_gemm;
mod data;
mod data_parallel;
mod data_parallel_emu;
mod data_parallel_mpi;
mod data_parallel_zero3;
mod front_end;
mod fusion;
mod fuzz;

mod gradients;
mod interop;
mod interop_norm;
mod interop_seq;
mod lr_schedule;
mod memory;
mod multi_loss;
mod offload;
mod perf;
mod profile;
mod reliability;
mod reshape;
mod resume;
mod runtime_memory;
mod runtime_nvrtc;
mod runtime_remat;
mod runtime_seed;
mod sequence;
mod streaming;
mod top_k;
mod tour;
mod train;
mod train_losses_optim;
