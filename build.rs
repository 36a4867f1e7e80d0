//! Probes for g++ and NVRTC, so that the tests needing them are ignored (not passed) without them;
//! see `runtime/build/probe.rs`.

#[path = "runtime/src/cuda/nvrtc_search.rs"]
mod nvrtc_search;
#[path = "runtime/build/probe.rs"]
mod probe;

fn main() {
    probe::emit();
}
