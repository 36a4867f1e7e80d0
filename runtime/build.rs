//! Probes for g++ and NVRTC, so that the tests needing them are ignored (not passed) without them;
//! see `build/probe.rs`.

#[path = "src/cuda/nvrtc_search.rs"]
mod nvrtc_search;
#[path = "build/probe.rs"]
mod probe;

fn main() {
    probe::emit();
}
