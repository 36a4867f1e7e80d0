//! `--top-k K` of `dmc eval` and `dmc run`: the top-K accuracy of a dense layer with fixed weights,
//! whose outputs (and so the rank of every label) are worked out by hand below, ties included.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common;
use crate::interop::{s, write_safetensors};
use common::dmc;

/// Four classes, straight from the two inputs: no bias, no activation.
const PROGRAM: &str = "input x: [2]
target y: int
out = x |> dense(4, bias: false) as fc
loss cross_entropy(out, y)
train { batch: 4, optimizer: sgd }
";

/// `fc.weight` `[2, 4]`: x = [1, 0] gives the outputs [4, 3, 2, 1], x = [0, 1] gives [0, 1, 1, 0].
const WEIGHT: [f32; 8] = [4.0, 3.0, 2.0, 1.0, 0.0, 1.0, 1.0, 0.0];

/// The samples `(x, label)` and, by hand, the label's rank (how many outputs rank above it: the
/// greater ones, and equal ones at a lower index):
/// 1. [1, 0] label 0: outputs [4, 3, 2, 1], rank 0 (top-1)
/// 2. [1, 0] label 1: rank 1 (4 above)
/// 3. [1, 0] label 3: rank 3
/// 4. [0, 1] label 2: outputs [0, 1, 1, 0], rank 1 (the tie with class 1 goes to class 1)
/// 5. [0, 1] label 0: rank 2 (classes 1 and 2; the equal class 3 is at a higher index)
/// 6. [0, 1] label 3: rank 3 (classes 1, 2 and the equal class 0)
/// 7. [0, 1] label 1: rank 0
///
/// So top-1: samples 1, 7 (2/7); top-2: 1, 2, 4, 7 (4/7); top-3: and 5 (5/7); top-4: all.
const SAMPLES: [([f32; 2], i32); 7] = [
    ([1.0, 0.0], 0),
    ([1.0, 0.0], 1),
    ([1.0, 0.0], 3),
    ([0.0, 1.0], 2),
    ([0.0, 1.0], 0),
    ([0.0, 1.0], 3),
    ([0.0, 1.0], 1),
];

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes the program, the weights and the data into `dir`: (program, weights, data).
fn fixture(dir: &Path) -> (String, String, String) {
    let program = dir.join("topk.dm");
    std::fs::write(&program, PROGRAM).expect("write program");
    let weights = dir.join("w.safetensors");
    let mut w = BTreeMap::new();
    w.insert(
        "fc.weight".to_string(),
        ("F32".to_string(), vec![2, 4], f32_bytes(&WEIGHT)),
    );
    write_safetensors(&weights, &w);
    let data = dir.join("data.safetensors");
    let xs: Vec<f32> = SAMPLES.iter().flat_map(|(x, _)| *x).collect();
    let ys: Vec<u8> = SAMPLES.iter().flat_map(|(_, y)| y.to_le_bytes()).collect();
    let mut d = BTreeMap::new();
    d.insert(
        "x".to_string(),
        (
            "F32".to_string(),
            vec![SAMPLES.len() as u64, 2],
            f32_bytes(&xs),
        ),
    );
    d.insert(
        "y".to_string(),
        ("I32".to_string(), vec![SAMPLES.len() as u64], ys),
    );
    write_safetensors(&data, &d);
    (
        s(&program).to_string(),
        s(&weights).to_string(),
        s(&data).to_string(),
    )
}

/// The number before `%` after `key` in `text`.
fn percent(text: &str, key: &str) -> f64 {
    text.split(key)
        .nth(1)
        .and_then(|t| t.split('%').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no `{key}` percentage in {text:?}"))
}

#[test]
fn eval_prints_the_top_k_accuracy_worked_out_by_hand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (program, weights, data) = fixture(dir.path());
    let eval = |k: &str| {
        let (code, out, err) = dmc(&[
            "eval", &program, "--init", &weights, "--data", &data, "--top-k", k, "-q",
        ]);
        assert_eq!(code, 0, "--top-k {k}: {err}");
        out
    };
    let out = eval("2");
    // 7 samples in batches of 4: the padding of the last batch is not counted.
    assert!(
        out.contains(", top-2 57.14% (7 samples)"),
        "top-2 should be 4/7: {out}"
    );
    assert_eq!(percent(&out, "accuracy "), 28.57, "top-1 is 2/7: {out}");
    assert_eq!(percent(&eval("3"), "top-3 "), 71.43);
    assert_eq!(percent(&eval("4"), "top-4 "), 100.0);
    // K = 1 is the accuracy, the tie of sample 4 included.
    let out = eval("1");
    assert_eq!(percent(&out, "top-1 "), percent(&out, "accuracy "), "{out}");
}

#[test]
fn run_reports_the_top_k_accuracy_of_the_training_batches_and_the_validation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (program, weights, data) = fixture(dir.path());
    let json = dir.path().join("summary.json");
    // A learning rate of 1e-30 leaves the weights as they are: the one step (samples 1-4, in file
    // order) has top-1 1/4 and top-2 3/4; the validation on all 7, 2/7 and 4/7.
    let (code, _, err) = dmc(&[
        "run",
        &program,
        "--init",
        &weights,
        "--data",
        &data,
        "--val",
        &data,
        "--no-shuffle",
        "--lr",
        "1e-30",
        "--top-k",
        "2",
        "--summary-json",
        s(&json),
    ]);
    assert_eq!(code, 0, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("epoch 1/1: "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("accuracy 25.00%, top-2 75.00% (4 samples)")
            && line.contains("validation loss")
            && line.contains("accuracy 28.57%, top-2 57.14% (7 samples)"),
        "{line}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("summary")).expect("JSON");
    assert_eq!(v["top_k"], 2);
    assert_eq!(v["train_accuracy"], 0.25);
    assert_eq!(v["train_top_k_accuracy"], 0.75);
    assert!((v["val_accuracy"].as_f64().expect("val_accuracy") - 2.0 / 7.0).abs() < 1e-12);
    assert!((v["val_top_k_accuracy"].as_f64().expect("val_top_k") - 4.0 / 7.0).abs() < 1e-12);
}

#[test]
fn a_top_k_that_cannot_be_computed_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (program, weights, data) = fixture(dir.path());
    for (command, k) in [("eval", "0"), ("eval", "5"), ("run", "5")] {
        let (code, out, err) = dmc(&[
            command, &program, "--init", &weights, "--data", &data, "--top-k", k, "-q",
        ]);
        assert_eq!(code, 1, "{command} --top-k {k}: {out}{err}");
        assert!(
            err.contains(&format!(
                "--top-k {k}: K must be between 1 and the number of classes, 4"
            )),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // A loss without class labels has no top-K accuracy.
    let mse = dir.path().join("mse.dm");
    std::fs::write(
        &mse,
        "input x: [2]\ntarget y: [4]\nout = x |> dense(4)\nloss mse(out, y)\ntrain { batch: 4, optimizer: sgd }\n",
    )
    .expect("write");
    for command in ["eval", "run"] {
        let (code, _, err) = dmc(&[command, s(&mse), "--top-k", "1", "-q"]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("--top-k 1: top-K accuracy needs class labels") && err.contains("`mse`"),
            "{err}"
        );
    }
}
