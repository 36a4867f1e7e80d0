//! Helpers shared by the CLI-level test files.
#![allow(dead_code)] // each test file uses a subset

use std::process::Command;

/// Runs the `dmc` binary in the repository root: (exit code, stdout, stderr).
pub fn dmc(args: &[&str]) -> (i32, String, String) {
    dmc_env(args, &[])
}

/// [`dmc`] with extra environment variables.
pub fn dmc_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    // the CPU time model at fixed rates unless a test says otherwise: plans and reports that do
    // not depend on the machine the tests run on
    let out = Command::new(env!("CARGO_BIN_EXE_dmc"))
        .args(args)
        .env("DMC_CPU_RATES", "nominal")
        .envs(env.iter().copied())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run dmc");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
