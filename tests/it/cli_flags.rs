//! The flags that shape a plan are one group, taken by every command that compiles a plan: here
//! `emu-check` and `gpu-selftest` honour `--no-fuse` and `--remat` (the plan they build changes, so
//! a cap that one plan fits refuses the other), `--lr` reaches plan.json and is refused where the
//! step has no optimizer update, and `dmc plan` refuses the flags its `--sweep` and `--max-batch`
//! cannot honour instead of ignoring them.

use crate::common;
use common::{dmc, dmc_env};

/// How a cap a plan cannot meet is refused.
const REFUSED: &str = "the smallest cap that works";

/// A scratch directory holding copies of the named examples (for `gpu-selftest --examples`).
fn examples_dir(names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in names {
        let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name);
        std::fs::copy(from, dir.path().join(name)).expect("copy the example");
    }
    dir
}

fn path(dir: &tempfile::TempDir) -> String {
    dir.path().display().to_string()
}

#[test]
fn emu_check_builds_its_plan_with_remat_and_no_fuse() {
    // resnet_small fits 1.25 MB only by recomputing activations: `--remat off` refuses that cap
    let (rc, _, err) = dmc(&[
        "emu-check",
        "examples/resnet_small.dm",
        "--vram-cap",
        "1.25MB",
        "--remat",
        "off",
        "--no-stream",
    ]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains(REFUSED), "{err}");
    // mlp fits 2.5 MiB with the fused updates, not with whole weight gradients (`--no-fuse`)
    let (rc, _, err) = dmc(&[
        "emu-check",
        "examples/mlp.dm",
        "--vram-cap",
        "2.5MiB",
        "--remat",
        "off",
        "--no-fuse",
        "--no-stream",
    ]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains(REFUSED), "{err}");
    // the plans that fit go on to the emulator, here to its missing compiler
    let cache = tempfile::tempdir().expect("tempdir");
    let env = [
        ("DMC_CXX", "/nonexistent/g++"),
        ("DMC_CACHE_DIR", &*path(&cache)),
    ];
    for args in [
        &[
            "examples/resnet_small.dm",
            "--vram-cap",
            "1.25MB",
            "--remat",
            "auto",
        ][..],
        &["examples/mlp.dm", "--vram-cap", "2.5MiB", "--remat", "off"][..],
    ] {
        let (rc, _, err) = dmc_env(&[&["emu-check"][..], args].concat(), &env);
        assert_eq!(rc, 1, "{args:?}: {err}");
        assert!(
            err.contains("/nonexistent/g++") && !err.contains(REFUSED),
            "{args:?}: {err}"
        );
    }
}

/// The `.cu` files `dmc compile` writes for mlp at batch 5 with `extra` flags.
fn cuda_kernels_of_mlp(extra: &[&str]) -> usize {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = path(&dir);
    let args = [
        &["compile", "examples/mlp.dm", "--batch", "5", "-o", &out][..],
        extra,
    ]
    .concat();
    let (rc, _, err) = dmc(&args);
    assert_eq!(rc, 0, "{err}");
    std::fs::read_dir(dir.path())
        .expect("output directory")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "cu"))
        .count()
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn emu_check_no_fuse_checks_the_unfused_kernels() {
    let (rc, out, err) = dmc(&["emu-check", "examples/mlp.dm", "--batch", "5", "--no-fuse"]);
    assert_eq!(rc, 0, "{out}{err}");
    let (fused, unfused) = (
        cuda_kernels_of_mlp(&[]),
        cuda_kernels_of_mlp(&["--no-fuse"]),
    );
    assert!(unfused > fused, "{unfused} <= {fused}");
    let ok_lines = out
        .lines()
        .filter(|l| l.contains(" ok (max rel err"))
        .count();
    assert_eq!(ok_lines, unfused, "{out}");
    // the optimizer updates are kernels of their own, not fused into the weight gradients
    assert!(out.lines().any(|l| l.starts_with("sgd_update_")), "{out}");
    assert!(
        !out.lines()
            .any(|l| l.starts_with("dense_bwd_weight_update")),
        "{out}"
    );
}

#[test]
fn gpu_selftest_builds_its_plans_with_remat_and_no_fuse_before_any_gpu_work() {
    // deep_convnet fits 300 MB only by recomputing activations
    let deep = examples_dir(&["deep_convnet.dm"]);
    let (rc, _, err) = dmc(&[
        "gpu-selftest",
        "--dry-run",
        "--examples",
        &path(&deep),
        "--vram-cap",
        "300MB",
        "--no-offload",
        "--remat",
        "off",
    ]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains(REFUSED), "{err}");
    // seed fits 840 MB with the fused updates, not with whole weight gradients
    let seed = examples_dir(&["seed.dm"]);
    let (rc, _, err) = dmc(&[
        "gpu-selftest",
        "--dry-run",
        "--examples",
        &path(&seed),
        "--vram-cap",
        "840MB",
        "--no-fuse",
        "--no-stream",
    ]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains(REFUSED), "{err}");
}

#[test]
fn gpu_selftest_with_plan_flags_and_no_gpu_is_the_device_error() {
    if dmc_runtime::cuda::probe().is_ok() {
        return; // a GPU is here: the self-test would run
    }
    // the flags are taken and the plans fit: the self-test gets as far as opening the device
    let deep = examples_dir(&["deep_convnet.dm"]);
    let (rc, _, err) = dmc(&[
        "gpu-selftest",
        "--examples",
        &path(&deep),
        "--vram-cap",
        "300MB",
        "--remat",
        "auto",
        "--no-fuse",
        "--batch",
        "2",
    ]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("CUDA"), "{err}");
    assert!(!err.contains(REFUSED) && !err.contains("panicked"), "{err}");
}

#[test]
#[cfg_attr(
    not(dmc_has_nvrtc),
    ignore = "needs NVRTC (set DMC_NVRTC to libnvrtc.so.12, e.g. from `pip install nvidia-cuda-nvrtc-cu12`)"
)]
fn gpu_selftest_dry_run_plans_seed_without_fusion_under_no_fuse() {
    let seed = examples_dir(&["seed.dm"]);
    let seed = path(&seed);
    let planned = |extra: &[&str]| -> String {
        let args = [
            &["gpu-selftest", "--dry-run", "--examples", &seed][..],
            extra,
        ]
        .concat();
        let (rc, out, err) = dmc(&args);
        assert_eq!(rc, 0, "{out}{err}");
        let row = out
            .lines()
            .find(|l| l.starts_with("seed") && l.contains("planned arena"))
            .unwrap_or_else(|| panic!("no training row in:\n{out}"));
        row.split("planned arena ").nth(1).unwrap_or("").to_string()
    };
    // whole weight gradients: the unfused arena is larger (826.0 MiB against 792.2 MiB)
    let (fused, unfused) = (planned(&[]), planned(&["--no-fuse"]));
    assert_ne!(fused, unfused);
    assert!(unfused.starts_with("826.0 MiB"), "{unfused}");
}

#[test]
fn lr_reaches_the_plan_and_is_refused_without_an_update() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = path(&dir);
    let (rc, _, err) = dmc(&["compile", "examples/mlp.dm", "-o", &out, "--lr", "0.25"]);
    assert_eq!(rc, 0, "{err}");
    let text = std::fs::read_to_string(dir.path().join("plan.json")).expect("plan.json");
    assert!(text.contains("\"lr\": 0.25"), "no lr 0.25 in the plan");
    assert!(
        !text.contains("\"lr\": 0.01"),
        "the program's lr is overridden"
    );
    for args in [
        &["compile", "examples/mlp.dm", "-o", &out, "--mode", "eval"][..],
        &["emu-check", "examples/mlp.dm", "--mode", "predict"][..],
        // (`eval` and `predict` do not take --lr at all: tests/it/train.rs)
    ] {
        let (rc, _, err) = dmc(&[args, &["--lr", "0.25"][..]].concat());
        assert_eq!(rc, 1, "{args:?}: {err}");
        assert!(
            err.contains("--lr 0.25") && err.contains("drop --lr"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn plan_refuses_flags_that_sweep_and_max_batch_would_ignore() {
    for args in [
        &["--sweep", "--vram-cap", "1MB"][..],
        &["--sweep", "--remat", "off"][..],
        &["--vram-cap", "1GiB", "--max-batch", "--batch", "4"][..],
        &["--vram-cap", "1GiB", "--max-batch", "--json"][..],
    ] {
        let (rc, _, err) = dmc(&[&["plan", "examples/mlp.dm"][..], args].concat());
        assert_eq!(rc, 2, "{args:?}: {err}");
        assert!(err.contains("cannot be used with"), "{args:?}: {err}");
    }
}
