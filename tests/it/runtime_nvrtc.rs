//! Every kernel of every example compiles with NVRTC for sm_80 and sm_90, with no warnings and no
//! register spills. Needs NVRTC (no GPU): found per `dmc_runtime::cuda::nvrtc` (e.g. `DMC_NVRTC`).
//! Without it the test is ignored (the build script probes for it, see `runtime/build/probe.rs`),
//! unless `CI` is set, where a missing NVRTC fails.

use dmc_codegen::CodegenOptions;
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::CompileOptions;
use dmc_runtime::cuda::{nvrtc, selftest};

fn plan_of(example: &str, mode: Mode) -> Plan {
    plan_with(
        example,
        CompileOptions {
            mode,
            ..CompileOptions::default()
        },
    )
}

fn plan_with(example: &str, opts: CompileOptions) -> Plan {
    let path = format!("{}/examples/{example}.dm", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).expect("example");
    let model = dmc_grammar::compile_source(&src, &path).expect("example compiles");
    let opts = CompileOptions {
        verify: false,
        ..opts
    };
    dmc_compiler::compile(&model, &opts).expect("plan")
}

#[test]
#[cfg_attr(
    not(dmc_has_nvrtc),
    ignore = "needs NVRTC (set DMC_NVRTC to libnvrtc.so.12, e.g. from `pip install nvidia-cuda-nvrtc-cu12`)"
)]
fn every_example_kernel_compiles_for_sm80_and_sm90_without_warnings_or_spills() {
    let nv = nvrtc::nvrtc()
        .unwrap_or_else(|e| panic!("NVRTC is needed here (CI is set, or the build found it): {e}"));
    eprintln!(
        "NVRTC {}.{} from {}",
        nv.version.0,
        nv.version.1,
        nv.path.display()
    );
    let mut n = 0;
    for ex in [
        "mlp",
        "seed",
        "deep_convnet",
        "resnet_small",
        "bn_cnn",
        "resnet18",
        "mobilenet",
        "unet",
        "autoencoder_classifier",
    ] {
        for mode in [Mode::Train, Mode::Eval] {
            let plan = plan_of(ex, mode);
            for arch in ["sm_80", "sm_90"] {
                for r in selftest::compile_plan(&plan, arch, &CodegenOptions::default())
                    .expect("compiles")
                {
                    assert_clean(&r, &format!("{ex} {arch}"));
                    assert!(
                        r.resources.registers > 0,
                        "{ex} {arch} {}: no ptxas report",
                        r.kernel
                    );
                    n += 1;
                }
            }
        }
    }
    // and one kernel of every op variant, in both modes (dropout differs)
    let zoo = dmc_codegen::zoo::zoo();
    for mode in [Mode::Train, Mode::Eval] {
        for arch in ["sm_80", "sm_90"] {
            for r in selftest::compile_kernels(&zoo, mode, arch, &CodegenOptions::default())
                .expect("compiles")
            {
                assert_clean(&r, &format!("zoo {arch}"));
                n += 1;
            }
        }
    }
    assert!(n > 200, "{n} kernels");
}

#[test]
#[cfg_attr(
    not(dmc_has_nvrtc),
    ignore = "needs NVRTC (set DMC_NVRTC to libnvrtc.so.12, e.g. from `pip install nvidia-cuda-nvrtc-cu12`)"
)]
fn every_gemm_tile_compiles_for_sm80_and_sm90_without_warnings_or_spills() {
    nvrtc::nvrtc()
        .unwrap_or_else(|e| panic!("NVRTC is needed here (CI is set, or the build found it): {e}"));
    // each tile the compiler may choose, forced on the zoo's GEMM kernels
    let zoo = dmc_codegen::zoo::gemms();
    let mut n = 0;
    for tile in dmc_codegen::TILES {
        // with cp.async stages where the tile has them, staged through registers, and on TF32
        // tensor cores where the tile splits into MMAs
        for (copy_async, tf32) in [(true, false), (false, false), (true, true)] {
            if tf32 && tile.mma_per_warp().is_none() {
                continue;
            }
            let opts = CodegenOptions {
                tile: Some(tile),
                copy_async,
                tf32,
                ..CodegenOptions::default()
            };
            for arch in ["sm_80", "sm_90"] {
                for r in
                    selftest::compile_kernels(&zoo, Mode::Train, arch, &opts).expect("compiles")
                {
                    assert_clean(
                        &r,
                        &format!("{tile:?} cp.async {copy_async} tf32 {tf32} {arch}"),
                    );
                    n += 1;
                }
            }
        }
    }
    assert!(n >= dmc_codegen::TILES.len() * 2 * 2 * 20, "{n} kernels");
}

#[test]
#[cfg_attr(
    not(dmc_has_nvrtc),
    ignore = "needs NVRTC (set DMC_NVRTC to libnvrtc.so.12, e.g. from `pip install nvidia-cuda-nvrtc-cu12`)"
)]
fn cp_async_kernels_compile_below_sm80_as_plain_copies() {
    nvrtc::nvrtc()
        .unwrap_or_else(|e| panic!("NVRTC is needed here (CI is set, or the build found it): {e}"));
    // rendered for an H200 (cp.async stages), compiled for a GPU without cp.async (sm_75): the
    // copies are plain loads and stores there, still clean
    let zoo = dmc_codegen::zoo::gemms();
    let opts = CodegenOptions::default();
    let reports = selftest::compile_kernels(&zoo, Mode::Train, "sm_75", &opts).expect("compiles");
    assert!(reports.len() >= 20, "{} kernels", reports.len());
    for r in &reports {
        assert_clean(r, "sm_75");
    }
    // and the model's GTX 960 (sm_52) gets the register-staged kernels, no cp.async at all
    let gtx = CodegenOptions {
        gpu: "GTX960",
        ..CodegenOptions::default()
    };
    for k in &zoo {
        let ck = dmc_codegen::render_kernel(k, Mode::Train, &gtx)
            .expect("render")
            .expect("a kernel");
        assert!(ck.gemm.is_some_and(|g| g.stages == 0), "{}", ck.name);
        assert!(!ck.source.contains("dmc_cp_wait<"), "{}", ck.name);
    }
}

/// The data-parallel programs' kernels (the sharded updates, fused and not, clip_norm's
/// all-reduce of gpt.dm, batchnorm's whole-batch programs, dropout keyed by rank) of the
/// examples, at 2 and 3 ranks.
#[test]
#[cfg_attr(
    not(dmc_has_nvrtc),
    ignore = "needs NVRTC (set DMC_NVRTC to libnvrtc.so.12, e.g. from `pip install nvidia-cuda-nvrtc-cu12`)"
)]
fn data_parallel_programs_compile_for_sm80_and_sm90_without_warnings_or_spills() {
    nvrtc::nvrtc()
        .unwrap_or_else(|e| panic!("NVRTC is needed here (CI is set, or the build found it): {e}"));
    let mut n = 0;
    // (the last: sharded parameters, whose gathers and keeps are programs too)
    for (ex, ranks, fuse, shard_params) in [
        ("mlp", 2, true, false),
        ("mlp", 2, false, false),
        ("resnet_small", 2, true, false),
        ("resnet_small", 2, false, false),
        ("deep_convnet", 2, true, false),
        ("autoencoder_classifier", 2, true, false),
        ("gpt", 2, true, false),
        ("gpt", 3, false, false),
        ("bn_cnn", 2, true, false),
        ("mobilenet", 2, true, false),
        ("resnet_small", 2, true, true),
        ("gpt", 3, false, true),
    ] {
        let plan = plan_with(
            ex,
            CompileOptions {
                ranks,
                fuse,
                shard_params,
                batch: Some(12),
                ..CompileOptions::default()
            },
        );
        let sharded = plan.kernels.iter().filter(|k| k.op.shards() > 1).count();
        assert!(sharded > 0, "{ex}: no sharded step");
        assert_eq!(
            shard_params,
            plan.params.iter().any(|b| b.shard.is_some()),
            "{ex}: sharded parameters"
        );
        for arch in ["sm_80", "sm_90"] {
            for r in
                selftest::compile_plan(&plan, arch, &CodegenOptions::default()).expect("compiles")
            {
                assert_clean(&r, &format!("{ex} at {ranks} ranks {arch}"));
                n += 1;
            }
        }
    }
    assert!(n > 50, "{n} kernels");
}

/// NVRTC compiled `r` without a warning and without spilling registers.
fn assert_clean(r: &selftest::CompileReport, what: &str) {
    assert!(
        r.warnings.is_empty(),
        "{what} {}: {:?}",
        r.kernel,
        r.warnings
    );
    let s = r.resources;
    assert_eq!(
        s.spill_stores + s.spill_loads,
        0,
        "{what} {}: spills",
        r.kernel
    );
}

/// The longest run of the instruction `want` in `ptx` that none of `breaks` interrupts.
fn longest_run(ptx: &str, want: &str, breaks: &[&str]) -> usize {
    let (mut best, mut run) = (0, 0);
    for l in ptx.lines().map(str::trim) {
        let op = l.split_whitespace().next().unwrap_or("");
        let op = op.strip_prefix('@').map_or(op, |_| {
            l.split_whitespace().nth(1).unwrap_or("") // a predicated instruction
        });
        if op == want {
            run += 1;
            best = best.max(run);
        } else if breaks.iter().any(|b| op.starts_with(b)) {
            run = 0;
        }
    }
    best
}

#[test]
#[cfg_attr(
    not(dmc_has_nvrtc),
    ignore = "needs NVRTC (set DMC_NVRTC to libnvrtc.so.12, e.g. from `pip install nvidia-cuda-nvrtc-cu12`)"
)]
fn the_skinny_kernels_keep_their_loads_in_flight() {
    // What the model assumes of them, in NVRTC's PTX for sm_90: a rows kernel (the seed's forward
    // and data gradient) issues its 4 float4 loads of B before the FMAs that use them; the outer
    // kernel's fused update (the seed's weight gradient + SGD) loads 8 rows' weights before it
    // stores any (the tiled kernel's epilogue alternates one load and one store)
    let nv = nvrtc::nvrtc()
        .unwrap_or_else(|e| panic!("NVRTC is needed here (CI is set, or the build found it): {e}"));
    let plan = plan_of("seed", Mode::Train);
    let ptx_of = |name: &str, opts: &CodegenOptions| {
        let k = plan.kernels.iter().find(|k| k.name == name).expect(name);
        let ck = dmc_codegen::render_kernel(k, Mode::Train, opts)
            .expect("render")
            .expect("a kernel");
        let c = nv
            .compile_uncached(name, &ck.source, "sm_90", nvrtc::Output::Ptx)
            .expect("NVRTC");
        (
            ck.gemm.expect("a GEMM").kind,
            String::from_utf8_lossy(&c.image).into_owned(),
        )
    };
    let on = CodegenOptions::default();
    let tiled = CodegenOptions {
        skinny: false,
        ..CodegenOptions::default()
    };
    let stores = ["st.global"];
    for name in ["conv2d_3", "conv2d_bwd_data_2"] {
        let (kind, ptx) = ptx_of(name, &on);
        assert_eq!(kind, dmc_codegen::GemmKind::Rows, "{name}");
        // the main loop starts after A's rows are in shared memory (the first barrier)
        let main = &ptx[ptx.find("bar.sync").expect("a barrier")..];
        let first_fma = main.find("fma.rn.f32").expect("FMAs");
        let loads = main[..first_fma].matches("ld.global.nc.v4.f32").count();
        assert!(
            loads >= 4,
            "{name}: {loads} float4 loads of B before the first FMA"
        );
    }
    let name = "conv2d_bwd_weight_update_2";
    let (kind, ptx) = ptx_of(name, &on);
    assert_eq!(kind, dmc_codegen::GemmKind::Outer);
    assert!(longest_run(&ptx, "ld.global.f32", &stores) >= 8, "{name}");
    let (kind, ptx) = ptx_of(name, &tiled);
    assert_eq!(kind, dmc_codegen::GemmKind::Tiled);
    assert_eq!(
        longest_run(&ptx, "ld.global.f32", &stores),
        1,
        "{name} tiled"
    );
}
