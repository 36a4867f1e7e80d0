//! Streaming (issue 13): parameters and optimizer state that do not fit the cap live in a host
//! store and pass through windows of the arena. Checked here:
//!
//! * the seed network trains under 256 MB and 128 MB, and mlp, resnet_small (Adam) and
//!   deep_convnet below their smallest resident arena, with the same losses, weights and optimizer
//!   state as the resident plan, bit for bit, in poison mode (copies landing as late as their
//!   `ready` allows, released windows filled with NaN); the emulated CUDA kernels the same;
//! * the refusal below the smallest cap names a cap that works, and that cap works;
//! * the plan checker rejects a window read before its copy lands, a missing write-back, a
//!   write-back that lands after its window's bytes were released and a kernel given a
//!   host-store buffer; poison mode catches the first two at run time in a plan that gets past
//!   the runtime's own (memory-safety) validation;
//! * `--save` writes the host store's weights, the same file as a resident run's.

use std::path::Path;

use crate::common::dmc;
use dmc_compiler::op::{Op, TransferOp};
use dmc_compiler::plan::{BufferKind, Mode, Plan, Store};
use dmc_compiler::{check_plan, compile, CompileError, CompileOptions, PlanCheckError};
use dmc_runtime::compare::Batch;
use dmc_runtime::emu::EmuBackend;
use dmc_runtime::error::RuntimeError;
use dmc_runtime::{Backend, CpuBackend};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const MB: u64 = 1_000_000;

pub(crate) fn model(example: &str) -> dmc_grammar::model::Model {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(format!("{example}.dm"));
    let src = std::fs::read_to_string(&path).expect("read example");
    dmc_grammar::compile_source(&src, &path.display().to_string())
        .unwrap_or_else(|e| panic!("{example}: {e:?}"))
}

fn compile_at(
    example: &str,
    batch: Option<usize>,
    cap: Option<u64>,
    stream: bool,
) -> Result<Plan, CompileError> {
    compile_offload(example, batch, cap, stream, true)
}

pub(crate) fn compile_offload(
    example: &str,
    batch: Option<usize>,
    cap: Option<u64>,
    stream: bool,
    offload: bool,
) -> Result<Plan, CompileError> {
    compile(
        &model(example),
        &CompileOptions {
            batch,
            cap,
            stream,
            offload,
            verify: true,
            ..Default::default()
        },
    )
}

/// What training leaves: every loss, parameter and optimizer state tensor, as bits.
#[derive(Debug, PartialEq)]
pub(crate) struct Trained {
    pub(crate) losses: Vec<u32>,
    pub(crate) params: Vec<(String, Vec<u32>)>,
    pub(crate) states: Vec<(String, Vec<u32>)>,
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `steps` training steps of `plan` on backend `b` from seeded weights and batches (a learning
/// rate changing every step), with poison mode `poison`.
pub(crate) fn train(
    b: &mut dyn Backend,
    steps: usize,
    poison: bool,
) -> Result<Trained, RuntimeError> {
    let seed = 11;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let plan = b.plan().clone();
    let batches: Vec<_> = (0..steps).map(|_| Batch::random(&plan, &mut rng)).collect();
    b.set_poison(poison);
    b.init_params(seed)?;
    let mut losses = vec![];
    for (s, batch) in batches.iter().enumerate() {
        batch.feed(|n, d| b.set_input(n, d))?;
        b.set_learning_rate(plan.optimizer.lr() * [1.0, 0.5, 0.25][s % 3]);
        losses.push(b.run(s as u64 + 1, seed)?.to_bits());
    }
    let tensors = |v: dmc_runtime::backend::Params| {
        v.into_iter()
            .map(|(n, _, d)| (n, bits(&d)))
            .collect::<Vec<_>>()
    };
    Ok(Trained {
        losses,
        params: tensors(b.params()?),
        states: tensors(b.opt_states()?),
    })
}

pub(crate) fn cpu_train(plan: &Plan, steps: usize, poison: bool) -> Result<Trained, RuntimeError> {
    train(&mut CpuBackend::new(plan.clone())?, steps, poison)
}

fn host_bytes_of(plan: &Plan, kind: BufferKind) -> u64 {
    plan.buffers
        .iter()
        .filter(|b| b.store == Store::Host && b.kind == kind)
        .map(|b| b.bytes)
        .sum()
}

fn param_bytes(plan: &Plan) -> u64 {
    plan.params
        .iter()
        .map(|p| p.shape.iter().product::<usize>() as u64 * 4)
        .sum()
}

#[test]
fn seed_trains_under_256mb_and_128mb_bit_identical_to_the_resident_plan() {
    let resident = compile_at("seed", None, None, true).expect("resident plan");
    assert!(!resident.streams());
    let want = cpu_train(&resident, 5, false).expect("resident training");
    for cap in [256 * MB, 128 * MB] {
        let plan = compile_at("seed", None, Some(cap), true).expect("streamed plan");
        assert!(
            plan.arena_bytes <= cap,
            "arena {} > cap {cap}",
            plan.arena_bytes
        );
        let host = host_bytes_of(&plan, BufferKind::Parameter);
        assert!(
            host * 4 >= param_bytes(&plan) * 3 && host <= plan.host_bytes,
            "cap {cap}: {host} B of {} B of parameters in the host store",
            param_bytes(&plan)
        );
        let t = plan.transfer_totals();
        assert!(
            t.host_to_device >= host && t.device_to_host >= host,
            "{t:?}"
        );
        let got = cpu_train(&plan, 5, true).expect("streamed training");
        assert_eq!(
            got, want,
            "cap {cap}: training differs from the resident plan"
        );
    }
}

/// Caps below the smallest resident arena of mlp and deep_convnet (both below their parameters +
/// optimizer state) and resnet_small (Adam: two state tensors per parameter; its smallest working
/// set alone exceeds them), at batch 1 (at their own batches the activations alone exceed the
/// parameters).
const SMALL: [(&str, u64); 3] = [
    ("mlp", 1_880_000),
    ("resnet_small", 300_000),
    ("deep_convnet", 4_500_000),
];

#[test]
fn small_examples_stream_below_their_resident_floor_bit_identically() {
    for (example, cap) in SMALL {
        let resident_refused = compile_at(example, Some(1), Some(cap), false);
        assert!(
            matches!(
                resident_refused,
                Err(CompileError::CapExceeded { host: 0, .. })
            ),
            "{example}: resident at {cap}: {resident_refused:?}"
        );
        let plan = compile_at(example, Some(1), Some(cap), true).expect("streamed plan");
        assert!(plan.arena_bytes <= cap);
        let state: u64 = plan
            .opt_state
            .iter()
            .map(|p| p.shape.iter().product::<usize>() as u64 * 4)
            .sum();
        if example != "resnet_small" {
            assert!(
                cap < param_bytes(&plan) + state,
                "{example}: cap {cap} not below parameters + state"
            );
        }
        assert!(
            host_bytes_of(&plan, BufferKind::OptimizerState) > 0,
            "{example}"
        );
        let resident = compile_at(example, Some(1), None, true).expect("resident plan");
        let want = cpu_train(&resident, 5, false).expect("resident");
        let got = cpu_train(&plan, 5, true).expect("streamed");
        assert_eq!(got, want, "{example}: streamed training differs");
    }
    // every parameter and state tensor streamed, without prefetch: the smallest plan
    let mlp = compile_at("mlp", Some(1), Some(1_880_000), true).expect("mlp");
    let params = param_bytes(&mlp);
    assert!(
        mlp.arena_bytes < 2 * params,
        "mlp under its parameters + optimizer state ({} B): arena {}",
        2 * params,
        mlp.arena_bytes
    );
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn the_emulated_cuda_kernels_train_a_streamed_plan_like_the_resident_one() {
    for (example, cap) in &SMALL[..2] {
        let plan = compile_at(example, Some(1), Some(*cap), true).expect("streamed plan");
        let resident = compile_at(example, Some(1), None, true).expect("resident plan");
        let want =
            train(&mut EmuBackend::new(resident).expect("emulator"), 3, false).expect("resident");
        let got = train(&mut EmuBackend::new(plan).expect("emulator"), 3, true).expect("streamed");
        assert_eq!(got, want, "{example}: emulated streamed training differs");
    }
}

#[test]
fn below_the_smallest_cap_the_error_names_one_that_works() {
    let err = compile_at("mlp", Some(1), Some(1000), true).unwrap_err();
    let msg = err.to_string();
    let CompileError::CapExceeded { needed, host, .. } = err else {
        panic!("{err:?}")
    };
    assert!(host > 0, "{msg}");
    assert!(
        msg.contains("streamed") && msg.contains("--vram-cap"),
        "{msg}"
    );
    assert!(
        msg.contains(&dmc_compiler::report::thousands(needed)),
        "{msg}"
    );
    let plan = compile_at("mlp", Some(1), Some(needed), true).expect("the named cap works");
    assert!(plan.arena_bytes <= needed && plan.streams());
    assert!(compile_at("mlp", Some(1), Some(needed - 64), true).is_err());
}

/// The streamed resnet_small plan (Adam) and the index of its first copy of each direction.
fn streamed() -> (Plan, usize, usize) {
    let plan = compile_at("resnet_small", Some(1), Some(300_000), true).expect("streamed plan");
    // the first copies of a persistent home (a parameter or optimizer state tensor)
    let first = |op, home: usize| {
        (0..plan.steps.len()).find(|&s| {
            plan.transfer_op(s) == Some(op) && plan.buffers[plan.steps[s].args[home]].persistent
        })
    };
    let h2d = first(TransferOp::HostToDevice, 0).expect("a copy in");
    let d2h = first(TransferOp::DeviceToHost, 1).expect("a write-back");
    (plan, h2d, d2h)
}

/// The first step after `from` that reads `buffer`.
fn first_use(plan: &Plan, from: usize, buffer: usize) -> usize {
    (from + 1..plan.steps.len())
        .find(|&s| plan.steps[s].args.contains(&buffer))
        .expect("a use")
}

pub(crate) fn stream_error(plan: &Plan) -> String {
    match check_plan(plan) {
        Err(e @ PlanCheckError::Stream { .. }) => e.to_string(),
        other => panic!("expected a streaming error, got {other:?}"),
    }
}

pub(crate) fn has_nan(t: &Trained) -> bool {
    t.losses
        .iter()
        .chain(t.params.iter().flat_map(|(_, v)| v))
        .any(|&b| f32::from_bits(b).is_nan())
}

#[test]
fn a_window_read_before_its_copy_lands_is_rejected_and_poison_mode_catches_it() {
    let (mut plan, h2d, _) = streamed();
    check_plan(&plan).expect("the compiled plan is valid");
    let window = plan.steps[h2d].args[1];
    let use_at = first_use(&plan, h2d, window);
    assert_eq!(plan.steps[h2d].ready, Some(use_at));
    // the copy said to land one step after its window's first read
    plan.steps[h2d].ready = Some(use_at + 1);
    let msg = stream_error(&plan);
    assert!(msg.contains("before its copy lands"), "{msg}");
    // The runtime's own validation checks memory safety only: it runs. Copies at their step
    // train as before; in poison mode the copy lands late and the read sees NaN.
    let resident = compile_at("resnet_small", Some(1), None, true).expect("resident");
    let want = cpu_train(&resident, 2, false).expect("resident");
    assert_eq!(
        cpu_train(&plan, 2, false).expect("synchronous copies"),
        want
    );
    let poisoned = cpu_train(&plan, 2, true).expect("poison mode");
    assert!(
        has_nan(&poisoned),
        "poison mode did not catch the early read"
    );
}

/// Removes step `s`, renumbering the live ranges and copies' `ready` after it.
pub(crate) fn remove_step(plan: &mut Plan, s: usize) {
    plan.steps.remove(s);
    let shift = |i: usize| if i > s { i - 1 } else { i };
    for b in &mut plan.buffers {
        b.live = (shift(b.live.0), shift(b.live.1));
    }
    for st in &mut plan.steps {
        st.ready = st.ready.map(shift);
    }
}

#[test]
fn a_missing_write_back_is_rejected_and_poison_mode_catches_it() {
    let (mut plan, _, d2h) = streamed();
    let window = plan.steps[d2h].args[0];
    remove_step(&mut plan, d2h);
    let msg = stream_error(&plan);
    assert!(msg.contains("never written back"), "{msg}");
    match cpu_train(&plan, 2, true) {
        Err(RuntimeError::LostWriteBack { window: w, .. }) => {
            assert_eq!(w, plan.buffers[window].name)
        }
        other => panic!("poison mode: {other:?}"),
    }
    // without poison mode the update is silently lost: the weights differ
    let resident = compile_at("resnet_small", Some(1), None, true).expect("resident");
    let want = cpu_train(&resident, 2, false).expect("resident");
    assert_ne!(
        cpu_train(&plan, 2, false).expect("runs").params,
        want.params
    );
}

#[test]
fn a_write_back_landing_after_its_window_is_released_is_rejected() {
    let (mut plan, _, d2h) = streamed();
    let window = plan.steps[d2h].args[0];
    let released = plan.buffers[window].live.1;
    plan.steps[d2h].ready = Some(released + 2);
    let msg = stream_error(&plan);
    assert!(msg.contains("released"), "{msg}");
}

#[test]
fn only_copies_touch_the_host_store() {
    let (mut plan, h2d, _) = streamed();
    let (home, window) = (plan.steps[h2d].args[0], plan.steps[h2d].args[1]);
    let use_at = first_use(&plan, h2d, window);
    for a in plan.steps[use_at].args.iter_mut() {
        if *a == window {
            *a = home;
        }
    }
    assert!(matches!(
        check_plan(&plan),
        Err(PlanCheckError::HostArg { .. })
    ));
    match CpuBackend::new(plan) {
        Err(RuntimeError::BadPlan(m)) => assert!(m.contains("must be in the arena"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a kernel reading the host store was accepted"),
    }
}

#[test]
fn copies_are_plan_steps_with_their_kernels() {
    let (plan, _, _) = streamed();
    for (s, st) in plan.steps.iter().enumerate() {
        let k = &plan.kernels[st.kernel];
        match (&k.op, st.ready) {
            (Op::Transfer(_), Some(r)) => {
                assert!(r > s && r <= plan.steps.len());
                let (a, b) = (&plan.buffers[st.args[0]], &plan.buffers[st.args[1]]);
                assert_eq!(a.bytes, b.bytes);
                assert_ne!(a.store, b.store);
            }
            (Op::Transfer(_), None) => panic!("step {s}: a copy without `ready`"),
            (_, r) => assert_eq!(r, None, "step {s}"),
        }
    }
    // the plan reads back from JSON as it was written
    let json = serde_json::to_string(&plan).expect("json");
    assert_eq!(serde_json::from_str::<Plan>(&json).expect("parse"), plan);
    // eval plans stream too (read-only windows: no write-back)
    let eval = compile(
        &model("mlp"),
        &CompileOptions {
            mode: Mode::Eval,
            batch: Some(1),
            cap: Some(900_000),
            verify: true,
            ..Default::default()
        },
    )
    .expect("eval plan under the parameters' bytes");
    assert!(eval.streams() && eval.transfer_totals().device_to_host == 0);
}

#[test]
fn save_writes_the_host_stores_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    let run = |cap: &[&str], out: &Path| {
        let mut args = vec!["run", "examples/mlp.dm", "--batch", "1", "--steps", "3"];
        args.extend_from_slice(cap);
        args.extend(["--poison", "--save", out.to_str().expect("utf-8")]);
        let (code, stdout, stderr) = dmc(&args);
        assert_eq!(code, 0, "{stdout}{stderr}");
        stdout
    };
    let streamed = run(&["--vram-cap", "1880000"], &a);
    assert!(streamed.contains("streaming: host store"), "{streamed}");
    assert!(streamed.contains("the arena fits"), "{streamed}");
    run(&[], &b);
    assert_eq!(
        std::fs::read(&a).expect("a"),
        std::fs::read(&b).expect("b"),
        "the streamed run saved other weights"
    );
}

#[test]
fn dmc_plan_reports_the_host_store_and_the_copies() {
    let (code, out, err) = dmc(&["plan", "--vram-cap", "256MB", "examples/seed.dm"]);
    assert_eq!(code, 0, "{out}{err}");
    for want in [
        "fits the cap",
        "streaming: ",
        "live in the host store",
        "copies per step: ",
        "on PCIe 4.0 x16",
        "its copies: ",
    ] {
        assert!(out.contains(want), "no `{want}` in\n{out}");
    }
    let (code, out, err) = dmc(&[
        "plan",
        "--vram-cap",
        "256MB",
        "--no-stream",
        "examples/seed.dm",
    ]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("parameters") && err.contains("--vram-cap"),
        "{err}"
    );
}

/// deep_convnet's smallest cap, resident or streamed (the cap error names it), without offloading
/// activations.
fn deep_convnet_floor(stream: bool) -> u64 {
    match compile_offload("deep_convnet", None, Some(1), stream, false) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        other => panic!("{:?}", other.map(|p| p.arena_bytes)),
    }
}

#[test]
fn streaming_and_recomputation_fit_a_cap_together() {
    // below deep_convnet's smallest resident arena (recomputing as much as it can), streaming its
    // 4.5 MB of weights and momentum on top of recomputation still fits
    let (resident, streamed) = (deep_convnet_floor(false), deep_convnet_floor(true));
    assert!(streamed < resident, "{streamed} >= {resident}");
    let cap = (streamed + resident) / 2;
    let refused = compile_offload("deep_convnet", None, Some(cap), false, false);
    assert!(
        matches!(refused, Err(CompileError::CapExceeded { .. })),
        "{refused:?}"
    );
    let plan = compile_offload("deep_convnet", None, Some(cap), true, false)
        .expect("streamed + recomputed");
    assert!(plan.arena_bytes <= cap && plan.streams());
    assert!(dmc_compiler::recompute_flops(&plan) > 0, "no recomputation");
}

/// `dmc run` of `args` (in the repository root), which must succeed: its stdout.
fn run_ok(args: &[&str]) -> String {
    let (code, out, err) = dmc(args);
    assert_eq!(code, 0, "dmc {args:?}:\n{out}{err}");
    out
}

fn final_loss(out: &str) -> String {
    out.split("final loss ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no final loss in\n{out}"))
        .to_string()
}

#[test]
fn the_seed_network_runs_under_128mb_from_the_cli_as_resident() {
    let seed = ["run", "examples/seed.dm", "--steps", "2"];
    let resident = run_ok(&seed);
    let streamed = run_ok(&[&seed[..], &["--vram-cap", "128MB", "--poison"]].concat());
    assert_eq!(final_loss(&streamed), final_loss(&resident));
    // the arena as allocated (the counting allocator's measure) is under the cap
    assert!(streamed.contains("the arena fits"), "{streamed}");
    assert!(streamed.contains("streaming: host store"), "{streamed}");
}

#[test]
fn a_streamed_run_resumes_bit_identically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    let s = |p: &Path| p.to_str().expect("utf-8").to_string();
    // resnet_small: Adam, whose two moments per weight stream with it
    let common = [
        "run",
        "examples/resnet_small.dm",
        "--batch",
        "1",
        "--vram-cap",
        "300000",
        "--save-every",
        "2",
        "-q",
    ];
    run_ok(&[&common[..], &["--steps", "6", "--save", &s(&a)]].concat());
    run_ok(&[&common[..], &["--steps", "3", "--save", &s(&b)]].concat());
    run_ok(&[&common[..], &["--steps", "6", "--save", &s(&b), "--resume"]].concat());
    assert_eq!(
        std::fs::read(&a).expect("a"),
        std::fs::read(&b).expect("b"),
        "stopped after 3 steps and resumed: other weights than 6 steps in one run"
    );
}

#[test]
fn near_the_resident_floor_a_streamed_plan_is_chosen_when_predicted_faster() {
    // deep_convnet's smallest resident arena: every fused update in one-column chunks (each redoing
    // its im2col) and the most recomputation; streaming a few tensors leaves room for more
    let cap = deep_convnet_floor(false);
    let resident = compile_at("deep_convnet", None, Some(cap), false).expect("resident");
    let chosen = compile_offload("deep_convnet", None, Some(cap), true, false).expect("chosen");
    let rates = dmc_plan::cpu::CpuRates::nominal();
    let t = |p: &Plan| dmc_plan::cpu::plan_time(p, &rates).step_s;
    assert!(
        chosen.streams() && t(&chosen) < 0.5 * t(&resident),
        "chosen {} s (streams: {}), resident {} s",
        t(&chosen),
        chosen.streams(),
        t(&resident)
    );
    // Both render for a GPU: a fused bias gradient whose chunk sums the plan has no room for
    // (fitted without the split-K room) runs unsplit.
    for p in [&resident, &chosen] {
        dmc_codegen::render_plan(p, &dmc_codegen::CodegenOptions::default()).expect("render");
    }
}

/// Gradient accumulation (updates only on every 2nd run) and clip_norm's norm pass (two runs per
/// step, the first without updates) run the copies in every run: the same weights as resident
/// (the norm pass forced on both: held gradients sum the norm in another order).
#[test]
fn streamed_runs_with_accumulation_and_the_norm_pass_save_the_resident_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let net = |train: &str| {
        format!(
            "input x: [32]\ntarget y: int\nout = x |> dense(64, activation: relu) |> dense(10)\nloss cross_entropy(out, y)\ntrain {{ batch: 4, {train} }}\n"
        )
    };
    for (name, train, cap, method) in [
        (
            "accumulate",
            "optimizer: adam(lr: 0.01), accumulate: 2",
            "40000",
            &[][..],
        ),
        (
            "norm_pass",
            "optimizer: sgd(lr: 0.05, momentum: 0.9), clip_norm: 0.5",
            "28000",
            &["--clip-norm-method", "norm-pass"][..],
        ),
    ] {
        let src = dir.path().join(format!("{name}.dm"));
        std::fs::write(&src, net(train)).expect("write program");
        let (a, b) = (
            dir.path().join("a.safetensors"),
            dir.path().join("b.safetensors"),
        );
        let run = |extra: &[&str], out: &Path| {
            let mut args = vec!["run", src.to_str().expect("utf-8"), "--steps", "4"];
            args.extend_from_slice(method);
            args.extend_from_slice(extra);
            args.extend(["--save", out.to_str().expect("utf-8")]);
            run_ok(&args)
        };
        let streamed = run(&["--vram-cap", cap, "--poison"], &a);
        assert!(
            streamed.contains("streaming: host store"),
            "{name}: {streamed}"
        );
        run(&[], &b);
        assert!(
            std::fs::read(&a).expect("a") == std::fs::read(&b).expect("b"),
            "{name}: the streamed run saved other weights"
        );
    }
}

/// The GPT example (batch 1; without its `clip_norm`, whose capped plans run two passes a step)
/// below its smallest resident arena: its transformer blocks' weights, Adam state and activations
/// stream through windows, and training is bit-identical to the resident plan's, in poison mode.
#[test]
fn gpt_streams_below_its_resident_floor_bit_identically() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gpt.dm");
    let src = std::fs::read_to_string(path).expect("read gpt.dm");
    let src = src.replace(", clip_norm: 1.0", "");
    assert!(!src.contains("clip_norm"), "gpt.dm's train section changed");
    let m = dmc_grammar::compile_source(&src, "gpt.dm").expect("gpt.dm");
    let at = |cap: Option<u64>, stream: bool| {
        compile(
            &m,
            &CompileOptions {
                batch: Some(1),
                cap,
                stream,
                verify: true,
                ..Default::default()
            },
        )
    };
    let floor = match at(Some(1), false) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        r => panic!("gpt resident at 1 B: {:?}", r.map(|p| p.arena_bytes)),
    };
    let cap = floor * 7 / 10;
    let plan = at(Some(cap), true).expect("streamed gpt");
    check_plan(&plan).expect("plan check");
    assert!(plan.arena_bytes <= cap, "{} > {cap}", plan.arena_bytes);
    assert!(host_bytes_of(&plan, BufferKind::OptimizerState) > 0);
    let resident = at(None, true).expect("resident gpt");
    let want = cpu_train(&resident, 3, false).expect("resident");
    let got = cpu_train(&plan, 3, true).expect("streamed");
    assert_eq!(got, want, "streamed gpt training differs");
}
