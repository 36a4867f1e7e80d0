//! Where NVRTC is looked for (see [`super::nvrtc`] for the order). Plain `std`, no crate
//! dependencies: the build scripts (`build.rs`, `runtime/build.rs`) include this file to probe for
//! NVRTC exactly where the runtime looks, and mark the tests that need it as ignored without it.

use std::path::PathBuf;

/// The library's names, newest first.
pub const NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// The environment variables [`candidates`] reads.
pub const ENV_VARS: &[&str] = &[
    "DMC_NVRTC",
    "CUDA_PATH",
    "CUDA_HOME",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "HOME",
];

/// The places searched for NVRTC, in order (existing files only; the bare names come last).
pub fn candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut out: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("DMC_NVRTC") {
        let p = PathBuf::from(p);
        if p.is_dir() {
            dirs.push(p);
        } else {
            out.push(p);
        }
    }
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(p) = std::env::var_os(var) {
            dirs.push(PathBuf::from(p).join("lib64"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    for sub in ["nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib"] {
        dirs.extend(python_dirs(sub));
    }
    for d in dirs {
        for n in NAMES {
            let f = d.join(n);
            if f.is_file() {
                out.push(f);
            }
        }
    }
    out.extend(NAMES.iter().map(PathBuf::from));
    out
}

/// `sub` (e.g. `nvidia/nccl/lib`) under the `site-packages` and `dist-packages` of every Python
/// found under `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `~/.local`, pyenv's versions and the system's
/// prefixes, in that order (the directories whether or not they exist).
pub fn python_dirs(sub: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var) {
            roots.push(PathBuf::from(p).join("lib"));
        }
    }
    if let Some(h) = std::env::var_os("HOME") {
        let h = PathBuf::from(h);
        roots.push(h.join(".local/lib"));
        if let Ok(rd) = std::fs::read_dir(h.join(".pyenv/versions")) {
            roots.extend(rd.flatten().map(|e| e.path().join("lib")));
        }
    }
    roots.extend(
        ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"]
            .iter()
            .map(PathBuf::from),
    );
    for r in roots {
        let Ok(rd) = std::fs::read_dir(&r) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pys.sort();
        for py in pys {
            for sp in ["site-packages", "dist-packages"] {
                dirs.push(py.join(sp).join(sub));
            }
        }
    }
    dirs
}
