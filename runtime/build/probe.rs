//! The build scripts' probe for the external tools some tests need, included by `build.rs` (the
//! `dmc` package) and `runtime/build.rs`. It sets two cfgs for the package's tests:
//!
//! - `dmc_has_gxx`: the C++ compiler the CUDA emulator uses (`$DMC_CXX`, else `g++`) runs;
//! - `dmc_has_nvrtc`: NVRTC loads from where the runtime looks for it ([`super::nvrtc_search`]);
//! - `dmc_has_mpi`: `mpirun` runs (the data-parallel tests launch ranks with it).
//!
//! A test that needs a tool carries `#[cfg_attr(not(dmc_has_gxx), ignore = "...")]`, so without the
//! tool it shows as *ignored* (with the reason), never as passed. Under `CI` (set, and not `0` or
//! `false`) every cfg is set whatever is installed: there the tests run, and a missing tool fails
//! them. The probe reruns when `DMC_CXX`, `CI`, `PATH` or a variable NVRTC is looked up by changes.

use std::process::Command;

pub fn emit() {
    println!("cargo::rustc-check-cfg=cfg(dmc_has_gxx)");
    println!("cargo::rustc-check-cfg=cfg(dmc_has_nvrtc)");
    println!("cargo::rustc-check-cfg=cfg(dmc_has_mpi)");
    for var in ["DMC_CXX", "CI", "PATH"]
        .iter()
        .chain(super::nvrtc_search::ENV_VARS)
    {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let ci = in_ci();
    if ci || has_gxx() {
        println!("cargo::rustc-cfg=dmc_has_gxx");
    }
    if ci || has_nvrtc() {
        println!("cargo::rustc-cfg=dmc_has_nvrtc");
    }
    if ci || has_mpirun() {
        println!("cargo::rustc-cfg=dmc_has_mpi");
    }
}

/// MPI's launcher runs (`mpirun --version`).
fn has_mpirun() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `CI` is set to something other than empty, `0` or `false`.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

/// The compiler `runtime/src/emu` runs: `$DMC_CXX`, else `g++`, and `--version` succeeds.
fn has_gxx() -> bool {
    let cxx = std::env::var("DMC_CXX").unwrap_or_else(|_| "g++".into());
    Command::new(cxx)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Like the runtime's loader: the first candidate that loads decides, and it must be NVRTC.
fn has_nvrtc() -> bool {
    for c in super::nvrtc_search::candidates() {
        // SAFETY: loading NVRTC runs its initialisers, which have no preconditions; nothing from
        // the library is called.
        if let Ok(lib) = unsafe { libloading::Library::new(&c) } {
            // SAFETY: only looked up, not called.
            return unsafe { lib.get::<unsafe extern "C" fn()>(b"nvrtcVersion") }.is_ok();
        }
    }
    false
}
