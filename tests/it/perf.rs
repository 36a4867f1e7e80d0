//! The static performance model (`dmc_codegen::perf`): the occupancy rule against the CUDA
//! occupancy calculator's values, the GPU table against the data sheets' peaks, the floor against
//! an independent count of each plan's bytes and FLOPs, the invariants every prediction keeps,
//! the calibration against the H200 step times logged in docs/gpu-check-h200.log, and the CLI
//! (`dmc compile --perf`, `dmc plan`'s line, `--gpu`).

use std::path::Path;

use crate::common::dmc;

use dmc_codegen::perf::{
    gpu, gpu_of_device, resident_blocks, step_perf, Gpu, StepPerf, CALIBRATION, GPUS,
};
use dmc_codegen::{render_plan, CodegenOptions};
use dmc_compiler::op::Role;
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::{compile, CompileOptions};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn plan_of(example: &str) -> Plan {
    let path = root().join("examples").join(format!("{example}.dm"));
    let src = std::fs::read_to_string(&path).expect("read example");
    let model = dmc_grammar::compile_source(&src, &path.display().to_string())
        .unwrap_or_else(|e| panic!("{example}: {e:?}"));
    let opts = CompileOptions {
        mode: Mode::Train,
        ..Default::default()
    };
    compile(&model, &opts).unwrap_or_else(|e| panic!("{example}: {e}"))
}

/// The model with registers estimated (no NVRTC), so the test runs everywhere: the kernels as
/// rendered by default (tiles and splits chosen by the model) with `split_k`, or (`!split_k`)
/// the baseline GEMM the logged H200 times measured (one tile, unpipelined, unsplit).
fn predict(plan: &Plan, g: &'static Gpu, split_k: bool) -> StepPerf {
    let opts = if split_k {
        CodegenOptions::default()
    } else {
        baseline()
    };
    predict_with(plan, g, &opts)
}

fn predict_with(plan: &Plan, g: &'static Gpu, opts: &CodegenOptions) -> StepPerf {
    let kernels = render_plan(plan, opts).expect("render");
    step_perf(plan, &kernels, &|_| None, g, &CALIBRATION)
}

fn baseline() -> CodegenOptions {
    CodegenOptions {
        split_k: false,
        baseline_gemm: true,
        ..CodegenOptions::default()
    }
}

const EXAMPLES: [&str; 4] = ["seed", "deep_convnet", "resnet_small", "mlp"];

#[test]
fn resident_blocks_follow_the_occupancy_rules() {
    let h = gpu("h200").unwrap();
    // CUDA occupancy calculator, compute capability 9.0: 256 threads
    assert_eq!(
        resident_blocks(h, 256, 56, 8256),
        4,
        "56 regs: 14,336 per block"
    );
    assert_eq!(resident_blocks(h, 256, 64, 8256), 4);
    assert_eq!(
        resident_blocks(h, 256, 80, 8256),
        3,
        "80 regs: 20,480 per block"
    );
    assert_eq!(
        resident_blocks(h, 256, 152, 8256),
        1,
        "152 regs: 38,912 per block"
    );
    assert_eq!(resident_blocks(h, 256, 14, 0), 8, "threads: 2048 / 256");
    assert_eq!(resident_blocks(h, 32, 16, 0), 32, "the 32-block limit");
    // shared memory: 228 KiB per SM, 1 KiB reserved per block
    assert_eq!(resident_blocks(h, 128, 32, 100 * 1024), 2);
    // RTX 4090: 1536 threads per SM, 24 blocks
    let r = gpu("rtx4090").unwrap();
    assert_eq!(resident_blocks(r, 256, 32, 0), 6);
    assert_eq!(resident_blocks(r, 32, 16, 0), 24);
    // never zero, even for a block that could not launch
    assert_eq!(resident_blocks(h, 1024, 255, 0), 1);
}

#[test]
fn the_gpu_table_has_the_data_sheets_peaks() {
    // (name, FP32 TFLOP/s, TB/s) as NVIDIA publishes them
    let sheets = [
        ("H200", 67.0, 4.8),
        ("H100", 67.0, 3.35),
        ("A100", 19.5, 2.039),
        ("RTX4090", 82.6, 1.008),
        ("GTX960", 2.41, 0.112),
    ];
    assert_eq!(GPUS.len(), sheets.len());
    for (name, tflops, tbs) in sheets {
        let g = gpu(name).unwrap_or_else(|| panic!("{name} missing"));
        let f = g.fp32_flops() / 1e12;
        assert!((f / tflops - 1.0).abs() < 0.03, "{name}: {f} TFLOP/s");
        assert!((g.dram_bw / 1e12 / tbs - 1.0).abs() < 0.01, "{name}");
        assert_eq!(gpu(&name.to_lowercase()).map(|g| g.name), Some(name));
    }
    assert_eq!(gpu("nope"), None);
    assert_eq!(gpu_of_device("NVIDIA H200").map(|g| g.name), Some("H200"));
    assert_eq!(
        gpu_of_device("NVIDIA GeForce RTX 4090").map(|g| g.name),
        Some("RTX4090")
    );
    assert_eq!(
        gpu_of_device("NVIDIA A100-SXM4-80GB").map(|g| g.name),
        Some("A100")
    );
}

#[test]
fn the_floor_is_each_operand_once_at_the_peaks() {
    for ex in EXAMPLES {
        let plan = plan_of(ex);
        for g in GPUS {
            let p = predict(&plan, g, true);
            // independently: per step, max(FLOPs / peak, bytes of its operands / bandwidth)
            let mut floor = 0.0;
            for s in &plan.steps {
                let k = &plan.kernels[s.kernel];
                let bytes: usize = k
                    .signature
                    .params
                    .iter()
                    .zip(&k.arg_shapes)
                    .map(|(p, sh)| {
                        let b = sh.iter().product::<usize>() * p.dtype.size();
                        match p.role {
                            Role::In | Role::Out => b,
                            Role::InOut => 2 * b,
                            Role::Workspace => 0,
                        }
                    })
                    .sum();
                if matches!(k.op.kind_name(), "reshape" | "input" | "param") {
                    continue;
                }
                floor += (k.flops() as f64 / g.fp32_flops()).max(bytes as f64 / g.dram_bw);
            }
            assert!(
                (p.floor_s / floor - 1.0).abs() < 1e-9,
                "{ex} on {}: floor {} vs {floor}",
                g.name,
                p.floor_s
            );
        }
    }
    // the count for the seed network: ~3.3 GB per step, ~0.7 ms on an H200
    let p = predict(&plan_of("seed"), gpu("h200").unwrap(), true);
    assert!((3.2e9..3.4e9).contains(&p.min_bytes), "{}", p.min_bytes);
    assert!((0.65e-3..0.75e-3).contains(&p.floor_s), "{}", p.floor_s);
}

#[test]
fn no_prediction_beats_the_roofline_and_a_faster_gpu_is_never_slower() {
    let (h200, h100, gtx) = (
        gpu("h200").unwrap(),
        gpu("h100").unwrap(),
        gpu("gtx960").unwrap(),
    );
    for ex in EXAMPLES {
        let plan = plan_of(ex);
        let ps: Vec<StepPerf> = [h200, h100, gtx]
            .iter()
            .map(|g| predict(&plan, g, true))
            .collect();
        for p in &ps {
            assert!(!p.kernels.is_empty());
            for k in &p.kernels {
                assert!(
                    k.predicted_s.is_finite() && k.predicted_s > 0.0,
                    "{ex} {}",
                    k.kernel
                );
                assert!(
                    k.predicted_s >= k.floor_s,
                    "{ex} {}: below its floor",
                    k.kernel
                );
                assert!(k.moved_bytes >= k.min_bytes * 0.999, "{ex} {}", k.kernel);
                assert!(k.dram_bytes <= k.moved_bytes * 1.001, "{ex} {}", k.kernel);
                assert!(k.resident >= 1 && k.occupancy > 0.0 && k.occupancy <= 1.0);
            }
            let sum: f64 = p
                .kernels
                .iter()
                .map(|k| k.predicted_s * k.launches as f64)
                .sum();
            assert!((sum / p.predicted_s - 1.0).abs() < 1e-9);
            assert_eq!(
                p.kernels.iter().map(|k| k.launches).sum::<usize>(),
                plan.steps
                    .iter()
                    .filter(|s| !matches!(plan.kernels[s.kernel].op.kind_name(), "reshape"))
                    .count(),
                "{ex}: every kernel step counted once"
            );
        }
        // the H200 is an H100 with more bandwidth: never slower, kernel by kernel
        for (a, b) in ps[0].kernels.iter().zip(&ps[1].kernels) {
            assert!(
                a.predicted_s <= b.predicted_s * (1.0 + 1e-12),
                "{ex} {}",
                a.kernel
            );
        }
        assert!(
            ps[2].predicted_s > ps[0].predicted_s,
            "{ex}: GTX 960 vs H200"
        );
    }
}

/// The H200 step times of docs/gpu-check-h200.log (`<name> train ... <ms> ms/step`; resnet_small's
/// from its `dmc run --device auto` line), measured before split-K landed.
fn logged_ms() -> Vec<(&'static str, f64)> {
    let log = std::fs::read_to_string(root().join("docs/gpu-check-h200.log")).expect("log");
    let ms_of = |l: &str| -> f64 {
        let i = l.find(" ms/step").unwrap_or_else(|| panic!("{l}"));
        l[..i].split_whitespace().last().unwrap().parse().unwrap()
    };
    let mut out = vec![];
    for ex in ["seed", "deep_convnet"] {
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("{ex} ")) && l.contains(" ms/step"))
            .unwrap_or_else(|| panic!("{ex} not in the log"));
        out.push((ex, ms_of(line)));
    }
    let first_run = log
        .lines()
        .find(|l| l.contains("steps, final loss"))
        .unwrap();
    out.push(("resnet_small", ms_of(first_run)));
    assert!(out.iter().all(|(_, ms)| *ms > 0.0));
    out
}

#[test]
fn the_calibrated_model_is_within_30_percent_of_the_logged_h200_steps() {
    let h200 = gpu("h200").unwrap();
    for (ex, measured) in logged_ms() {
        let p = predict(&plan_of(ex), h200, false);
        let model = p.predicted_s * 1e3;
        let r = model / measured;
        assert!(
            (0.7..=1.3).contains(&r),
            "{ex}: model {model:.1} ms vs measured {measured:.1} ms on the H200"
        );
    }
}

/// The per-kernel table of `dmc run --profile` under `header` in docs/gpu-check-h200-2026-12-04.log:
/// (kernel, measured µs per step).
fn logged_kernels(header: &str) -> Vec<(String, f64)> {
    let log =
        std::fs::read_to_string(root().join("docs/gpu-check-h200-2026-12-04.log")).expect("log");
    let start = log
        .find(header)
        .unwrap_or_else(|| panic!("{header} not in the log"));
    let mut out = vec![];
    for l in log[start..].lines().skip(1) {
        if l.starts_with("## ") {
            break;
        }
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        // | kernel | launches/step | µs/step | share | predicted µs/step | measured/predicted |
        if cells.len() < 7 || cells[1] == "kernel" || cells[1].starts_with("---") {
            continue;
        }
        if cells[1].starts_with("**") {
            continue; // the step's total
        }
        out.push((cells[1].to_string(), cells[3].parse().expect("µs/step")));
    }
    assert!(out.len() >= 10, "{header}: {} rows", out.len());
    out
}

#[test]
fn the_recalibrated_model_is_near_each_measured_h200_kernel() {
    // the pipelined kernels' per-kernel H200 times (BENCHMARKS.md, 2026-12-04): every kernel that
    // takes 5% of its step within 1.5x of the model, and the step within 30%
    let h200 = gpu("h200").unwrap();
    for (ex, header) in [
        (
            "seed",
            "## dmc run examples/seed.dm --steps 8 --device cuda --profile --no-cp-async\n",
        ),
        (
            "deep_convnet",
            "## dmc run examples/deep_convnet.dm --steps 5 --device cuda --profile\n",
        ),
    ] {
        // the kernels that were measured: tiled (the skinny ones came after)
        let tiled = CodegenOptions {
            skinny: false,
            ..CodegenOptions::default()
        };
        let p = predict_with(&plan_of(ex), h200, &tiled);
        let measured = logged_kernels(header);
        let total: f64 = measured.iter().map(|(_, us)| us).sum();
        let model_us = |name: &str| -> f64 {
            let k = p
                .kernels
                .iter()
                .find(|k| k.kernel == name)
                .unwrap_or_else(|| panic!("{ex}: no kernel {name} in the model"));
            k.predicted_s * k.launches as f64 * 1e6
        };
        for (name, us) in &measured {
            if *us < 0.05 * total {
                continue;
            }
            let r = model_us(name) / us;
            assert!(
                (1.0 / 1.5..=1.5).contains(&r),
                "{ex} {name}: model {:.0} µs vs measured {us:.0} µs per step",
                model_us(name)
            );
        }
        let r = p.predicted_s * 1e6 / total;
        assert!(
            (0.7..=1.3).contains(&r),
            "{ex}: model {:.0} µs vs measured {total:.0} µs per step",
            p.predicted_s * 1e6
        );
    }
}

#[test]
fn split_k_is_predicted_faster_where_it_fills_the_gpu() {
    let h200 = gpu("h200").unwrap();
    let unsplit = CodegenOptions {
        split_k: false,
        ..CodegenOptions::default()
    };
    for ex in ["seed", "deep_convnet"] {
        let plan = plan_of(ex);
        let (on, off) = (
            predict(&plan, h200, true),
            predict_with(&plan, h200, &unsplit),
        );
        assert!(on.predicted_s < off.predicted_s, "{ex}");
        // and the chosen tiles (pipelined, split) beat the baseline kernel by far
        let base = predict(&plan, h200, false);
        assert!(on.predicted_s * 4.0 < base.predicted_s, "{ex}");
    }
}

#[test]
fn every_kernel_that_moves_4_mb_covers_a_132_sm_gpu() {
    // the rule: every kernel of seed.dm and deep_convnet.dm touching at least 4 MB
    // launches at least one block per SM of an H200 (132 SMs)
    let h200 = gpu("h200").unwrap();
    for ex in ["seed", "deep_convnet"] {
        let p = predict(&plan_of(ex), h200, true);
        let mut large = 0;
        for k in p.kernels.iter().filter(|k| k.min_bytes >= 4e6) {
            large += 1;
            assert!(
                k.blocks >= u64::from(h200.sms),
                "{ex} {}: {} blocks for {:.1} MB",
                k.kernel,
                k.blocks,
                k.min_bytes / 1e6
            );
        }
        assert!(large >= 4, "{ex}: {large} kernels of 4 MB");
    }
}

#[test]
fn the_chosen_gemm_is_the_models_fastest_candidate_within_its_workspace() {
    use dmc_codegen::perf::gemm_launch_s;
    use dmc_codegen::{
        candidate, choose, effective_split, grid_blocks, GemmGeom, GemmKind, GemmNeeds,
        DEFAULT_TILE, TILES,
    };
    let h200 = gpu("h200").unwrap();
    let opts = CodegenOptions::default();
    // a fixed spread of shapes: skinny, square, narrow, long and short reductions
    let mut shapes = vec![];
    for gm in [1, 16, 27, 100, 576, 4096, 131072] {
        for gn in [4, 64, 1000, 1024] {
            for gk in [16, 300, 9216, 131072] {
                shapes.push((gm, gn, gk));
            }
        }
    }
    for (gm, gn, gk) in shapes {
        for (update, ws, k_unit) in [
            (false, 0, 0),
            (true, 1 << 22, 0),
            (false, 37 * gm * gn, 0),
            (true, 1 << 22, 512),
            (false, 37 * gm * gn, 512),
        ] {
            let needs = GemmNeeds {
                groups: 1,
                implicit: true,
                b_implicit: false,
                vec_a: true,
                vec_b: true,
                update,
                partial_elems: ws,
                k_unit,
                wide_copies: false,
                b_k_fastest: false,
            };
            let g = choose(gm, gn, gk, &needs, &opts);
            assert!(g.pipelined, "{gm}x{gn}x{gk}");
            assert!(
                g.split == 1 || g.split * gm * gn <= ws,
                "{gm}x{gn}x{gk}: split {} outgrows the workspace of {ws}",
                g.split
            );
            // k ranges of whole tiles (and of whole `k_unit`s: a fused bias' chunks), none
            // empty, covering the reduction (as the template splits)
            let unit = (g.tile.bk as usize).max(k_unit as usize);
            let ks = if g.split > 1 {
                gk.div_ceil(g.split).div_ceil(unit) * unit
            } else {
                gk
            };
            assert_eq!(ks, g.ks(), "{gm}x{gn}x{gk}");
            assert!(
                g.split * ks >= gk && (g.split - 1) * ks < gk,
                "{gm}x{gn}x{gk}"
            );
            assert!(g.split == 1 || ks % g.tile.bk as usize == 0);
            assert!(g.split == 1 || k_unit == 0 || ks % k_unit as usize == 0);
            // independently: every tile, every split the workspace allows; for a GEMM of 4 MB,
            // only the grids with a block per SM when there are any
            let mut all = vec![];
            let tiled = GemmGeom {
                kind: GemmKind::Tiled,
                ..g
            };
            for t in TILES {
                for s in 1..=(ws / (gm * gn)).clamp(1, 128) {
                    let split = effective_split(gk, s, t.bk.max(k_unit));
                    all.push(candidate(&tiled, t, split, false));
                }
            }
            // and the skinny kernels where the operands allow one (a few rows, a short reduction)
            let skinny =
                dmc_codegen::skinny::candidates(&g, &needs, (ws / (gm * gn)).clamp(1, 128));
            let (few_rows, short) = (
                gm <= dmc_codegen::skinny::ROWS_MAX && k_unit == 0,
                gk <= dmc_codegen::skinny::OUTER_K_MAX,
            );
            assert!(few_rows || short || skinny.is_empty(), "{gm}x{gn}x{gk}");
            assert!(!short || !skinny.is_empty(), "{gm}x{gn}x{gk}");
            assert!(
                g.kind == GemmKind::Tiled
                    || skinny
                        .iter()
                        .any(|c| (c.kind, c.tile, c.split) == (g.kind, g.tile, g.split))
            );
            all.extend(skinny);
            let bytes = (gm * gk + gk * gn + gm * gn) * 4;
            let covering = |c: &GemmGeom| bytes < 4_000_000 || grid_blocks(c) >= 132;
            let any_covers = all.iter().any(covering);
            assert!(
                covering(&g) || !any_covers,
                "{gm}x{gn}x{gk}: {} blocks",
                grid_blocks(&g)
            );
            let best = all
                .iter()
                .filter(|c| covering(c) || !any_covers)
                .map(|c| gemm_launch_s(c, false, h200, &CALIBRATION))
                .fold(f64::INFINITY, f64::min);
            // ranked as the plain GEMM: a fused update takes the unfused gradient's tile and split
            let plain = choose(
                gm,
                gn,
                gk,
                &GemmNeeds {
                    update: false,
                    ..needs
                },
                &opts,
            );
            assert_eq!(
                (g.tile, g.split),
                (plain.tile, plain.split),
                "{gm}x{gn}x{gk}"
            );
            let got = gemm_launch_s(&plain, false, h200, &CALIBRATION);
            assert!(
                got <= best * 1.02,
                "{gm}x{gn}x{gk} ws {ws}: chose {:?} split {} at {got:e} s, a candidate takes {best:e} s",
                g.tile,
                g.split
            );
        }
    }
    // grouped GEMMs are never split (grid z is the group), the baseline is the logged kernel
    let grouped = GemmNeeds {
        groups: 4,
        implicit: true,
        b_implicit: false,
        vec_a: true,
        vec_b: true,
        update: false,
        partial_elems: 1 << 22,
        k_unit: 0,
        wide_copies: false,
        b_k_fastest: false,
    };
    assert_eq!(choose(16, 64, 9216, &grouped, &opts).split, 1);
    let b = choose(16, 1024, 9216, &grouped, &baseline());
    assert_eq!((b.tile, b.split, b.pipelined), (DEFAULT_TILE, 1, false));
}

#[test]
fn compile_perf_prints_a_row_per_kernel_and_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let ex = root().join("examples/mlp.dm").display().to_string();
    let (code, stdout, stderr) = dmc(&["compile", &ex, "-o", &out, "--perf", "--gpu", "a100"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("performance model: A100 (sm_80, 108 SMs"),
        "{stdout}"
    );
    let kernels = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "cu")
        })
        .count();
    assert!(kernels > 0);
    let rows = stdout
        .lines()
        .skip_while(|l| !l.starts_with("kernel "))
        .skip(1)
        .take_while(|l| !l.starts_with("step:"))
        .count();
    assert_eq!(rows, kernels, "{stdout}");
    assert!(stdout.contains("predicted step on A100: "), "{stdout}");

    let (code, _, stderr) = dmc(&["compile", &ex, "-o", &out, "--perf", "--gpu", "tpu"]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("--gpu tpu: not a GPU the performance model knows; use one of H200, H100"),
        "{stderr}"
    );
}

#[test]
fn plan_prints_the_predicted_step() {
    let ex = root().join("examples/seed.dm").display().to_string();
    let (code, stdout, stderr) = dmc(&["plan", &ex]);
    assert_eq!(code, 0, "{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("predicted step on H200: "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("roofline floor 0.69"), "{line}");
    let (code, stdout, _) = dmc(&["plan", &ex, "--gpu", "GTX960"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("predicted step on GTX960: "), "{stdout}");
}

#[test]
fn a_tf32_program_is_predicted_on_tensor_cores() {
    // `precision: tf32` in deep_convnet's train section: `dmc plan` predicts the TF32 GEMMs (a
    // compute-bound step: faster than fp32, and its floor at the tensor cores' peak), and
    // `dmc compile --perf --precision fp32` overrides it back
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(root().join("examples/deep_convnet.dm")).unwrap();
    let file = dir.path().join("tf32.dm");
    std::fs::write(
        &file,
        src.replacen("train {", "train { precision: tf32,", 1),
    )
    .unwrap();
    let ms = |out: &str, prefix: &str| -> f64 {
        let l = out
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("{out}"));
        let rest = &l[prefix.len()..];
        rest.split(" ms").next().unwrap().trim().parse().unwrap()
    };
    let f = file.display().to_string();
    let (code, tf32, err) = dmc(&["plan", &f]);
    assert_eq!(code, 0, "{err}");
    let tf32_ms = ms(&tf32, "predicted step on H200 (TF32 tensor cores): ");
    let ex = root()
        .join("examples/deep_convnet.dm")
        .display()
        .to_string();
    let (code, fp32, err) = dmc(&["plan", &ex]);
    assert_eq!(code, 0, "{err}");
    let fp32_ms = ms(&fp32, "predicted step on H200: ");
    assert!(
        tf32_ms < 0.8 * fp32_ms,
        "tf32 {tf32_ms} ms vs fp32 {fp32_ms} ms"
    );
    let out = dir.path().join("k").display().to_string();
    let (code, text, err) = dmc(&["compile", &f, "-o", &out, "--perf", "--precision", "fp32"]);
    assert_eq!(code, 0, "{err}");
    assert!(!text.contains("TF32"), "{text}");
    assert!(text.contains("step: "), "{text}");
}
