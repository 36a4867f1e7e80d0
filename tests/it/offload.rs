//! Offloading activations (`compiler/src/stream.rs`): an activation held from its forward to its
//! backward may live in the host store in between (written back after its producer's cluster,
//! copied in again for the backward) instead of being kept in the arena or recomputed. Training
//! stays bit-identical to the resident plan in poison mode (copies landing as late as the plan
//! allows, homes holding NaN until their write-back lands); the checker and poison mode both catch
//! a missing or late write-back; and the cap fitter prefers it to recomputation when the CPU time
//! model predicts it faster, which is what lowers deep_convnet's floor and its time there.

use dmc_compiler::plan::{Plan, Store};
use dmc_compiler::{check_plan, recompute_flops, CompileError};
use dmc_plan::cpu::{plan_time, CpuRates};

use crate::common::dmc;
use crate::streaming::{compile_offload, cpu_train, has_nan, remove_step, stream_error};

/// The offloaded activations' homes of `plan`.
fn offloaded(plan: &Plan) -> Vec<usize> {
    plan.buffers
        .iter()
        .filter(|b| b.store == Store::Host && !b.persistent)
        .map(|b| b.id)
        .collect()
}

/// `example`'s smallest cap at `batch` (the cap error names it), with or without offloading.
fn floor(example: &str, batch: usize, offload: bool) -> u64 {
    match compile_offload(example, Some(batch), Some(1), true, offload) {
        Err(CompileError::CapExceeded { needed, .. }) => needed,
        other => panic!("{example}: {:?}", other.map(|p| p.arena_bytes)),
    }
}

/// `example` at its smallest cap with offloading.
fn at_floor(example: &str, batch: usize) -> Plan {
    let cap = floor(example, batch, true);
    compile_offload(example, Some(batch), Some(cap), true, true).expect("the floor's plan")
}

#[test]
fn offloaded_activations_train_bit_identically_in_poison_mode() {
    // a chain, residual blocks, batchnorm (whose backward writes in place) and depthwise convs
    for (example, batch) in [
        ("deep_convnet", 1),
        ("resnet_small", 2),
        ("mobilenet", 2),
        ("bn_cnn", 2),
    ] {
        let plan = at_floor(example, batch);
        assert!(!offloaded(&plan).is_empty(), "{example}: nothing offloaded");
        check_plan(&plan).expect("valid");
        let resident = compile_offload(example, Some(batch), None, true, true).expect("resident");
        let want = cpu_train(&resident, 3, false).expect("resident");
        let got = cpu_train(&plan, 3, true).expect("offloaded, poison mode");
        assert_eq!(got, want, "{example}: offloaded training differs");
    }
}

/// The first write-back of an offloaded activation's home in `plan`.
fn first_activation_write_back(plan: &Plan) -> usize {
    let homes = offloaded(plan);
    (0..plan.steps.len())
        .find(|&s| {
            plan.transfer_op(s) == Some(dmc_compiler::op::TransferOp::DeviceToHost)
                && homes.contains(&plan.steps[s].args[1])
        })
        .expect("an activation written back")
}

#[test]
fn a_missing_activation_write_back_is_rejected_and_poison_mode_catches_it() {
    let mut plan = at_floor("resnet_small", 2);
    let d2h = first_activation_write_back(&plan);
    remove_step(&mut plan, d2h);
    let msg = stream_error(&plan);
    assert!(
        msg.contains("before a write-back of it has landed"),
        "{msg}"
    );
    // the runtime runs it (memory-safe); in poison mode the copy in reads the NaN home
    let poisoned = cpu_train(&plan, 2, true).expect("runs");
    assert!(
        has_nan(&poisoned),
        "poison mode did not catch the lost activation"
    );
}

#[test]
fn deep_convnet_offloads_at_its_floor_instead_of_recomputing() {
    let rates = CpuRates::nominal();
    let t = |p: &Plan| plan_time(p, &rates).step_s;
    let uncapped = compile_offload("deep_convnet", None, None, true, true).expect("uncapped");
    let (with, without) = (
        floor("deep_convnet", 32, true),
        floor("deep_convnet", 32, false),
    );
    assert!(
        with <= without,
        "offloading raised the floor: {with} > {without}"
    );
    // under the peer's 177 MB (issue 21) with room to spare
    assert!(with < 170_000_000, "{with}");
    let plan = at_floor("deep_convnet", 32);
    assert_eq!(recompute_flops(&plan), 0, "recomputes at its floor");
    let recomputing = compile_offload("deep_convnet", None, Some(without), true, false)
        .expect("the floor without offloading");
    assert!(recompute_flops(&recomputing) > 0);
    // predicted: the offloading floor near the uncapped step, the recomputing one far above
    assert!(
        t(&plan) < 1.25 * t(&uncapped) && t(&plan) < 0.5 * t(&recomputing),
        "offloaded {:.2} s, recomputing {:.2} s, uncapped {:.2} s",
        t(&plan),
        t(&recomputing),
        t(&uncapped)
    );
}

#[test]
fn dmc_plan_reports_offloaded_activations_and_no_offload_keeps_them() {
    let (code, out, err) = dmc(&["plan", "examples/deep_convnet.dm", "--vram-cap", "150MB"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("activations offloaded between forward and backward"),
        "{out}"
    );
    assert!(out.contains("recomputation: none needed"), "{out}");
    let (code, out, err) = dmc(&[
        "plan",
        "examples/deep_convnet.dm",
        "--vram-cap",
        "150MB",
        "--no-offload",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("activations offloaded"), "{out}");
    assert!(out.contains("recomput"), "{out}");
}
