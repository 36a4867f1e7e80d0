//! The independent plan checker accepts every fixture plan and catches hand-made corruptions.

use dmc_compiler::op::DType;
use dmc_compiler::plan::{Mode, Plan};
use dmc_compiler::testutil::*;
use dmc_compiler::{check_plan, compile, CompileOptions, PlanCheckError as E};

/// The plain plan (trivial placement, no fusion, no in-place rewriting): the corruptions below
/// index its steps and buffers.
fn plan() -> Plan {
    compile(
        &mlp(adam(1e-3)),
        &CompileOptions {
            mode: Mode::Train,
            verify: true,
            planner: dmc_compiler::PlannerKind::Trivial,
            fuse: false,
            inplace: false,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Every transient buffer live for the whole step (the trivial placer never overlaps them), so
/// reordering corruptions hit the ordering checks rather than the live-range check.
fn widened() -> Plan {
    let mut p = plan();
    let last = p.steps.len() - 1;
    for b in &mut p.buffers {
        b.live = (0, last);
    }
    check_plan(&p).unwrap();
    p
}

fn find(p: &Plan, label: &str) -> usize {
    p.steps.iter().position(|s| s.label == label).unwrap()
}

#[test]
fn accepts_every_fixture_plan() {
    for opt in [sgd(0.1), sgd_momentum(0.1, 0.9), adam(1e-3)] {
        for (name, m) in small_fixtures(opt) {
            for mode in [Mode::Train, Mode::Eval, Mode::Predict] {
                let p = compile(
                    &m,
                    &CompileOptions {
                        mode,
                        verify: false,
                        ..Default::default()
                    },
                )
                .unwrap();
                check_plan(&p).unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
            }
        }
    }
}

#[test]
fn catches_overlap() {
    let mut p = plan();
    p.buffers[1].offset = p.buffers[0].offset; // two parameters on the same bytes
    assert!(
        matches!(check_plan(&p), Err(E::Overlap { a: 0, b: 1, .. })),
        "{:?}",
        check_plan(&p)
    );
    // Transient buffers overlapping while both live.
    let mut p = plan();
    let (a, b) = (p.steps[0].args[3], p.steps[1].args[1]); // dense_1's y and relu's y
    p.buffers[b].offset = p.buffers[a].offset;
    assert!(
        matches!(check_plan(&p), Err(E::Overlap { .. })),
        "{:?}",
        check_plan(&p)
    );
}

#[test]
fn accepts_overlap_of_disjoint_live_ranges() {
    let mut p = plan();
    let ws = p
        .buffers
        .iter()
        .filter(|b| b.live.0 == b.live.1 && !b.persistent && b.live.0 > 0)
        .count();
    let _ = ws;
    // The first step's output dies long before the last gradient is produced? Find two
    // transient buffers with disjoint ranges and fit the smaller inside the larger.
    let ids: Vec<usize> = (0..p.buffers.len())
        .filter(|i| {
            !p.buffers[*i].persistent && p.buffers[*i].kind != dmc_compiler::plan::BufferKind::Input
        })
        .collect();
    let mut done = false;
    'outer: for &i in &ids {
        for &j in &ids {
            let (a, b) = (&p.buffers[i], &p.buffers[j]);
            if i != j
                && a.live.1 < b.live.0
                && b.bytes <= a.bytes
                && j != p.loss
                && j != p.output.buffer
            {
                p.buffers[j].offset = p.buffers[i].offset;
                done = true;
                break 'outer;
            }
        }
    }
    assert!(done);
    check_plan(&p).unwrap();
}

#[test]
fn catches_out_of_arena_and_misalignment() {
    let mut p = plan();
    p.buffers[3].offset = p.arena_bytes;
    assert!(matches!(
        check_plan(&p),
        Err(E::OutOfArena { buffer: 3, .. })
    ));
    let mut p = plan();
    p.buffers[3].offset += 4;
    assert!(matches!(
        check_plan(&p),
        Err(E::Misaligned { buffer: 3, .. })
    ));
}

#[test]
fn catches_wrong_arg_count() {
    let mut p = plan();
    p.steps[0].args.pop();
    assert!(
        matches!(
            check_plan(&p),
            Err(E::ArgCount {
                step: 0,
                expected: 4,
                got: 3,
                ..
            })
        ),
        "{:?}",
        check_plan(&p)
    );
}

#[test]
fn catches_wrong_dtype_and_size() {
    let mut p = plan();
    let b = p.steps[0].args[3];
    p.buffers[b].dtype = DType::I32;
    assert!(
        matches!(check_plan(&p), Err(E::ArgMismatch { what: "dtype", .. })),
        "{:?}",
        check_plan(&p)
    );
    let mut p = plan();
    let k = p.steps[0].kernel;
    p.kernels[k].arg_shapes[3] = vec![4, 17];
    assert!(
        matches!(check_plan(&p), Err(E::ArgMismatch { what: "size", .. })),
        "{:?}",
        check_plan(&p)
    );
}

#[test]
fn catches_read_before_write() {
    let mut p = widened();
    p.steps.swap(0, 1); // relu before the dense layer that produces its input
    assert!(
        matches!(check_plan(&p), Err(E::ReadBeforeWrite { step: 0, .. })),
        "{:?}",
        check_plan(&p)
    );
}

#[test]
fn catches_read_after_in_place_update() {
    let mut p = widened();
    let u = find(&p, "dense_1.weight update");
    let fwd = p.steps[find(&p, "dense_1 forward")].clone();
    p.steps.insert(u + 1, fwd); // reads dense_1.weight after it was overwritten
    let last = p.steps.len() - 1;
    for b in &mut p.buffers {
        b.live = (0, last);
    }
    assert!(
        matches!(check_plan(&p), Err(E::ReadAfterInPlace { .. })),
        "{:?}",
        check_plan(&p)
    );
}

#[test]
fn catches_use_outside_live_range() {
    let mut p = plan();
    let b = p.steps[1].args[0]; // relu reads dense_1's output
    p.buffers[b].live = (0, 0);
    assert!(
        matches!(check_plan(&p), Err(E::OutsideLive { step: 1, .. })),
        "{:?}",
        check_plan(&p)
    );
}

#[test]
fn catches_bad_bindings_and_fresh_writes_to_parameters() {
    let mut p = plan();
    p.params[0].shape = vec![1, 2];
    assert!(matches!(check_plan(&p), Err(E::Binding { .. })));
    let mut p = widened();
    let w = p.params[0].buffer;
    p.steps[0].args[3] = w; // dense_1 writes y into its own weight's buffer
    assert!(check_plan(&p).is_err());
}

/// A transient buffer moved onto a parameter's bytes (the checker takes the buffers held for the
/// whole step apart from the others).
#[test]
fn catches_a_transient_on_a_parameter() {
    let mut p = plan();
    let w = p.params[1].buffer;
    let y = p.steps[0].args[3]; // dense_1's y, transient
    assert!(!p.buffers[y].persistent && p.buffers[w].persistent);
    p.buffers[y].offset = p.buffers[w].offset;
    let (a, b) = (w.min(y), w.max(y));
    assert!(
        matches!(check_plan(&p), Err(E::Overlap { a: x, b: z, .. }) if (x, z) == (a, b)),
        "{:?}",
        check_plan(&p)
    );
}

/// Some pair of simultaneously live buffers sharing a byte, by comparing every pair (the
/// reference for the checker's sweep).
fn naive_overlaps(p: &Plan) -> Vec<(usize, usize)> {
    let mut out = vec![];
    for (i, a) in p.buffers.iter().enumerate() {
        for (j, b) in p.buffers.iter().enumerate().skip(i + 1) {
            let (ra, rb) = (p.held(a), p.held(b));
            let in_time = ra.0 <= rb.1 && rb.0 <= ra.1;
            let in_bytes = a.bytes > 0
                && b.bytes > 0
                && a.offset < b.offset + b.bytes
                && b.offset < a.offset + a.bytes;
            if in_time && in_bytes {
                out.push((i, j));
            }
        }
    }
    out
}

mod overlaps_like_the_pairwise_reference {
    use super::*;
    use dmc_compiler::plan::ALIGN;
    use proptest::prelude::*;

    /// The best-fit plan (buffers sharing bytes at disjoint times).
    fn placed() -> Plan {
        compile(&mlp(adam(1e-3)), &CompileOptions::default()).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Buffers moved to other aligned offsets inside the arena: the checker reports an
        /// overlap iff one pair overlaps, and then one of those pairs.
        #[test]
        fn after_moving_buffers(moves in proptest::collection::vec((0usize..64, 0usize..64, 0u64..4), 1..4)) {
            let mut p = placed();
            check_plan(&p).unwrap();
            let nb = p.buffers.len();
            for (i, j, k) in moves {
                let (i, j) = (i % nb, j % nb);
                let off = p.buffers[j].offset + k * ALIGN;
                if off + p.buffers[i].bytes <= p.arena_bytes {
                    p.buffers[i].offset = off;
                }
            }
            let want = naive_overlaps(&p);
            match check_plan(&p) {
                Err(E::Overlap { a, b, .. }) => prop_assert!(want.contains(&(a, b)), "{a} {b} not in {want:?}"),
                other => prop_assert!(want.is_empty(), "{other:?} but {want:?} overlap"),
            }
        }
    }
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Arbitrary field corruptions: the checker answers, it never panics.
        #[test]
        fn on_corrupted_plans(which in 0usize..9, i in 0usize..64, v in any::<u64>()) {
            let mut p = plan();
            let nb = p.buffers.len();
            let ns = p.steps.len();
            match which {
                0 => p.buffers[i % nb].offset = v,
                1 => p.buffers[i % nb].bytes = v,
                2 => p.buffers[i % nb].live = (v as usize, i),
                3 => p.arena_bytes = v,
                4 => p.steps[i % ns].args[0] = v as usize,
                5 => p.steps[i % ns].kernel = v as usize,
                6 => p.loss = v as usize,
                7 => { let k = p.steps[i % ns].kernel; p.kernels[k].arg_shapes[0] = vec![v as usize, usize::MAX]; }
                _ => p.output.buffer = v as usize,
            }
            let _ = check_plan(&p);
        }
    }
}

/// `check_plan_alongside` (and `compile_explained_alongside`, which the CLI's `plan` uses to build
/// the memory report while the checker runs): `next`'s result when the plan passes, the checker's
/// own error when it does not (whatever `next` returned, or if it panicked), for a small plan
/// (checked first) and a large one (checked on another thread).
#[test]
fn alongside_the_check_the_check_decides() {
    use dmc_compiler::report::memory_report;
    use dmc_compiler::{check_plan_alongside, compile_explained_alongside};
    let chain = |layers: usize| {
        let src = format!(
            "input x: [4]\ntarget y: [4]\nout = x |> repeat {layers} {{ dense(4) }}\n\
             loss mse(out, y)\ntrain {{ batch: 1, optimizer: sgd(lr: 0.01) }}\n"
        );
        dmc_grammar::compile_source(&src, "chain.dm").unwrap()
    };
    let opts = CompileOptions {
        verify: true,
        ..Default::default()
    };
    for (m, large) in [(mlp(adam(1e-3)), false), (chain(2000), true)] {
        let p = compile(&m, &opts).unwrap();
        // More buffers than the checker's parallel threshold, or fewer.
        assert_eq!(p.buffers.len() > 4096, large, "{} buffers", p.buffers.len());
        assert_eq!(
            check_plan_alongside(&p, |q| q.buffers.len()),
            Ok(p.buffers.len())
        );
        let (q, info, report) = compile_explained_alongside(&m, &opts, memory_report).unwrap();
        assert_eq!(q, p);
        assert!(info.is_none());
        assert_eq!(report, memory_report(&p));

        // Two parameters on the same bytes.
        let mut bad = p.clone();
        bad.buffers[1].offset = bad.buffers[0].offset;
        let want = check_plan(&bad).unwrap_err();
        assert!(matches!(want, E::Overlap { .. }), "{want:?}");
        assert_eq!(check_plan_alongside(&bad, |_| 7), Err(want.clone()));
        let panicked = check_plan_alongside(&bad, |_| -> usize { panic!("on a bad plan") });
        assert_eq!(panicked, Err(want));
    }
}
