//! Helpers shared by the CLI-level test files.
#![allow(dead_code)] // each test file uses a subset

use std::process::Command;

/// Runs the `dmc` binary in the repository root: (exit code, stdout, stderr).
pub fn dmc(args: &[&str]) -> (i32, String, String) {
    dmc_env(args, &[])
}

/// [`dmc`] with extra environment variables.
pub fn dmc_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dmc"))
        .args(args)
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
