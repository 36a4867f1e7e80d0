//! The schedule: in-place hazards respected, forward in program order, updates early.

use dmc_compiler::op::{DenseOp, Op, Role};
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::testutil::*;
use dmc_compiler::{compile, CompileOptions};

fn plan(m: &dmc_grammar::model::Model) -> Plan {
    compile(
        m,
        &CompileOptions {
            mode: Mode::Train,
            verify: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn step(p: &Plan, label: &str) -> usize {
    p.steps
        .iter()
        .position(|s| s.label == label)
        .unwrap_or_else(|| panic!("no step `{label}`"))
}

#[test]
fn dense_bwd_data_runs_before_the_weight_update() {
    let p = plan(&mlp(sgd(0.1)));
    // dense_2's dx = dy w^T reads dense_2.weight; the update overwrites it in place.
    let dx = p
        .steps
        .iter()
        .position(|s| {
            matches!(
                p.kernels[s.kernel].op,
                Op::Dense(DenseOp::DenseBwdData { .. })
            ) && s.args[1] == p.params[2].buffer
        })
        .unwrap();
    assert_eq!(p.params[2].name, "dense_2.weight");
    assert!(dx < step(&p, "dense_2.weight update"));
}

#[test]
fn every_reader_of_an_in_place_buffer_runs_before_the_writer() {
    let mut models: Vec<_> = small_fixtures(adam(1e-3))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    models.push(seed());
    for m in models {
        let p = plan(&m);
        for (s, st) in p.steps.iter().enumerate() {
            let sig = &p.kernels[st.kernel].signature.params;
            for (b, sp) in st.args.iter().zip(sig) {
                // Persistent buffers: an in-place write of a transient buffer makes a new value
                // that later steps read (in-place elementwise ops).
                if sp.role == Role::InOut && p.buffers[*b].persistent {
                    for (t, other) in p.steps.iter().enumerate() {
                        if t != s && other.args.contains(b) {
                            assert!(
                                t < s,
                                "step {t} `{}` touches buffer {b} after `{}`",
                                other.label,
                                st.label
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn forward_in_program_order_then_updates_right_after_their_gradients() {
    let m = mlp(sgd(0.1));
    let p = compile(
        &m,
        &CompileOptions {
            verify: true,
            fuse: false,
            // in place, a ready elementwise op that frees more bytes may go first
            inplace: false,
            ..Default::default()
        },
    )
    .unwrap();
    let fwd: Vec<usize> = m
        .nodes
        .iter()
        .map(|n| step(&p, &format!("{} forward", n.name)))
        .collect();
    assert!(fwd.windows(2).all(|w| w[0] < w[1]), "{fwd:?}");
    for prm in &p.params {
        let u = step(&p, &format!("{} update", prm.name));
        let g = step(&p, &format!("grad {}", prm.name));
        assert_eq!(u, g + 1, "{} update should follow its gradient", prm.name);
    }
}
