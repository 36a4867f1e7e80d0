//! The CUDA path without a GPU: `dmc compile` writes one `.cu` per kernel, `--arch` prints the
//! NVRTC resource table, and `dmc gpu-selftest --dry-run` (render + NVRTC + plans, no launch) runs
//! end to end. Those that need NVRTC are ignored without it (the build script probes for it, see
//! `runtime/build/probe.rs`), unless `CI` is set, where a missing NVRTC fails them.

use crate::common;
use common::dmc;

/// NVRTC, which the tests marked `dmc_has_nvrtc` need: the build found it, or `CI` is set.
fn need_nvrtc() {
    if let Err(e) = dmc_runtime::cuda::nvrtc::nvrtc() {
        panic!("NVRTC is needed here (CI is set, or the build found it): {e}");
    }
}

#[test]
fn compile_writes_one_cu_file_per_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (code, _, err) = dmc(&["compile", "examples/mlp.dm", "-o", out]);
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("plan.json")).unwrap()).unwrap();
    for k in plan["kernels"].as_array().unwrap() {
        let name = k["name"].as_str().unwrap();
        let src = std::fs::read_to_string(dir.path().join(format!("{name}.cu"))).unwrap();
        assert!(src.contains("extern \"C\" __global__"), "{name}");
    }
}

#[test]
#[cfg_attr(
    not(dmc_has_nvrtc),
    ignore = "needs NVRTC (set DMC_NVRTC to libnvrtc.so.12, e.g. from `pip install nvidia-cuda-nvrtc-cu12`)"
)]
fn compile_arch_prints_the_resource_table() {
    need_nvrtc();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (code, stdout, err) = dmc(&[
        "compile",
        "examples/resnet_small.dm",
        "-o",
        out,
        "--arch",
        "sm_90",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("regs") && stdout.contains("spills"),
        "{stdout}"
    );
    assert!(stdout.contains("conv2d_bwd_data"), "{stdout}");
    // the launch geometry: resnet_small's stem conv2d_0 (N*H*W = 8*16*16 = 2048 output rows, 16
    // output channels) as the renderer launches it: its tile's blocks, 256 threads each
    let row = stdout
        .lines()
        .find(|l| l.starts_with("conv2d_0 "))
        .unwrap_or_else(|| panic!("no conv2d_0 row in:\n{stdout}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    let src = std::fs::read_to_string("examples/resnet_small.dm").expect("example");
    let model = dmc_grammar::compile_source(&src, "resnet_small.dm").expect("model");
    let plan = dmc_compiler::compile(&model, &Default::default()).expect("plan");
    let k = dmc_codegen::render_plan(&plan, &dmc_codegen::CodegenOptions::default())
        .expect("render")
        .into_iter()
        .find(|k| k.name == "conv2d_0")
        .expect("conv2d_0");
    let g = k.gemm.expect("a GEMM");
    assert_eq!((g.gm, g.gn), (2048, 16));
    let blocks: u32 = k.grid.iter().product();
    assert!(u64::from(blocks) * u64::from(g.tile.bm * g.tile.bn) >= 2048 * 16);
    assert_eq!(
        cols[cols.len() - 2..],
        [blocks.to_string(), "256".to_string()],
        "{row}"
    );
    let (code, _, err) = dmc(&["compile", "examples/mlp.dm", "-o", out, "--arch", "banana"]);
    assert_ne!(code, 0, "{err}");
}

#[test]
#[cfg_attr(
    not(dmc_has_nvrtc),
    ignore = "needs NVRTC (set DMC_NVRTC to libnvrtc.so.12, e.g. from `pip install nvidia-cuda-nvrtc-cu12`)"
)]
fn gpu_selftest_dry_run_runs_end_to_end() {
    need_nvrtc();
    let (code, stdout, err) = dmc(&["gpu-selftest", "--dry-run"]);
    assert_eq!(code, 0, "{stdout}\n{err}");
    for ex in ["mlp", "seed", "deep_convnet", "resnet_small"] {
        assert!(stdout.contains(ex), "{stdout}");
    }
    assert!(stdout.contains("dry run: not launched"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    // the skinny kernels forced onto the zoo's GEMMs compile too (on a GPU: checked against the CPU)
    let skinny = stdout
        .lines()
        .find(|l| l.contains("Skinny kernels"))
        .unwrap_or_else(|| panic!("no skinny row: {stdout}"));
    assert!(
        skinny.contains(" ok ") && skinny.contains("0 B spills, 0 warnings"),
        "{skinny}"
    );
}

#[test]
fn cuda_device_without_a_gpu_is_a_clear_error() {
    if dmc_runtime::cuda::probe().is_ok() {
        return; // a GPU is here
    }
    let (code, _, err) = dmc(&["run", "examples/mlp.dm", "--steps", "1", "--device", "cuda"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--device cpu") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn split_k_can_be_switched_off_for_a_baseline() {
    // deep_convnet's weight gradients are split-K kernels (a `_reduce` entry); --no-split-k
    // renders them unsplit (the baseline gpu-check.sh times against)
    let reduces = |flags: &[&str]| {
        let d = tempfile::tempdir().expect("tempdir");
        let out = d.path().to_str().expect("utf-8").to_string();
        let mut args = vec!["compile", "examples/deep_convnet.dm", "-o", &out];
        args.extend_from_slice(flags);
        let (code, _, err) = common::dmc(&args);
        assert_eq!(code, 0, "{err}");
        std::fs::read_dir(d.path())
            .expect("dir")
            .flatten()
            .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|s| s.contains("_reduce(")))
            .count()
    };
    assert!(reduces(&[]) >= 2);
    assert_eq!(reduces(&["--no-split-k"]), 0);
    assert_eq!(reduces(&["--baseline-gemm"]), 0);
}

#[test]
fn baseline_gemm_renders_the_one_tile_unpipelined_kernel() {
    // --baseline-gemm: every GEMM with the 64 x 64 tile, k-step 16, no staged loads; the default:
    // the tiles the model chose, pipelined
    let defines = |flags: &[&str]| {
        let d = tempfile::tempdir().expect("tempdir");
        let out = d.path().to_str().expect("utf-8").to_string();
        let mut args = vec!["compile", "examples/seed.dm", "-o", &out];
        args.extend_from_slice(flags);
        let (code, _, err) = common::dmc(&args);
        assert_eq!(code, 0, "{err}");
        let mut v = vec![];
        for e in std::fs::read_dir(d.path()).expect("dir").flatten() {
            let src = std::fs::read_to_string(e.path()).unwrap_or_default();
            if src.contains("#define BM ") {
                let def = |n: &str| {
                    src.lines()
                        .find_map(|l| l.strip_prefix(&format!("#define {n} ")))
                        .unwrap_or("?")
                        .to_string()
                };
                // staged: through registers, or with cp.async copies into shared memory
                let staged = src.contains("dmc_stage(") || src.contains("dmc_cp_wait<");
                let skinny = src.contains("// Skinny GEMM");
                v.push((def("BM"), def("BN"), def("BK"), staged, skinny));
            }
        }
        v
    };
    let base = defines(&["--baseline-gemm"]);
    assert!(base.len() >= 10, "{base:?}");
    assert!(base.iter().all(|(m, n, k, staged, skinny)| (
        m.as_str(),
        n.as_str(),
        k.as_str(),
        *staged,
        *skinny
    ) == ("64", "64", "16", false, false)));
    // chosen: tiles with k-step 32 and staged loads, or the skinny kernels (the seed's batch-1
    // layers: their 16 rows against the large weights, their weight gradients' 16-pixel sums)
    let chosen = defines(&[]);
    assert!(chosen
        .iter()
        .all(|(_, _, k, staged, skinny)| *skinny || (k == "32" && *staged)));
    assert!(
        chosen
            .iter()
            .any(|(m, _, _, _, skinny)| m == "16" && *skinny),
        "the seed's batch-1 layers take a 16-row kernel: {chosen:?}"
    );
    assert!(
        chosen
            .iter()
            .any(|(_, _, k, _, skinny)| k == "16" && *skinny),
        "the seed's weight gradients sum 16 pixels: {chosen:?}"
    );
    // --no-skinny: every GEMM tiled
    let tiled = defines(&["--no-skinny"]);
    assert!(tiled
        .iter()
        .all(|(_, _, k, staged, skinny)| !*skinny && k == "32" && *staged));
}
