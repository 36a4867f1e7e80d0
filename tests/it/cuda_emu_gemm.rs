//! The GEMM kernels in the CUDA emulator, beyond the per-example checks of `cuda_emu.rs`: every tile
//! the compiler may choose (split and unsplit, cp.async stages and registers), the two-level bias
//! sums against the CPU's bits, the cp.async pipeline's deferred copies (a stage read too early, a
//! misaligned copy), and the TF32 tensor-core MMAs (exact where TF32 and fp32 agree, within a
//! derived bound elsewhere, a network trained through them). Every test needs g++ (see
//! `cuda_emu.rs`).

use crate::common::dmc_env;
use crate::cuda_emu::{assert_all_ok, check_edited_at_with, final_loss, root, TOL};

use dmc_codegen::{render_kernel, CodegenOptions};
use dmc_compiler::plan::{Kernel, Mode};
use dmc_runtime::emu::check::{
    check_kernels, check_kernels_with, packed_site, CheckRun, KernelSite,
};

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn every_gemm_tile_matches_the_cpu_backend_split_and_unsplit() {
    // each tile the compiler may choose, forced on every GEMM of the zoo (partial tiles, fused
    // epilogues and updates, groups), the split chosen by the model within the planned workspace
    let zoo = dmc_codegen::zoo::gemms();
    assert!(zoo.len() >= 20, "{} GEMM kernels in the zoo", zoo.len());
    let mut split = std::collections::BTreeSet::new();
    let mut staged = 0;
    // with cp.async stages where the tile has them, and staged through registers
    for (tile, copy_async) in dmc_codegen::TILES
        .into_iter()
        .flat_map(|t| [(t, true), (t, false)])
    {
        let opts = CodegenOptions {
            tile: Some(tile),
            copy_async,
            ..CodegenOptions::default()
        };
        let (sa, sb) = tile.staged();
        let (mut va, mut vb) = (false, false);
        for k in &zoo {
            let ck = render_kernel(k, Mode::Train, &opts)
                .expect("render")
                .expect("a kernel");
            if ck.gemm.is_some_and(|g| g.split > 1) {
                split.insert(k.op.kind_name());
            }
            va |= ck.gemm.is_some_and(|g| g.vec_a);
            vb |= ck.gemm.is_some_and(|g| g.vec_b);
            // cp.async stages only where asked, and only the tile's
            let stages = ck.gemm.map_or(0, |g| g.stages);
            assert!(stages == 0 || (copy_async && stages == tile.async_stages()));
            staged += usize::from(stages > 1);
        }
        // the 128-bit loads run wherever the tile stages whole float4s (channels in fours)
        assert_eq!((va, vb), (sa % 4 == 0, sb % 4 == 0), "{tile:?}");
        let checks =
            check_kernels_with(&zoo, Mode::Train, CheckRun::default(), &opts).expect("emulate");
        assert_all_ok(
            &format!("zoo GEMMs with tile {tile:?}, cp.async {copy_async}"),
            &checks,
        );
    }
    // (the weight gradients with channels in fours, on every tile that stages float4s and fits
    // two stages: 64x64, 32x64, 64x32)
    assert!(staged >= 6, "{staged} kernels with cp.async stages");
    // the split-K entries of every GEMM family ran too
    for kind in [
        "conv2d",
        "conv2d_bwd_data",
        "conv2d_bwd_weight",
        "conv2d_bwd_weight_update",
    ] {
        assert!(split.contains(kind), "no split {kind} kernel: {split:?}");
    }
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn bias_gradients_sum_in_the_cpu_backends_order() {
    // the plan's two-level column sum (chunks of BIAS_CHUNK_ROWS rows): the standalone kernel's
    // warps sum chunks side by side (more chunks than warps: several rounds), and get the CPU
    // backend's bits exactly
    let zoo = dmc_codegen::zoo::zoo();
    let alone: Vec<Kernel> = zoo
        .iter()
        .filter(|k| k.op.kind_name() == "bias_grad")
        .cloned()
        .collect();
    let rows = |k: &Kernel| k.arg_shapes[0].iter().product::<usize>() / k.arg_shapes[1][0];
    assert!(
        alone
            .iter()
            .any(|k| rows(k) > 32 * dmc_plan::op::BIAS_CHUNK_ROWS),
        "no bias gradient with more chunks than a block's warps"
    );
    let checks = check_kernels(&alone, Mode::Train, CheckRun::default()).expect("emulate");
    for c in &checks {
        assert!(
            c.ok(0.0) && c.rel_err == 0.0,
            "{}: {}",
            c.kernel,
            c.verdict(0.0)
        );
    }
    // a split weight gradient that fuses the bias: its k ranges are whole chunks, several of them,
    // and the kernel matches the CPU backend (the chunk sums through `db` and the reduction)
    let opts = CodegenOptions::default();
    let split_bias: Vec<Kernel> = zoo
        .iter()
        .filter(|k| {
            matches!(
                k.op,
                dmc_plan::op::Op::Conv(dmc_plan::op::ConvOp::Conv2dBwdWeightUpdate {
                    bias: true,
                    ..
                })
            )
        })
        .filter(|k| {
            let ck = render_kernel(k, Mode::Train, &opts).unwrap().unwrap();
            ck.gemm.is_some_and(|g| {
                g.split > 1
                    && g.ks() % dmc_plan::op::BIAS_CHUNK_ROWS == 0
                    && g.ks() < g.gk
                    && g.gk % dmc_plan::op::BIAS_CHUNK_ROWS != 0
            })
        })
        .cloned()
        .collect();
    assert!(!split_bias.is_empty(), "no split fused bias in the zoo");
    let checks = check_kernels(&split_bias, Mode::Train, CheckRun::default()).expect("emulate");
    assert_all_ok("split fused bias", &checks);
}

/// The TF32 tiles: each tile that splits into whole m16n8k8 MMAs over its 8 warps.
fn tf32_tiles() -> Vec<dmc_codegen::GemmTile> {
    dmc_codegen::TILES
        .into_iter()
        .filter(|t| t.mma_per_warp().is_some())
        .collect()
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn tf32_tensor_core_gemms_are_exact_where_tf32_and_fp32_agree() {
    // Inputs on a grid of 1/8 are exact in TF32 and every sum of their products is exact in fp32,
    // so a TF32 GEMM must give the CPU backend's fp32 bits whatever its order: the MMA fragments
    // (which lane holds which element of A, B and D) are checked element by element, on every
    // TF32 tile over every GEMM of the zoo (partial tiles, split-K, fused epilogues and updates).
    let zoo = dmc_codegen::zoo::gemms();
    let tiles = tf32_tiles();
    assert!(tiles.len() >= 4, "{tiles:?}");
    for tile in tiles {
        let opts = CodegenOptions {
            tile: Some(tile),
            tf32: true,
            ..CodegenOptions::default()
        };
        for k in &zoo {
            let ck = render_kernel(k, Mode::Train, &opts).unwrap().unwrap();
            assert!(ck.gemm.is_some_and(|g| g.tf32), "{}: not TF32", k.name);
            assert!(ck.source.contains("dmc_mma_tf32(acc[i], a, b);"));
        }
        let run = CheckRun {
            grid: Some(0.125),
            ..CheckRun::default()
        };
        let checks = check_kernels_with(&zoo, Mode::Train, run, &opts).expect("emulate");
        assert_all_ok(&format!("TF32 zoo GEMMs on a grid, tile {tile:?}"), &checks);
        for c in &checks {
            // (the fused updates and activations: their fp32 formulas, as in every fp32 check)
            let plain = matches!(
                c.kind,
                "conv2d" | "conv2d_bwd_data" | "conv2d_bwd_weight" | "dense" | "dense_bwd_weight"
            );
            assert!(
                !plain || c.rel_err == 0.0,
                "{} ({}) with tile {tile:?}: {}",
                c.kernel,
                c.kind,
                c.verdict(0.0)
            );
        }
    }
}

/// Max relative error of a TF32 GEMM of reduction length `k` against fp32 on inputs in [-1, 1]:
/// each input is rounded to 10 mantissa bits (relative error at most 2^-11), so a product is off
/// by at most 2^-10 of itself and an output by at most 2^-10 of the sum of its terms' magnitudes.
/// With independent signs an output is ~sqrt(K) terms' size while that sum is ~K terms' size, and
/// the check divides by the largest output, ~3 sqrt(K) terms: 2^-10 * sqrt(K) / 3, times 4 for
/// the tails of a few hundred thousand outputs.
fn tf32_tol(k: usize) -> f64 {
    4.0 * (2f64).powi(-10) * (k.max(1) as f64).sqrt() / 3.0
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn tf32_tensor_core_gemms_match_the_cpu_backend_within_tf32_rounding() {
    // arbitrary f32 inputs: within tf32_tol(K) of fp32, and not as close as fp32 is (the inputs
    // were rounded: a kernel that silently stayed fp32 fails)
    let zoo = dmc_codegen::zoo::gemms();
    let mut worst: f64 = 0.0;
    let mut tf32 = 0;
    // the largest TF32 tile and the smallest, on every GEMM of the zoo
    let tiles = tf32_tiles();
    for tile in [tiles[0], tiles[tiles.len() - 1]] {
        let opts = CodegenOptions {
            tile: Some(tile),
            tf32: true,
            ..CodegenOptions::default()
        };
        let checks =
            check_kernels_with(&zoo, Mode::Train, CheckRun::default(), &opts).expect("emulate");
        for (c, k) in checks.iter().zip(&zoo) {
            let ck = render_kernel(k, Mode::Train, &opts).unwrap().unwrap();
            let g = ck.gemm.expect("a GEMM");
            assert!(g.tf32, "{}", c.kernel);
            let tol = tf32_tol(g.gk);
            assert!(c.ok(tol), "{} (K {}): {}", c.kernel, g.gk, c.verdict(tol));
            tf32 += 1;
            worst = worst.max(c.rel_err / tol);
        }
    }
    assert!(tf32 >= 40, "{tf32} TF32 kernels");
    let opts = CodegenOptions {
        tile: Some(tiles[0]),
        tf32: true,
        ..CodegenOptions::default()
    };
    eprintln!("TF32 zoo GEMMs: worst rel err {worst:.3} of the tolerance");
    // a TF32 kernel over arbitrary inputs is not as close as an fp32 one
    let plain: Vec<Kernel> = zoo
        .iter()
        .filter(|k| k.op.kind_name() == "dense")
        .cloned()
        .collect();
    let c = check_kernels_with(&plain, Mode::Train, CheckRun::default(), &opts).expect("emulate");
    assert!(c.iter().any(|c| c.rel_err > 1e-5), "{c:?}");
}

/// A zoo kernel whose tiles are copied with cp.async (a weight gradient with channels in fours, on
/// the 64x64 tile), its site, and the options that render it so.
pub(super) fn staged_kernel() -> (Kernel, KernelSite, CodegenOptions) {
    let opts = CodegenOptions {
        tile: Some(dmc_codegen::TILES[1]),
        ..CodegenOptions::default()
    };
    assert_eq!((opts.tile.unwrap().bm, opts.tile.unwrap().bn), (64, 64));
    let k = dmc_codegen::zoo::zoo()
        .into_iter()
        .find(|k| {
            render_kernel(k, Mode::Train, &opts)
                .ok()
                .flatten()
                .is_some_and(|ck| ck.gemm.is_some_and(|g| g.stages > 1))
        })
        .expect("a zoo GEMM with cp.async stages");
    let site = packed_site(&k);
    (k, site, opts)
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn a_stage_read_before_its_copies_land_is_caught() {
    let (k, site, opts) = staged_kernel();
    let c = check_edited_at_with(&k, Mode::Train, &site, ("{", "{", 0), &opts);
    assert!(c.ok(TOL), "{}", c.verdict(TOL));
    // waiting for one group fewer: tile t's copies are still in flight when it is multiplied
    let c = check_edited_at_with(
        &k,
        Mode::Train,
        &site,
        ("dmc_cp_wait<", "dmc_cp_wait<1 + ", 0),
        &opts,
    );
    assert!(!c.ok(TOL) && c.rel_err > 1e-2, "{c:?}");
    // a 16-byte copy one float off its alignment fails the launch
    let c = check_edited_at_with(
        &k,
        Mode::Train,
        &site,
        (
            "dmc_cp16(&Bs[st][kk][nn]",
            "dmc_cp16(&Bs[st][kk][nn] + 1",
            0,
        ),
        &opts,
    );
    assert!(
        c.failure
            .as_deref()
            .unwrap_or("")
            .contains("not 16-byte aligned"),
        "{c:?}"
    );
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn tf32_trains_through_the_emulated_tensor_cores_near_the_cpu() {
    // resnet_small in TF32 (`--precision tf32`; `precision: tf32` in its train section does the
    // same): its GEMMs on emulated m16n8k8 MMAs, inputs rounded to 10 mantissa bits. Three steps'
    // losses stay within 1% of the fp32 CPU run's, and are not identical to them.
    let dir = tempfile::tempdir().expect("tempdir");
    let src = std::fs::read_to_string(root().join("examples/resnet_small.dm")).unwrap();
    let tf32_src = src.replacen("train {", "train { precision: tf32,", 1);
    assert_ne!(src, tf32_src);
    let file = dir.path().join("resnet_tf32.dm");
    std::fs::write(&file, &tf32_src).unwrap();
    let f = file.display().to_string();
    let args = ["run", &f, "--steps", "3", "--seed", "3"];
    let (rc, out, err) = dmc_env(&[&args[..], &["--device", "cpu"]].concat(), &[]);
    assert_eq!(rc, 0, "{err}");
    assert!(err.contains("the CPU backend computes in fp32"), "{err}");
    let cpu: f64 = final_loss(&(out + &err)).parse().unwrap();
    let (rc, out, err) = dmc_env(&[&args[..], &["--device", "cuda-emu"]].concat(), &[]);
    assert_eq!(rc, 0, "{err}");
    let emu: f64 = final_loss(&(out + &err)).parse().unwrap();
    assert!(
        (emu - cpu).abs() <= 0.01 * cpu.abs() && emu != cpu,
        "tf32 emulated {emu} vs fp32 cpu {cpu}"
    );
    // --precision fp32 overrides the program: the CPU's loss again
    let (rc, out, err) = dmc_env(
        &[&args[..], &["--device", "cuda-emu", "--precision", "fp32"]].concat(),
        &[],
    );
    assert_eq!(rc, 0, "{err}");
    let fp32: f64 = final_loss(&(out + &err)).parse().unwrap();
    assert_eq!(fp32, cpu);
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn skinny_gemms_match_the_cpu_backend() {
    // every zoo GEMM that a skinny kernel can compute, forced onto it (the model's fastest skinny
    // candidate): a few rows with B along n and along k, split and not; short reductions with
    // fused updates (every rule), the fused bias, the old weights kept
    use dmc_codegen::GemmKind;
    let opts = CodegenOptions {
        force_skinny: true,
        ..CodegenOptions::default()
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut picked = vec![];
    for k in dmc_codegen::zoo::gemms() {
        let ck = render_kernel(&k, Mode::Train, &opts)
            .expect("render")
            .expect("a kernel");
        if let Some(g) = ck.gemm.filter(|g| g.kind != GemmKind::Tiled) {
            seen.insert((g.kind, g.b_k_fastest, g.split > 1));
            picked.push(k);
        }
    }
    let checks =
        check_kernels_with(&picked, Mode::Train, CheckRun::default(), &opts).expect("emulate");
    assert_all_ok("skinny zoo GEMMs", &checks);
    // a batch-1 network: 9 rows (not a multiple of 4), columns that fill no block, fused
    // activations, Adam's update and the bias in the 9-pixel weight gradients; its plan's kernels
    // as chosen by the model and forced onto the skinny kernels
    let src = "\
input  x: [3, 3, 12]
target y: [1]

out = x |> conv2d(20, 3, activation: relu) |> conv2d(36, 3) |> conv2d(8, 3, activation: relu)
        |> flatten |> dense(1)

loss mse(out, y)
train { batch: 1, optimizer: adam(lr: 0.001) }
";
    let plan = crate::cuda_emu::plan_of_source(src, "batch1.dm", Mode::Train, None);
    for o in [CodegenOptions::default(), opts] {
        for k in &plan.kernels {
            if let Some(g) = render_kernel(k, Mode::Train, &o)
                .expect("render")
                .and_then(|c| c.gemm)
                .filter(|g| g.kind != GemmKind::Tiled)
            {
                seen.insert((g.kind, g.b_k_fastest, g.split > 1));
            }
        }
        let checks = check_kernels_with(&plan.kernels, Mode::Train, CheckRun::default(), &o)
            .expect("emulate");
        assert_all_ok("a batch-1 network's kernels", &checks);
    }
    // (the seed network's kernels, split rows kernels along n and along k among them, are
    // `cuda_emu::every_seed_kernel_matches_the_cpu_backend`'s)
    for want in [
        (GemmKind::Rows, false, false),
        (GemmKind::Rows, true, false),
        (GemmKind::Outer, false, false),
        (GemmKind::Outer, true, false),
    ] {
        assert!(seen.contains(&want), "no {want:?} kernel checked: {seen:?}");
    }
}
