//! The counting allocator, installed as this test binary's global allocator, and the executor's
//! promise: no allocation proportional to the model or the batch during a step.

use dmc_runtime::alloc::{self, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn counts_current_and_peak() {
    // tests in this binary run one at a time (a single test), so the counters are ours
    let before = GLOBAL.current();
    let v = vec![1u8; 10 << 20];
    assert!(GLOBAL.current() >= before + (10 << 20));
    assert!(GLOBAL.peak() >= before + (10 << 20));
    drop(v);
    assert!(GLOBAL.current() < before + (1 << 20));
    GLOBAL.reset_peak();
    assert!(alloc::peak() < before + (1 << 20));
    let mut v = Vec::<u8>::with_capacity(1 << 20);
    v.resize(8 << 20, 0); // realloc grows
    assert!(alloc::peak() >= before + (8 << 20));
    drop(v);

    // the arena is one allocation of the planned size
    use dmc_plan::op::{DType, ElementwiseOp, LossOp, Op};
    use dmc_plan::plan::*;
    let n = 1 << 20; // 4 MiB buffers
    let mk = |id: usize, name: &str, kind, offset: u64, live| Buffer {
        store: Default::default(),
        id,
        name: name.into(),
        bytes: 4 * n as u64,
        dtype: DType::F32,
        kind,
        offset,
        live,
        persistent: false,
        layer: String::new(),
    };
    let sh = vec![n];
    let plan = Plan {
        host_bytes: 0,
        format_version: FORMAT_VERSION,
        mode: Mode::Train,
        batch: 1,
        arena_bytes: 12 * n as u64 + 64,
        buffers: vec![
            mk(0, "a", BufferKind::Input, 0, (0, 1)),
            mk(1, "b", BufferKind::Input, 4 * n as u64, (0, 1)),
            mk(2, "y", BufferKind::Activation, 8 * n as u64, (0, 1)),
            Buffer {
                store: Default::default(),
                id: 3,
                name: "loss".into(),
                bytes: 4,
                dtype: DType::F32,
                kind: BufferKind::Activation,
                offset: 12 * n as u64,
                live: (1, 1),
                persistent: false,
                layer: String::new(),
            },
        ],
        kernels: vec![
            Kernel {
                id: 0,
                name: "add".into(),
                op: Op::Elementwise(ElementwiseOp::Add),
                arg_shapes: vec![sh.clone(); 3],
                signature: Op::Elementwise(ElementwiseOp::Add).signature(),
            },
            Kernel {
                id: 1,
                name: "mse".into(),
                op: Op::Loss(LossOp::MseLoss { weight: 1.0 }),
                arg_shapes: vec![sh.clone(), sh.clone(), vec![1]],
                signature: Op::Loss(LossOp::MseLoss { weight: 1.0 }).signature(),
            },
        ],
        steps: vec![
            Step {
                ready: None,
                kernel: 0,
                args: vec![0, 1, 2],
                label: "add".into(),
                phase: StepPhase::Forward,
            },
            Step {
                ready: None,
                kernel: 1,
                args: vec![2, 1, 3],
                label: "loss".into(),
                phase: StepPhase::Loss,
            },
        ],
        inputs: vec![IoBinding {
            name: "a".into(),
            buffer: 0,
            shape: sh.clone(),
            dtype: DType::F32,
        }],
        targets: vec![IoBinding {
            name: "b".into(),
            buffer: 1,
            shape: sh.clone(),
            dtype: DType::F32,
        }],
        params: vec![],
        opt_state: vec![],
        loss: 3,
        output: IoBinding {
            name: "y".into(),
            buffer: 2,
            shape: sh,
            dtype: DType::F32,
        },
        optimizer: Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            clip_value: None,
            clip_norm: None,
        },
        schedule: Default::default(),
        lower_bound_bytes: 0,
        placement_strategy: "trivial".into(),
        clip_norm: None,
        accumulate: 1,
        ranks: 1,
        precision: Default::default(),
    };
    let arena = plan.arena_bytes as usize;
    let before = alloc::current();
    let mut be = dmc_runtime::CpuBackend::new(plan).unwrap();
    assert!(alloc::current() >= before + arena);
    let a = vec![1.0f32; n];
    be.set_input("a", dmc_runtime::InputData::F32(&a)).unwrap();
    be.set_input("b", dmc_runtime::InputData::F32(&a)).unwrap();
    be.run(1, 0).unwrap(); // warm up (rayon's pool)
    let base = alloc::current();
    alloc::reset_peak();
    let loss = be.run(2, 0).unwrap();
    assert_eq!(loss, 1.0);
    // 12 MiB of buffers touched; the step itself allocates (almost) nothing
    assert!(
        alloc::peak() - base < 256 << 10,
        "a step allocated {} bytes",
        alloc::peak() - base
    );
    drop(be);

    // Last (it is for good): once stopped, allocations and frees leave both counters alone.
    assert!(alloc::counting());
    alloc::stop_counting();
    assert!(!alloc::counting());
    let (current, peak) = (alloc::current(), alloc::peak());
    let big = vec![1u8; 64 << 20];
    assert_eq!((alloc::current(), alloc::peak()), (current, peak));
    drop(big);
    let small: Vec<Vec<u8>> = (0..1000).map(|i| vec![0u8; i]).collect();
    drop(small);
    assert_eq!((alloc::current(), alloc::peak()), (current, peak));
}
