//! The executor on small hand-built plans: training makes progress, bindings and errors behave,
//! poison mode is silent for a correct plan and loud for a wrong one.

use dmc_plan::op::{
    ConvGeom, ConvOp, DType, DenseOp, ElementwiseOp, LossOp, Op, OptimOp, PoolGeom, PoolOp,
    UnaryKind, UpdateRule,
};
use dmc_plan::plan::{
    Buffer, BufferKind, Init, IoBinding, Kernel, Mode, Optimizer, ParamBinding, Plan, Step,
    FORMAT_VERSION,
};
use dmc_runtime::{CpuBackend, InputData, RuntimeError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A tiny plan builder: every buffer gets a fresh 64-aligned offset (no reuse), live ranges are
/// derived from the steps that use the buffers.
#[derive(Default)]
struct Pb {
    bufs: Vec<Buffer>,
    kernels: Vec<Kernel>,
    steps: Vec<Step>,
    off: u64,
    params: Vec<ParamBinding>,
    opt_state: Vec<ParamBinding>,
    inputs: Vec<IoBinding>,
    targets: Vec<IoBinding>,
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

impl Pb {
    fn buf(&mut self, name: &str, n: usize, dtype: DType, kind: BufferKind) -> usize {
        let id = self.bufs.len();
        let bytes = (n * dtype.size()) as u64;
        let persistent = matches!(kind, BufferKind::Parameter | BufferKind::OptimizerState);
        self.bufs.push(Buffer {
            store: Default::default(),
            id,
            name: name.into(),
            bytes,
            dtype,
            kind,
            offset: self.off,
            live: (0, 0),
            persistent,
            layer: String::new(),
        });
        self.off += bytes.div_ceil(64) * 64;
        id
    }
    fn act(&mut self, name: &str, n: usize) -> usize {
        self.buf(name, n, DType::F32, BufferKind::Activation)
    }
    fn grad(&mut self, name: &str, n: usize) -> usize {
        self.buf(name, n, DType::F32, BufferKind::Gradient)
    }
    fn param(&mut self, name: &str, shape: &[usize], init: Init) -> usize {
        let id = self.buf(name, numel(shape), DType::F32, BufferKind::Parameter);
        self.params.push(ParamBinding {
            name: name.into(),
            buffer: id,
            shape: shape.to_vec(),
            init,
            shard: None,
        });
        id
    }
    fn opt(&mut self, name: &str, shape: &[usize]) -> usize {
        let id = self.buf(name, numel(shape), DType::F32, BufferKind::OptimizerState);
        self.opt_state.push(ParamBinding {
            name: name.into(),
            buffer: id,
            shape: shape.to_vec(),
            init: Init::Zeros,
            shard: None,
        });
        id
    }
    fn input(&mut self, name: &str, shape: &[usize], dtype: DType, target: bool) -> usize {
        let id = self.buf(name, numel(shape), dtype, BufferKind::Input);
        let b = IoBinding {
            name: name.into(),
            buffer: id,
            shape: shape.to_vec(),
            dtype,
        };
        if target {
            self.targets.push(b);
        } else {
            self.inputs.push(b);
        }
        id
    }
    fn step(&mut self, op: Op, shapes: &[&[usize]], args: &[usize], label: &str) {
        let arg_shapes: Vec<Vec<usize>> = shapes.iter().map(|s| s.to_vec()).collect();
        let kernel = match self
            .kernels
            .iter()
            .position(|k| k.op == op && k.arg_shapes == arg_shapes)
        {
            Some(k) => k,
            None => {
                let id = self.kernels.len();
                self.kernels.push(Kernel {
                    id,
                    name: format!("{}_{id}", op.kind_name()),
                    signature: op.signature(),
                    op,
                    arg_shapes,
                });
                id
            }
        };
        self.steps.push(Step {
            ready: None,
            kernel,
            args: args.to_vec(),
            label: label.into(),
            phase: Default::default(),
        });
    }
    fn finish(
        mut self,
        loss: usize,
        output: usize,
        out_shape: &[usize],
        optimizer: Optimizer,
    ) -> Plan {
        let last = self.steps.len() - 1;
        for b in &mut self.bufs {
            if b.persistent {
                b.live = (0, last);
                continue;
            }
            let used: Vec<usize> = self
                .steps
                .iter()
                .enumerate()
                .filter(|(_, s)| s.args.contains(&b.id))
                .map(|(i, _)| i)
                .collect();
            let lo = if b.kind == BufferKind::Input {
                0
            } else {
                used[0]
            };
            b.live = (lo, *used.last().unwrap());
        }
        Plan {
            host_bytes: 0,
            format_version: FORMAT_VERSION,
            mode: Mode::Train,
            batch: 0,
            arena_bytes: self.off,
            buffers: self.bufs,
            kernels: self.kernels,
            steps: self.steps,
            inputs: self.inputs,
            targets: self.targets,
            params: self.params,
            opt_state: self.opt_state,
            loss,
            output: IoBinding {
                name: "output".into(),
                buffer: output,
                shape: out_shape.to_vec(),
                dtype: DType::F32,
            },
            optimizer,
            schedule: Default::default(),
            lower_bound_bytes: 0,
            placement_strategy: "trivial".into(),
            accumulate: 1,
            ranks: 1,
            precision: Default::default(),
            clip_norm: None,
        }
    }
}

const LR: f32 = 0.1;
const MOM: f32 = 0.5;

/// x[4,3] -> Dense(bias) -> MSE vs t[4,2]; backward; SGD with momentum.
fn linear_plan() -> Plan {
    let mut p = Pb::default();
    let x = p.input("x", &[4, 3], DType::F32, false);
    let t = p.input("t", &[4, 2], DType::F32, true);
    let w = p.param(
        "fc.weight",
        &[3, 2],
        Init::GlorotUniform {
            fan_in: 3,
            fan_out: 2,
        },
    );
    let b = p.param("fc.bias", &[2], Init::Zeros);
    let wv = p.opt("fc.weight.momentum", &[3, 2]);
    let bv = p.opt("fc.bias.momentum", &[2]);
    let y = p.act("y", 8);
    let loss = p.act("loss", 1);
    let dy = p.grad("dy", 8);
    let dw = p.grad("dw", 6);
    let db = p.grad("db", 2);
    p.step(
        Op::Dense(DenseOp::Dense {
            bias: true,
            epi: Default::default(),
        }),
        &[&[4, 3], &[3, 2], &[2], &[4, 2]],
        &[x, w, b, y],
        "fc forward",
    );
    p.step(
        Op::Loss(LossOp::MseLoss { weight: 1.0 }),
        &[&[4, 2], &[4, 2], &[1]],
        &[y, t, loss],
        "loss",
    );
    p.step(
        Op::Loss(LossOp::MseLossBwd { weight: 1.0 }),
        &[&[4, 2], &[4, 2], &[4, 2]],
        &[y, t, dy],
        "loss backward",
    );
    p.step(
        Op::Dense(DenseOp::DenseBwdWeight),
        &[&[4, 3], &[4, 2], &[3, 2]],
        &[x, dy, dw],
        "fc dw",
    );
    p.step(
        Op::Optim(OptimOp::BiasGrad),
        &[&[4, 2], &[2]],
        &[dy, db],
        "fc db",
    );
    let sgd = Op::Optim(OptimOp::Update {
        summed: false,
        shards: 1,
        keep_rows: false,
        rule: UpdateRule::Sgd {
            lr: LR,
            momentum: MOM,
            weight_decay: 0.0,
            nesterov: false,
            clip_value: None,
            clip_norm: None,
        },
        zero_grad: false,
    });
    p.step(
        sgd.clone(),
        &[&[3, 2], &[3, 2], &[3, 2]],
        &[w, dw, wv],
        "fc.weight update",
    );
    p.step(sgd, &[&[2], &[2], &[2]], &[b, db, bv], "fc.bias update");
    let opt = Optimizer::Sgd {
        lr: LR,
        momentum: MOM,
        weight_decay: 0.0,
        nesterov: false,
        clip_value: None,
        clip_norm: None,
    };
    p.finish(loss, y, &[4, 2], opt)
}

struct Data {
    x: Vec<f32>,
    t: Vec<f32>,
}

fn linear_data() -> Data {
    let mut r = ChaCha8Rng::seed_from_u64(5);
    let x: Vec<f32> = (0..12).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let wt = [0.5f32, -1.0, 2.0, 0.3, -0.7, 1.1];
    let bt = [0.2f32, -0.4];
    let mut t = vec![0.0; 8];
    for i in 0..4 {
        for j in 0..2 {
            t[i * 2 + j] = bt[j] + (0..3).map(|k| x[i * 3 + k] * wt[k * 2 + j]).sum::<f32>();
        }
    }
    Data { x, t }
}

/// Runs `steps` training steps, feeding the batch before each; returns the losses.
fn train(be: &mut CpuBackend, d: &Data, steps: u64) -> Vec<f32> {
    (1..=steps)
        .map(|s| {
            be.set_input("x", InputData::F32(&d.x)).unwrap();
            be.set_input("t", InputData::F32(&d.t)).unwrap();
            be.run(s, 0).unwrap()
        })
        .collect()
}

#[test]
fn linear_regression_trains() {
    let d = linear_data();
    let mut be = CpuBackend::new(linear_plan()).unwrap();
    be.init_params(42);
    // the first loss equals a hand computation from the initial parameters
    let w = be.param("fc.weight").unwrap().to_vec();
    let b = be.param("fc.bias").unwrap().to_vec();
    assert!(b.iter().all(|&v| v == 0.0));
    let mut want = 0.0f64;
    for i in 0..4 {
        for j in 0..2 {
            let y = b[j] as f64
                + (0..3)
                    .map(|k| d.x[i * 3 + k] as f64 * w[k * 2 + j] as f64)
                    .sum::<f64>();
            want += (y - d.t[i * 2 + j] as f64).powi(2);
        }
    }
    want /= 8.0;
    let losses = train(&mut be, &d, 1000);
    assert!(
        (losses[0] as f64 - want).abs() < 1e-5 * want.max(1.0),
        "{} vs {want}",
        losses[0]
    );
    for w in losses.windows(100).step_by(100) {
        assert!(w[99] < w[0], "loss not decreasing: {losses:?}");
    }
    assert!(
        losses[999] < 5e-3 * losses[0],
        "{} -> {}",
        losses[0],
        losses[999]
    );
    // the output binding is the prediction
    assert_eq!(be.output().len(), 8);
    let err: f32 = be
        .output()
        .iter()
        .zip(&d.t)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(err < 0.05, "{err}");
    // optimizer state is exposed
    assert!(be
        .opt_state("fc.weight.momentum")
        .unwrap()
        .iter()
        .any(|&v| v != 0.0));
}

#[test]
fn sgd_step_through_the_executor_matches_hand_computation() {
    let d = linear_data();
    let mut be = CpuBackend::new(linear_plan()).unwrap();
    be.init_params(1);
    let w0 = be.param("fc.weight").unwrap().to_vec();
    train(&mut be, &d, 1);
    // one step from zero momentum: w1 = w0 - lr * dL/dw, dL/dw = x^T (2 (y - t) / 8)
    let mut g = [0f64; 6];
    for i in 0..4 {
        for j in 0..2 {
            let y: f64 = (0..3)
                .map(|k| d.x[i * 3 + k] as f64 * w0[k * 2 + j] as f64)
                .sum();
            let dy = 2.0 * (y - d.t[i * 2 + j] as f64) / 8.0;
            for k in 0..3 {
                g[k * 2 + j] += d.x[i * 3 + k] as f64 * dy;
            }
        }
    }
    let w1 = be.param("fc.weight").unwrap();
    for i in 0..6 {
        let want = w0[i] as f64 - LR as f64 * g[i];
        assert!(
            (w1[i] as f64 - want).abs() < 1e-6,
            "w[{i}]: {} vs {want}",
            w1[i]
        );
    }
}

#[test]
fn init_is_seeded_per_name() {
    let mut a = CpuBackend::new(linear_plan()).unwrap();
    a.init_params(7);
    let wa = a.param("fc.weight").unwrap().to_vec();
    let bound = (6.0f32 / 5.0).sqrt();
    assert!(wa.iter().all(|v| v.abs() <= bound) && wa.iter().any(|&v| v != 0.0));
    // same seed: same values, even with the parameters listed in another order
    let mut plan = linear_plan();
    plan.params.reverse();
    let mut b = CpuBackend::new(plan).unwrap();
    b.init_params(7);
    assert_eq!(wa, b.param("fc.weight").unwrap());
    b.init_params(8);
    assert_ne!(wa, b.param("fc.weight").unwrap());
    let names: Vec<&str> = b.params().map(|(n, _, _)| n).collect();
    assert_eq!(names, ["fc.bias", "fc.weight"]);
}

#[test]
fn bindings_and_errors() {
    let mut be = CpuBackend::new(linear_plan()).unwrap();
    assert!(matches!(
        be.set_input("x", InputData::F32(&[0.0; 11])),
        Err(RuntimeError::SizeMismatch {
            expected: 12,
            got: 11,
            ..
        })
    ));
    assert!(matches!(
        be.set_input("nope", InputData::F32(&[])),
        Err(RuntimeError::UnknownInput(_))
    ));
    assert!(matches!(
        be.set_input("x", InputData::I32(&[0; 12])),
        Err(RuntimeError::DTypeMismatch { .. })
    ));
    assert!(matches!(
        be.set_param("nope", &[]),
        Err(RuntimeError::UnknownParam(_))
    ));
    assert!(matches!(
        be.set_param("fc.bias", &[1.0]),
        Err(RuntimeError::SizeMismatch { .. })
    ));
    be.set_param("fc.bias", &[1.0, 2.0]).unwrap();
    assert_eq!(be.param("fc.bias").unwrap(), [1.0, 2.0]);
    assert!(be.param("nope").is_none());
    assert_eq!(be.arena_bytes(), linear_plan().arena_bytes);
}

fn id(p: &Plan, name: &str) -> usize {
    p.buffers.iter().position(|b| b.name == name).unwrap()
}

fn expect_bad(plan: Plan, what: &str) {
    match CpuBackend::new(plan) {
        Err(RuntimeError::BadPlan(msg)) => eprintln!("{what}: {msg}"),
        Err(e) => panic!("{what}: unexpected error {e}"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

#[test]
fn invalid_plans_are_rejected() {
    let mut p = linear_plan();
    p.steps[0].args.pop();
    expect_bad(p, "arg count");

    let mut p = linear_plan();
    let (x, y) = (id(&p, "x"), id(&p, "y"));
    p.buffers[y].offset = p.buffers[x].offset; // y written over x in the same step
    expect_bad(p, "overlap in a step");

    let mut p = linear_plan();
    let dw = id(&p, "dw");
    p.buffers[dw].offset = p.arena_bytes; // dw past the arena
    expect_bad(p, "out of arena");

    let mut p = linear_plan();
    let b = id(&p, "fc.bias");
    p.buffers[b].offset += 4;
    expect_bad(p, "misaligned");

    let mut p = linear_plan();
    p.kernels[0].arg_shapes[1] = vec![3, 3];
    expect_bad(p, "shapes");

    let mut p = linear_plan();
    p.steps[1].args[1] = 99;
    expect_bad(p, "unknown buffer");

    // dy (live 2..4) and dw (live 3..5) share memory: caught statically, no step needed
    let mut p = linear_plan();
    let (dy, dw) = (id(&p, "dy"), id(&p, "dw"));
    p.buffers[dw].offset = p.buffers[dy].offset;
    expect_bad(p, "overlap in time");

    // the output (read after the run) must not be reused by a later buffer
    let mut p = linear_plan();
    let (y, db) = (id(&p, "y"), id(&p, "db"));
    p.buffers[db].offset = p.buffers[y].offset;
    expect_bad(p, "output reused");

    // an input declared live only from its first read, sharing memory with a value that dies
    // before: set_input writes it before step 0, so this is a clash
    let mut p = linear_plan();
    let (t, dy) = (id(&p, "t"), id(&p, "dy"));
    p.buffers[t].live = (1, 2);
    p.buffers[dy].live = (2, 4);
    let y = id(&p, "y");
    p.buffers[y].live = (0, 0); // pretend y died at step 0 ...
    p.output.buffer = dy; // (keep the output out of the way)
    p.buffers[t].offset = p.buffers[y].offset; // ... and t reuses it
    expect_bad(p, "input clash");

    let mut p = linear_plan();
    p.arena_bytes = 1 << 50; // a petabyte: the allocation must fail cleanly
    assert!(matches!(
        CpuBackend::new(p),
        Err(RuntimeError::Alloc { .. } | RuntimeError::ArenaTooLarge { .. })
    ));
}

/// The linear plan with a planner bug: the target `t` is declared dead after the loss (step 1)
/// although the loss backward (step 2) still reads it, and `dw` (first written at step 3) reuses
/// its memory. Without poison this happens to compute the right numbers.
fn wrong_plan() -> Plan {
    let mut p = linear_plan();
    let t = p.buffers.iter().position(|b| b.name == "t").unwrap();
    let dw = p.buffers.iter().position(|b| b.name == "dw").unwrap();
    p.buffers[t].live = (0, 1);
    p.buffers[dw].offset = p.buffers[t].offset;
    p
}

#[test]
fn poison_is_silent_for_a_correct_plan_and_loud_for_a_wrong_one() {
    let d = linear_data();
    let mut plain = CpuBackend::new(linear_plan()).unwrap();
    plain.init_params(3);
    let l_plain = train(&mut plain, &d, 10);

    let mut poisoned = CpuBackend::new(linear_plan()).unwrap();
    poisoned.set_poison(true);
    poisoned.init_params(3);
    let l_poison = train(&mut poisoned, &d, 10);
    assert!(l_poison.iter().all(|l| l.is_finite()));
    assert_eq!(l_plain, l_poison, "poison changed a correct plan's results");
    assert_eq!(plain.param("fc.weight"), poisoned.param("fc.weight"));

    // the wrong plan gives the right numbers by accident without poison ...
    let mut wrong = CpuBackend::new(wrong_plan()).unwrap();
    wrong.init_params(3);
    assert_eq!(train(&mut wrong, &d, 10), l_plain);
    // ... and NaN with it
    let mut wrong = CpuBackend::new(wrong_plan()).unwrap();
    wrong.set_poison(true);
    wrong.init_params(3);
    let l = train(&mut wrong, &d, 3);
    assert!(l[1].is_nan() && l[2].is_nan(), "{l:?}");
    assert!(wrong.param("fc.weight").unwrap().iter().all(|v| v.is_nan()));
}

/// x[2,6,6,1] -> conv 3x3 same (+bias) -> relu -> maxpool 2 -> (flatten) dense(+bias) -> CE;
/// full backward; Adam. Exercises conv/pool forward and backward through the executor.
fn conv_plan() -> Plan {
    let mut p = Pb::default();
    let g = ConvGeom::square(3, 1, 1);
    let pg = PoolGeom::square(2, 2, 0);
    let x = p.input("image", &[2, 6, 6, 1], DType::F32, false);
    let lab = p.input("label", &[2], DType::I32, true);
    let cw = p.param("conv.weight", &[3, 3, 1, 4], Init::HeUniform { fan_in: 9 });
    let cb = p.param("conv.bias", &[4], Init::Zeros);
    let fw = p.param(
        "fc.weight",
        &[36, 3],
        Init::GlorotUniform {
            fan_in: 36,
            fan_out: 3,
        },
    );
    let fb = p.param("fc.bias", &[3], Init::Zeros);
    let mut mv = Vec::new();
    for (name, shape) in [
        ("conv.weight", &[3usize, 3, 1, 4][..]),
        ("conv.bias", &[4][..]),
        ("fc.weight", &[36, 3][..]),
        ("fc.bias", &[3][..]),
    ] {
        let m = p.opt(&format!("{name}.m"), shape);
        let v = p.opt(&format!("{name}.v"), shape);
        mv.push((m, v));
    }
    let a = p.act("conv", 2 * 36 * 4);
    let ws = p.buf("conv.cols", 72 * 9, DType::F32, BufferKind::Workspace);
    let r = p.act("relu", 2 * 36 * 4);
    let pool = p.act("pool", 2 * 9 * 4);
    let am = p.buf("pool.argmax", 2 * 9 * 4, DType::U8, BufferKind::Activation);
    // the flattened pool output: a Reshape view, its own buffer entry at the same bytes
    let flat = p.act("flat", 2 * 9 * 4);
    p.bufs[flat].offset = p.bufs[pool].offset;
    let logits = p.act("logits", 6);
    let loss = p.act("loss", 1);
    let dl = p.grad("dlogits", 6);
    let dfw = p.grad("dfc.weight", 108);
    let dfb = p.grad("dfc.bias", 3);
    let dp = p.grad("dpool", 72);
    let dr = p.grad("drelu", 288);
    let da = p.grad("dconv", 288);
    let ws2 = p.buf("conv.cols.bwd", 72 * 9, DType::F32, BufferKind::Workspace);
    let dcw = p.grad("dconv.weight", 36);
    let dcb = p.grad("dconv.bias", 4);
    let (xs, ws_s, ys): (&[usize], &[usize], &[usize]) =
        (&[2, 6, 6, 1], &[3, 3, 1, 4], &[2, 6, 6, 4]);
    p.step(
        Op::Conv(ConvOp::Conv2d {
            geom: g,
            bias: true,
            epi: Default::default(),
        }),
        &[xs, ws_s, &[4], ys, &[648]],
        &[x, cw, cb, a, ws],
        "conv",
    );
    p.step(
        Op::Elementwise(ElementwiseOp::Unary(UnaryKind::Relu)),
        &[ys, ys],
        &[a, r],
        "relu",
    );
    p.step(
        Op::Pool(PoolOp::MaxPool { geom: pg }),
        &[ys, &[2, 3, 3, 4], &[2, 3, 3, 4]],
        &[r, pool, am],
        "pool",
    );
    p.step(
        Op::Dense(DenseOp::Dense {
            bias: true,
            epi: Default::default(),
        }),
        &[&[2, 36], &[36, 3], &[3], &[2, 3]],
        &[flat, fw, fb, logits],
        "fc",
    );
    p.step(
        Op::Loss(LossOp::CrossEntropyLoss {
            label_smoothing: 0.0,
            weight: 1.0,
        }),
        &[&[2, 3], &[2], &[1]],
        &[logits, lab, loss],
        "loss",
    );
    p.step(
        Op::Loss(LossOp::CrossEntropyLossBwd {
            label_smoothing: 0.0,
            weight: 1.0,
        }),
        &[&[2, 3], &[2], &[2, 3]],
        &[logits, lab, dl],
        "loss bwd",
    );
    p.step(
        Op::Dense(DenseOp::DenseBwdWeight),
        &[&[2, 36], &[2, 3], &[36, 3]],
        &[flat, dl, dfw],
        "fc dw",
    );
    p.step(
        Op::Optim(OptimOp::BiasGrad),
        &[&[2, 3], &[3]],
        &[dl, dfb],
        "fc db",
    );
    p.step(
        Op::Dense(DenseOp::DenseBwdData {
            epi: Default::default(),
        }),
        &[&[2, 3], &[36, 3], &[2, 36]],
        &[dl, fw, dp],
        "fc dx",
    );
    p.step(
        Op::Pool(PoolOp::MaxPoolBwd { geom: pg }),
        &[&[2, 3, 3, 4], &[2, 3, 3, 4], ys],
        &[dp, am, dr],
        "pool bwd",
    );
    p.step(
        Op::Elementwise(ElementwiseOp::UnaryBwd(UnaryKind::Relu)),
        &[ys, ys, ys],
        &[r, dr, da],
        "relu bwd",
    );
    p.step(
        Op::Conv(ConvOp::Conv2dBwdWeight { geom: g }),
        &[xs, ys, ws_s, &[648]],
        &[x, da, dcw, ws2],
        "conv dw",
    );
    p.step(
        Op::Optim(OptimOp::BiasGrad),
        &[ys, &[4]],
        &[da, dcb],
        "conv db",
    );
    let adam = Op::Optim(OptimOp::Update {
        summed: false,
        shards: 1,
        keep_rows: false,
        rule: UpdateRule::Adam {
            lr: 0.02,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decoupled: true,
            clip_value: None,
            clip_norm: None,
        },
        zero_grad: false,
    });
    for (i, (w, gw, shape)) in [
        (cw, dcw, &[3usize, 3, 1, 4][..]),
        (cb, dcb, &[4][..]),
        (fw, dfw, &[36, 3][..]),
        (fb, dfb, &[3][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let (m, v) = mv[i];
        p.step(
            adam.clone(),
            &[shape, shape, shape, shape],
            &[w, gw, m, v],
            "update",
        );
    }
    let opt = Optimizer::Adam {
        lr: 0.02,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled: true,
        clip_value: None,
        clip_norm: None,
    };
    p.finish(loss, logits, &[2, 3], opt)
}

#[test]
fn small_convnet_trains_deterministically_with_poison() {
    let mut r = ChaCha8Rng::seed_from_u64(9);
    let img: Vec<f32> = (0..72).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let labels = [2i32, 0];
    let run = |poison: bool, reuse: bool| {
        let mut plan = conv_plan();
        if reuse {
            // legal reuse, as a planner would do it: values dead before the other is born
            for (dead, born) in [
                ("conv", "drelu"),
                ("conv.cols", "conv.cols.bwd"),
                ("flat", "dpool"),
            ] {
                let (a, b) = (id(&plan, dead), id(&plan, born));
                assert!(
                    plan.buffers[a].live.1 < plan.buffers[b].live.0,
                    "{dead} {:?} {born} {:?}",
                    plan.buffers[a].live,
                    plan.buffers[b].live
                );
                plan.buffers[b].offset = plan.buffers[a].offset;
            }
        }
        let mut be = CpuBackend::new(plan).unwrap();
        be.set_poison(poison);
        be.init_params(11);
        let losses: Vec<f32> = (1..=60)
            .map(|s| {
                be.set_input("image", InputData::F32(&img)).unwrap();
                be.set_input("label", InputData::I32(&labels)).unwrap();
                be.run(s, 123).unwrap()
            })
            .collect();
        (losses, be.param("conv.weight").unwrap().to_vec())
    };
    let (l1, w1) = run(false, false);
    assert!(l1.iter().all(|l| l.is_finite()));
    assert!(l1[59] < 0.1 * l1[0], "{l1:?}");
    let (l2, w2) = run(true, false);
    assert_eq!(l1, l2);
    assert_eq!(w1, w2);
    let (l3, w3) = run(true, true);
    assert_eq!(l1, l3);
    assert_eq!(w1, w3);
    // a label out of range is an error, not a panic
    let mut be = CpuBackend::new(conv_plan()).unwrap();
    be.set_input("label", InputData::I32(&[3, 0])).unwrap();
    assert!(matches!(
        be.run(1, 0),
        Err(RuntimeError::BadLabel { label_value: 3, .. })
    ));
}

/// x -> Dropout -> MSE against t (forward only).
fn dropout_plan(mode: Mode) -> Plan {
    let mut p = Pb::default();
    let n = 1000usize;
    let x = p.input("x", &[n], DType::F32, false);
    let t = p.input("t", &[n], DType::F32, true);
    let y = p.act("y", n);
    let loss = p.act("loss", 1);
    p.step(
        Op::Elementwise(ElementwiseOp::Dropout { p: 0.5, salt: 17 }),
        &[&[n], &[n]],
        &[x, y],
        "dropout",
    );
    p.step(
        Op::Loss(LossOp::MseLoss { weight: 1.0 }),
        &[&[n], &[n], &[1]],
        &[y, t, loss],
        "loss",
    );
    let mut plan = p.finish(
        loss,
        y,
        &[n],
        Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            clip_value: None,
            clip_norm: None,
        },
    );
    plan.mode = mode;
    plan
}

#[test]
fn dropout_follows_mode_seed_and_step() {
    let x = vec![1.0f32; 1000];
    let t = vec![0.0f32; 1000];
    let mut eval = CpuBackend::new(dropout_plan(Mode::Eval)).unwrap();
    eval.set_input("x", InputData::F32(&x)).unwrap();
    eval.set_input("t", InputData::F32(&t)).unwrap();
    assert_eq!(eval.run(1, 5).unwrap(), 1.0); // identity in eval mode
    let mut tr = CpuBackend::new(dropout_plan(Mode::Train)).unwrap();
    tr.set_input("x", InputData::F32(&x)).unwrap();
    tr.set_input("t", InputData::F32(&t)).unwrap();
    let mut masks = Vec::new();
    for (step, seed) in [(1, 5), (1, 5), (2, 5), (1, 6)] {
        let l = tr.run(step, seed).unwrap();
        // kept values are 2.0: loss = 4 * kept fraction ~ 2
        assert!((l - 2.0).abs() < 0.4, "{l}");
        masks.push(tr.output().to_vec());
    }
    assert_eq!(masks[0], masks[1]);
    assert_ne!(masks[0], masks[2]);
    assert_ne!(masks[0], masks[3]);
}
