//! The CPU time model's transcendental work ([`Special`]): which kernels have it, how much, and
//! that a launch's time adds it at the measured cost per element.

use dmc_plan::cpu::{CpuRates, CpuWork, Special};
use dmc_plan::op::{DenseOp, ElementwiseOp, Epilogue, LossOp, NormOp, Op, OptimOp, SeqOp};
use dmc_plan::unary::Coef;
use dmc_plan::unary::UnaryKind;

fn work(op: Op, ins: &[&[usize]], outs: &[&[usize]]) -> CpuWork {
    let ins: Vec<Vec<usize>> = ins.iter().map(|s| s.to_vec()).collect();
    let outs: Vec<Vec<usize>> = outs.iter().map(|s| s.to_vec()).collect();
    op.facts().expect("a kernel").cpu_work(&ins, &outs)
}

#[test]
fn activations_evaluate_their_formula_per_element() {
    let gelu = work(
        Op::Elementwise(ElementwiseOp::Unary(UnaryKind::Gelu)),
        &[&[8, 100]],
        &[&[8, 100]],
    );
    assert_eq!(gelu.special, vec![(Special::Forward(UnaryKind::Gelu), 800)]);
    assert_eq!(
        gelu.streamed,
        2 * 800 * 4,
        "and it streams its input and output"
    );
    let back = work(
        Op::Elementwise(ElementwiseOp::UnaryBwdInPlace(UnaryKind::Tanh)),
        &[&[8, 100], &[8, 100]],
        &[&[8, 100]],
    );
    assert_eq!(
        back.special,
        vec![(Special::Backward(UnaryKind::Tanh), 800)]
    );
    // a folded activation's backward in a data-gradient GEMM: per element of dx
    let fused = work(
        Op::Dense(DenseOp::DenseBwdData {
            epi: Epilogue {
                add: false,
                act: Some(UnaryKind::Gelu),
            },
        }),
        &[&[8, 10], &[100, 10], &[8, 100]],
        &[&[8, 100]],
    );
    assert_eq!(
        fused.special,
        vec![(Special::Backward(UnaryKind::Gelu), 800)]
    );
    let plain = work(
        Op::Elementwise(ElementwiseOp::Add),
        &[&[8, 100], &[8, 100]],
        &[&[8, 100]],
    );
    assert!(
        plain.special.is_empty(),
        "an add has no transcendental work"
    );
}

#[test]
fn attention_evaluates_an_exp_per_score_of_its_tiles() {
    // one head of 64 positions: one 64 x 64 tile; causal or not, the tile is computed whole
    let w = work(
        Op::Seq(SeqOp::Attention {
            heads: 1,
            causal: true,
        }),
        &[&[2, 64, 24]],
        &[&[2, 64, 8], &[2, 1, 64]],
    );
    assert_eq!(w.special, vec![(Special::AttentionExp, 2 * 64 * 64)]);
}

#[test]
fn a_launch_costs_its_special_work_at_the_measured_rate() {
    let mut r = CpuRates::nominal();
    let w = CpuWork::stream(4096).with_special(Special::Forward(UnaryKind::Gelu), 1000);
    let base = r.work_s(&CpuWork::stream(4096));
    let nominal = r.work_s(&w) - base;
    assert!((nominal - 1000.0 * Special::Forward(UnaryKind::Gelu).nominal_s()).abs() < 1e-15);
    r.special_s.insert("gelu".into(), 7e-9);
    let measured = r.work_s(&w) - base;
    assert!((measured - 7e-6).abs() < 1e-15, "{measured}");
    // every kind the micro-benchmark measures has a distinct key
    let keys: std::collections::BTreeSet<String> = Special::all().iter().map(|s| s.key()).collect();
    assert_eq!(keys.len(), Special::all().len());
    assert!(keys.contains("gelu_bwd") && keys.contains("attention_exp"));
    assert!(keys.contains("batchnorm") && keys.contains("batchnorm_bwd"));
}

#[test]
fn a_batchnorm_costs_its_elements_beyond_its_streaming() {
    let (x, c) = (&[16usize, 8, 8, 64][..], &[64usize][..]);
    let fwd = work(
        Op::Norm(NormOp::BatchNorm {
            eps: Coef(1e-5),
            ranks: 1,
        }),
        &[x, c, c],
        &[x, c, c],
    );
    assert_eq!(fwd.special, vec![(Special::BatchNorm, 16 * 8 * 8 * 64)]);
    assert!(fwd.streamed > 0, "and it streams its passes");
    let bwd = work(
        Op::Norm(NormOp::BatchNormBwd {
            eps: Coef(1e-5),
            in_place: true,
            ranks: 1,
        }),
        &[x, x, c, c, c],
        &[c, c],
    );
    assert_eq!(bwd.special, vec![(Special::BatchNormBwd, 16 * 8 * 8 * 64)]);
    // nominal rates: nothing beyond the streaming (the nominal plans' times are unchanged); a
    // measured cost per element is added per element
    let mut r = CpuRates::nominal();
    let mut plain = fwd.clone();
    plain.special.clear();
    assert_eq!(r.work_s(&fwd), r.work_s(&plain));
    r.special_s.insert("batchnorm".into(), 2e-10);
    let extra = r.work_s(&fwd) - r.work_s(&plain);
    assert!(
        (extra - 2e-10 * (16 * 8 * 8 * 64) as f64).abs() < 1e-15,
        "{extra}"
    );
}

#[test]
fn layernorms_losses_and_bias_gradients_cost_their_elements() {
    let (x, rows, c) = (&[8usize, 64, 256][..], &[8usize, 64][..], &[256usize][..]);
    let ln = work(
        Op::Norm(NormOp::LayerNorm { eps: Coef(1e-5) }),
        &[x, c, c],
        &[x, rows, rows],
    );
    assert_eq!(ln.special, vec![(Special::LayerNorm, 8 * 64 * 256)]);
    let lnb = work(
        Op::Norm(NormOp::LayerNormBwd),
        &[x, x, rows, rows, c],
        &[x, c, c],
    );
    assert_eq!(lnb.special, vec![(Special::LayerNormBwd, 8 * 64 * 256)]);
    let (logits, labels) = (&[512usize, 256][..], &[512usize][..]);
    let ce = LossOp::CrossEntropyLoss {
        label_smoothing: 0.0,
        weight: 1.0,
    };
    let fwd = work(Op::Loss(ce), &[logits, labels], &[&[1]]);
    assert_eq!(fwd.special, vec![(Special::CrossEntropy, 512 * 256)]);
    let bwd = work(
        Op::Loss(LossOp::CrossEntropyLossBwd {
            label_smoothing: 0.0,
            weight: 1.0,
        }),
        &[logits, labels],
        &[logits],
    );
    assert_eq!(bwd.special, vec![(Special::CrossEntropyBwd, 512 * 256)]);
    let bg = work(Op::Optim(OptimOp::BiasGrad), &[logits], &[&[256]]);
    assert_eq!(bg.special, vec![(Special::BiasGrad, 512 * 256)]);
    // an MSE loss has none; all of them stream every input and output once, as before
    let mse = work(
        Op::Loss(LossOp::MseLoss { weight: 1.0 }),
        &[logits, logits],
        &[&[1]],
    );
    assert!(mse.special.is_empty());
    assert_eq!(mse.streamed, (2 * 512 * 256 + 1) * 4);
    assert_eq!(bg.streamed, (512 * 256 + 256) * 4);
}
