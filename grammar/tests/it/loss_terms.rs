//! The loss as a weighted sum of built-in losses: what each term checks to, which prediction is
//! the output, and that a single unweighted term means what it meant before.

use dmc_grammar::model::*;
use dmc_grammar::{compile_source, render_plain, summary_text};

fn ok(src: &str) -> Model {
    match compile_source(src, "test.dm") {
        Ok(m) => m,
        Err(d) => panic!("expected success:\n{}", render_plain(&d)),
    }
}

const AE: &str = "input x: [8]
target x2: [8]
target label: int
h = x |> dense(16, activation: relu)
recon = h |> dense(8)
logits = h |> dense(3)
";
const TRAIN: &str = "train { batch: 4, optimizer: sgd(lr: 0.1) }\n";

fn node(m: &Model, name: &str) -> ValueRef {
    ValueRef::Node(m.nodes.iter().position(|n| n.name == name).expect(name))
}

#[test]
fn an_autoencoder_with_a_classifier_head_checks_to_two_weighted_terms() {
    let m = ok(&format!(
        "{AE}loss 0.5 * mse(recon, x2) + cross_entropy(logits, label, label_smoothing: 0.1)\n{TRAIN}"
    ));
    let t = &m.loss.terms;
    assert_eq!(t.len(), 2);
    assert_eq!((t[0].kind, t[0].weight), (LossKind::Mse, 0.5));
    assert_eq!(
        (t[1].kind, t[1].weight),
        (
            LossKind::CrossEntropy {
                label_smoothing: 0.1
            },
            1.0
        )
    );
    assert_eq!(t[0].pred, node(&m, "dense_2"));
    assert_eq!(t[1].pred, node(&m, "dense_3"));
    assert_eq!(t[0].target, ValueRef::Target(0));
    assert_eq!(t[1].target, ValueRef::Target(1));
    // The classifier's logits are the output (what accuracy and `predict` use), though it is
    // the second term.
    assert_eq!(m.output, t[1].pred);
    assert_eq!(m.loss.classifier(), Some(&t[1]));
    assert!(!m.loss.is_single());
    // Each term's span is its own text.
    let src = format!(
        "{AE}loss 0.5 * mse(recon, x2) + cross_entropy(logits, label, label_smoothing: 0.1)\n{TRAIN}"
    );
    assert_eq!(&src[t[0].span.start..t[0].span.end], "0.5 * mse(recon, x2)");
    assert_eq!(
        &src[t[1].span.start..t[1].span.end],
        "cross_entropy(logits, label, label_smoothing: 0.1)"
    );
    let s = summary_text(&m);
    assert!(
        s.contains(
            "Loss:               0.5 * mse(dense_2, x2) + cross_entropy(dense_3, label, label_smoothing: 0.1)"
        ),
        "{s}"
    );
}

#[test]
fn without_a_classifier_the_first_term_is_the_output() {
    let ae = AE.replace("target label: int\n", "");
    let m = ok(&format!(
        "{ae}loss mse(recon, x2) + 2 * mae(logits |> dense(8), x2)\n{TRAIN}"
    ));
    assert_eq!(m.output, m.loss.terms[0].pred);
    assert_eq!(m.loss.classifier(), None);
    assert_eq!(m.loss.terms[1].weight, 2.0);
    // The loss' expression is a layer of its own.
    assert_eq!(m.loss.terms[1].pred, node(&m, "dense_4"));
}

#[test]
fn the_same_term_twice_and_terms_sharing_a_prediction_are_fine() {
    let m = ok(&format!(
        "input x: [4]\ntarget y: [2]\nout = x |> dense(2)\nloss mse(out, y) + mse(out, y) + 0.25 * huber(out, y, delta: 0.5)\n{TRAIN}"
    ));
    let t = &m.loss.terms;
    assert_eq!(t.len(), 3);
    assert_eq!(t[0].pred, t[1].pred);
    assert_eq!(
        t[0],
        LossTerm {
            span: t[0].span,
            ..t[1].clone()
        }
    );
    assert_eq!(t[2].kind, LossKind::Huber { delta: 0.5 });
    assert_eq!(t[2].weight, 0.25);
}

#[test]
fn one_term_of_weight_one_is_the_unweighted_loss() {
    let plain = ok(&format!(
        "{AE}loss cross_entropy(logits, label) + mse(recon, x2)\n{TRAIN}"
    ));
    let one = ok(&format!(
        "{AE}loss 1 * cross_entropy(logits, label) + 1.0 * mse(recon, x2)\n{TRAIN}"
    ));
    let strip = |m: &Model| -> Vec<(LossKind, ValueRef, ValueRef, f32)> {
        m.loss
            .terms
            .iter()
            .map(|t| (t.kind, t.pred, t.target, t.weight))
            .collect()
    };
    assert_eq!(strip(&plain), strip(&one));
    assert_eq!(plain.nodes, one.nodes);
    let single = ok("input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd }\n");
    assert!(single.loss.is_single());
    assert_eq!(single.loss.terms.len(), 1);
    assert_eq!(single.loss.terms[0].weight, 1.0);
    let weighted = ok("input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss 3 * mse(out, y)\ntrain { batch: 1, optimizer: sgd }\n");
    assert!(!weighted.loss.is_single());
    assert!(summary_text(&weighted).contains("Loss:               3 * mse(dense_1, y)"));
}

#[test]
fn weights_must_be_positive_finite_numbers() {
    let head = "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\n";
    for (loss, message) in [
        (
            "0 * mse(out, y)",
            "a loss weight must be positive, found 0.0",
        ),
        (
            "-1 * mse(out, y)",
            "a loss weight must be positive, found -1.0",
        ),
        (
            "mse(out, y) + -2.5 * mae(out, y)",
            "a loss weight must be positive, found -2.5",
        ),
        (
            "1e39 * mse(out, y)",
            "the loss weight 1e39 does not fit in f32",
        ),
        (
            "1e-50 * mse(out, y)",
            "the loss weight 1e-50 does not fit in f32",
        ),
        (
            "w * mse(out, y)",
            "a loss weight must be a number, found the name `w`",
        ),
        ("0.5 mse(out, y)", "expected `*` after the loss weight"),
        ("mse(out, y) +", "expected a loss term"),
        ("mse(out, y) + + mae(out, y)", "expected a loss term"),
    ] {
        let src = format!("{head}loss {loss}\ntrain {{ batch: 1, optimizer: sgd }}\n");
        let d = match compile_source(&src, "bad.dm") {
            Ok(_) => panic!("`loss {loss}` should fail"),
            Err(d) => d,
        };
        let text = render_plain(&d);
        assert!(text.contains(message), "`loss {loss}`: {text}");
        assert!(
            text.contains("bad.dm:4:"),
            "`loss {loss}`: no line:col in {text}"
        );
    }
    // Every term in error is reported, in one run.
    let src = format!("{head}loss 0 * mse(out, y) + mae(out, z) + -1 * huber(out, y)\ntrain {{ batch: 1, optimizer: sgd }}\n");
    let d = compile_source(&src, "bad.dm").expect_err("fails");
    let text = render_plain(&d);
    assert!(text.contains("3 errors"), "{text}");
}

#[test]
fn a_target_used_by_terms_of_incompatible_kinds_is_refused() {
    // An integer target for an elementwise loss, a float target for cross_entropy.
    for loss in [
        "cross_entropy(logits, label) + mse(logits, label)",
        "mse(recon, x2) + cross_entropy(logits, x2)",
    ] {
        let src = format!("{AE}loss {loss}\n{TRAIN}");
        let d = compile_source(&src, "bad.dm").expect_err("fails");
        let text = render_plain(&d);
        assert!(
            text.contains("needs a float target") || text.contains("needs integer class labels"),
            "{loss}: {text}"
        );
    }
    // Every head must feed a term: a head no term reads is an unused value.
    let src = format!("{AE}loss mse(recon, x2)\n{TRAIN}");
    let d = compile_source(&src, "bad.dm").expect_err("fails");
    assert!(render_plain(&d).contains("`logits` is never used"));
}
