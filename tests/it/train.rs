//! `dmc run` / `eval` / `predict` end to end: learning, determinism, resuming, and bad inputs.

use std::path::Path;

use crate::common;
use common::dmc;

/// The `final loss X` of a `dmc run` summary line.
fn final_loss(out: &str) -> f64 {
    let i = out
        .find("final loss ")
        .unwrap_or_else(|| panic!("no final loss in {out:?}"));
    out[i + 11..]
        .split(',')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .expect("a number")
}

/// `(X, Y)` of the first `loss X, accuracy Y%` in `text`.
fn loss_and_accuracy(text: &str) -> (f64, f64) {
    let after = |key: &str, end: char| -> f64 {
        text.split(key)
            .nth(1)
            .and_then(|s| s.split(end).next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no `{key}` number in {text:?}"))
    };
    (after("loss ", ','), after("accuracy ", '%'))
}

/// The last `validation loss X, accuracy Y%` line of a run.
fn last_validation(err: &str) -> (f64, f64) {
    let line = err
        .lines()
        .rev()
        .find(|l| l.contains("validation loss"))
        .expect("a validation line");
    loss_and_accuracy(
        line.split("validation ")
            .nth(1)
            .expect("validation metrics"),
    )
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// Trains `example` for 3 epochs with a 20% validation split and checks the last validation metrics.
fn learns(example: &str, max_loss: f64, min_accuracy: f64) {
    let (code, out, err) = dmc(&["run", example, "--epochs", "3", "--val-split", "0.2", "-q"]);
    assert_eq!(code, 0, "{err}");
    let (loss, acc) = last_validation(&err);
    assert!(
        loss < max_loss,
        "{example}: validation loss {loss} after 3 epochs\n{err}{out}"
    );
    assert!(
        acc > min_accuracy,
        "{example}: validation accuracy {acc}%\n{err}"
    );
}

#[test]
fn mlp_learns_the_synthetic_task() {
    // Chance level is ln(10) = 2.30 and 10% accuracy.
    learns("examples/mlp.dm", 0.1, 95.0);
}

#[test]
fn resnet_small_learns_the_synthetic_task() {
    learns("examples/resnet_small.dm", 0.6, 75.0);
}

#[test]
fn same_seed_gives_bit_identical_weights_and_init_resumes() {
    let d = tmp();
    let (a, b) = (
        d.path().join("a.safetensors"),
        d.path().join("b.safetensors"),
    );
    for w in [&a, &b] {
        let (code, _, err) = dmc(&[
            "run",
            "examples/resnet_small.dm",
            "--steps",
            "120",
            "--seed",
            "5",
            "--save",
            &p(w),
            "-q",
        ]);
        assert_eq!(code, 0, "{err}");
    }
    let (wa, wb) = (std::fs::read(&a).expect("a"), std::fs::read(&b).expect("b"));
    assert_eq!(wa, wb, "two runs with the same seed differ");
    let c = d.path().join("c.safetensors");
    let (code, _, err) = dmc(&[
        "run",
        "examples/resnet_small.dm",
        "--steps",
        "120",
        "--seed",
        "6",
        "--save",
        &p(&c),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_ne!(
        wa,
        std::fs::read(&c).expect("c"),
        "another seed gives the same weights"
    );

    // Resuming: one step from the trained weights has a far lower loss than one from scratch.
    let (_, fresh, _) = dmc(&[
        "run",
        "examples/resnet_small.dm",
        "--steps",
        "1",
        "--seed",
        "5",
        "-q",
    ]);
    let (code, resumed, err) = dmc(&[
        "run",
        "examples/resnet_small.dm",
        "--steps",
        "1",
        "--seed",
        "5",
        "--init",
        &p(&a),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        final_loss(&resumed) < 0.8 * final_loss(&fresh),
        "resumed {resumed} vs fresh {fresh}"
    );
}

#[test]
fn eval_and_predict_use_saved_weights() {
    let d = tmp();
    let w = d.path().join("w.safetensors");
    let (code, _, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--epochs",
        "2",
        "--save",
        &p(&w),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = dmc(&["eval", "examples/mlp.dm", "--init", &p(&w), "-q"]);
    assert_eq!(code, 0, "{err}");
    let (_, acc) = loss_and_accuracy(&out);
    assert!(acc > 90.0, "{out}");
    let predict = |file: &Path, extra: &[&str]| {
        let (init, out) = (p(&w), p(file));
        let args = [
            &[
                "predict",
                "examples/mlp.dm",
                "--init",
                &init,
                "-o",
                &out,
                "-q",
            ][..],
            extra,
        ]
        .concat();
        let (code, out, err) = dmc(&args);
        assert_eq!(code, 0, "{err}");
        out
    };
    let pred = d.path().join("pred.npy");
    let out = predict(&pred, &[]);
    assert!(out.contains("wrote 64 predictions of shape [10]"), "{out}");
    assert!(out.contains("logits"), "predict says what it wrote: {out}");
    let arr = dmc_runtime::io::read_npy(&pred).expect("npy");
    assert_eq!(arr.shape, vec![64, 10]);
    // --softmax: each row is the softmax of the logits row (computed here in f64).
    let probs = d.path().join("probs.npy");
    let out = predict(&probs, &["--softmax"]);
    assert!(out.contains("probabilities"), "{out}");
    let f32s = |a: &dmc_runtime::io::NpyArray| -> Vec<f32> {
        a.data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let logits = f32s(&arr);
    let pr = f32s(&dmc_runtime::io::read_npy(&probs).expect("npy"));
    for (l, q) in logits.chunks(10).zip(pr.chunks(10)) {
        let m = l.iter().fold(f64::MIN, |a, &b| a.max(b as f64));
        let z: f64 = l.iter().map(|&v| (v as f64 - m).exp()).sum();
        for (&lv, &qv) in l.iter().zip(q) {
            let want = (lv as f64 - m).exp() / z;
            assert!((qv as f64 - want).abs() < 1e-6, "{qv} vs {want}");
        }
        let sum: f64 = q.iter().map(|&v| v as f64).sum();
        assert!((sum - 1.0).abs() < 1e-5, "{sum}");
    }
}

#[test]
fn eval_and_predict_refuse_flags_that_mean_nothing_for_them() {
    for cmd in ["eval", "predict"] {
        for flag in ["--no-fuse", "--lr=0.1", "--remat=off"] {
            let (code, _, err) = dmc(&[cmd, "examples/mlp.dm", flag]);
            assert_eq!(code, 2, "{cmd} {flag}: {err}");
            let name = flag.split('=').next().unwrap_or(flag);
            assert!(
                err.contains(&format!("unexpected argument '{name}'")),
                "{cmd} {flag}: {err}"
            );
        }
    }
    // --seed only seeds fresh weights and synthetic data: with --init and --data it is refused.
    let d = tmp();
    let x = d.path().join("image.npy");
    dmc_runtime::io::write_npy_f32(&x, &[4, 784], &[0.5; 4 * 784]).expect("x");
    let (code, _, err) = dmc(&[
        "predict",
        "examples/mlp.dm",
        "--init",
        "w.safetensors",
        "--data",
        &p(&x),
        "--seed",
        "3",
        "-o",
        &p(&d.path().join("o.npy")),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("drop --seed"), "{err}");
}

#[test]
fn data_files_with_wrong_names_or_shapes_are_clear_errors() {
    let d = tmp();
    let x = d.path().join("x.npy");
    let y = d.path().join("label.npy");
    dmc_runtime::io::write_npy_f32(&x, &[32, 783], &vec![0.5; 32 * 783]).expect("x");
    dmc_runtime::io::write_npy_i32(&y, &[32], &[1; 32]).expect("y");
    let spec = format!("image={},label={}", p(&x), p(&y));
    let (code, _, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--data",
        &spec,
        "--steps",
        "1",
        "-q",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("784") && err.contains("783"), "{err}");
    let spec = format!("pixels={},label={}", p(&x), p(&y));
    let (code, _, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--data",
        &spec,
        "--steps",
        "1",
        "-q",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("image"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn corrupt_init_and_unwritable_save_fail_before_training() {
    let d = tmp();
    let w = d.path().join("w.safetensors");
    let (code, _, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--steps",
        "2",
        "--save",
        &p(&w),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let bytes = std::fs::read(&w).expect("w");
    let cut = d.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("cut");
    let (code, out, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--steps",
        "2",
        "--init",
        &p(&cut),
        "-q",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("cut.safetensors"), "{err}");
    assert!(out.is_empty(), "trained anyway: {out}");

    // Weights of another program: shape mismatch names the parameter.
    let (code, _, err) = dmc(&[
        "run",
        "examples/resnet_small.dm",
        "--steps",
        "1",
        "--init",
        &p(&w),
        "-q",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("stem.weight") || err.contains("missing"),
        "{err}"
    );

    // A save path whose parent is a regular file: refused before any step.
    let bad = w.join("x.safetensors");
    let (code, out, err) = dmc(&["run", "examples/mlp.dm", "--steps", "2", "--save", &p(&bad)]);
    assert_eq!(code, 1);
    assert!(
        out.is_empty() && !err.contains("training examples"),
        "{err}"
    );
}

/// A NaN loss on `device` stops training with a clear message and does not save the weights that
/// gave it.
fn nan_loss_stops_and_does_not_save(device: &str) {
    let d = tmp();
    let src = d.path().join("lin.dm");
    std::fs::write(
        &src,
        "input x: [8]\ntarget y: [1]\nout = x |> dense(16) |> dense(1)\nloss mse(out, y)\ntrain { batch: 16, optimizer: sgd(lr: 1e6) }\n",
    )
    .expect("write");
    let save = d.path().join("lin.safetensors");
    let (code, _, err) = dmc(&[
        "run",
        &p(&src),
        "--steps",
        "50",
        "--save",
        &p(&save),
        "-q",
        "--device",
        device,
    ]);
    assert_eq!(code, 1, "{device}: {err}");
    assert!(
        err.contains("NaN or infinite") && err.contains("--lr"),
        "{device}: {err}"
    );
    // The weights that gave the non-finite loss are never saved.
    assert!(!save.exists(), "{device}: {err}");
    assert!(err.contains("were NOT saved"), "{device}: {err}");
}

#[test]
fn nan_loss_stops_with_a_clear_message_and_does_not_save_the_weights_that_gave_it() {
    nan_loss_stops_and_does_not_save("cpu");
}

/// The generated CUDA kernels through the emulator (the CUDA backend's halt is the same code: the
/// step is launched up to the loss, which is read before the rest).
#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn nan_loss_stops_the_emulated_cuda_step_and_does_not_save() {
    nan_loss_stops_and_does_not_save("cuda-emu");
}

#[test]
fn cuda_device_is_a_clear_error_and_auto_falls_back() {
    let (code, _, err) = dmc(&["run", "examples/mlp.dm", "--steps", "1", "--device", "cuda"]);
    assert_eq!(code, 1);
    assert!(err.contains("--device cpu"), "{err}");
    let (code, _, err) = dmc(&["run", "examples/mlp.dm", "--steps", "1", "--device", "auto"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("device: cpu"), "{err}");
}

#[test]
fn loss_log_has_one_line_per_step() {
    let d = tmp();
    let log = d.path().join("loss.txt");
    let (code, out, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--steps",
        "7",
        "--loss-log",
        &p(&log),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&log).expect("log written");
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 7, "{text}");
    let last: f64 = lines[6]
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("loss column");
    assert!(
        (last - final_loss(&out)).abs() <= 1e-5 * last.abs().max(1.0),
        "{text} vs {out}"
    );
}

#[test]
fn dmc_data_writes_the_synthetic_set_that_run_uses_without_data() {
    let d = tmp();
    let data = d.path().join("data.safetensors");
    let (code, out, err) = dmc(&["data", "examples/mlp.dm", "-o", &p(&data)]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("`image` [1024, 784] f32, `label` [1024] i32") && out.contains("seed 1"),
        "{out}"
    );
    // Training on the file is training on the synthetic set: the same losses, bit for bit.
    let run = |extra: &[&str]| {
        let args = [&["run", "examples/mlp.dm", "--steps", "5", "-q"], extra].concat();
        let (code, out, err) = dmc(&args);
        assert_eq!(code, 0, "{err}");
        final_loss(&out)
    };
    assert_eq!(run(&[]), run(&["--data", &p(&data)]));
    // The same with another seed and size, given to both.
    let small = d.path().join("small.safetensors");
    let (code, _, err) = dmc(&[
        "data",
        "examples/mlp.dm",
        "-o",
        &p(&small),
        "--samples",
        "320",
        "--seed",
        "7",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        run(&["--synthetic-samples", "320", "--seed", "7"]),
        run(&["--data", &p(&small), "--seed", "7"])
    );

    // A .npy holds the one tensor its name names, and predict reads it by that name.
    let image = d.path().join("image.npy");
    let (code, _, err) = dmc(&[
        "data",
        "examples/mlp.dm",
        "-o",
        &p(&image),
        "--samples",
        "8",
    ]);
    assert_eq!(code, 0, "{err}");
    let pred = d.path().join("pred.npy");
    let (code, out, err) = dmc(&[
        "predict",
        "examples/mlp.dm",
        "--data",
        &p(&image),
        "-o",
        &p(&pred),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wrote 8 predictions of shape [10]"), "{out}");

    // Refused, with what to do, and nothing written: a .npy named after no tensor, another
    // extension, a directory that does not exist.
    for (bad, says) in [
        ("x.npy", "write image.npy or label.npy"),
        ("data.csv", "*.safetensors"),
        ("no/such/dir/data.safetensors", "no/such/dir"),
    ] {
        let path = d.path().join(bad);
        let (code, _, err) = dmc(&["data", "examples/mlp.dm", "-o", &p(&path)]);
        assert_eq!(code, 1, "{bad}: {err}");
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{bad}: {err}"
        );
        assert!(!path.exists(), "{bad}");
    }
}

#[test]
fn a_data_file_that_does_not_exist_is_not_found() {
    let d = tmp();
    let pred = d.path().join("pred.npy");
    for data in ["x.npy", "image=x.npy", "x.safetensors"] {
        let missing = d.path().join(data.trim_start_matches("image="));
        let arg = if data.starts_with("image=") {
            format!("image={}", p(&missing))
        } else {
            p(&missing)
        };
        let (code, _, err) = dmc(&[
            "predict",
            "examples/mlp.dm",
            "--data",
            &arg,
            "-o",
            &p(&pred),
            "-q",
        ]);
        assert_eq!(code, 1, "{data}: {err}");
        assert!(
            err.contains("not found") && err.contains(&p(&missing)),
            "{data}: {err}"
        );
        assert!(!err.contains("has no tensor"), "{data}: {err}");
    }
}

/// `(train loss, train accuracy %, samples)` of an `epoch ...: train loss X, accuracy Y% (N samples)` line.
fn epoch_train_metrics(line: &str) -> (f64, f64, usize) {
    let m = line.split("train loss").nth(1).expect("train metrics");
    let (loss, acc) = loss_and_accuracy(&format!("loss{m}"));
    let n = m
        .split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .expect("samples");
    (loss, acc, n)
}

#[test]
fn every_epoch_prints_its_train_loss_and_accuracy_which_match_an_independent_eval() {
    // With a learning rate of 1e-30 the weights do not move, so the epoch's running train metrics
    // (one epoch = every synthetic sample once) must equal `dmc eval` of the same initial weights
    // on the same data: the accuracy exactly, the loss to rounding.
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("loss.txt");
    let (code, _, err) = dmc(&[
        "run",
        "examples/mlp.dm",
        "--epochs",
        "2",
        "--lr",
        "1e-30",
        "--seed",
        "5",
        "--loss-log",
        &log.display().to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    // stderr is not a terminal here: the lines are printed anyway, one per epoch.
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("epoch ")).collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("epoch 1/2: ") && lines[1].starts_with("epoch 2/2: "),
        "{err}"
    );
    let (loss, acc, n) = epoch_train_metrics(lines[0]);
    assert_eq!(n, 1024, "{err}");
    // The train loss is the mean of the epoch's step losses (the loss log).
    let steps: Vec<f64> = std::fs::read_to_string(&log)
        .expect("loss log")
        .lines()
        .take(16)
        .map(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .expect("loss")
        })
        .collect();
    let mean = steps.iter().sum::<f64>() / steps.len() as f64;
    assert!((loss - mean).abs() < 1e-5, "{loss} vs {mean}");

    let (code, out, err) = dmc(&["eval", "examples/mlp.dm", "--seed", "5"]);
    assert_eq!(code, 0, "{err}");
    let (eval_loss, eval_acc) = loss_and_accuracy(&out);
    assert_eq!(acc, eval_acc, "train {} vs eval {out}", lines[0]);
    assert!(
        (loss - eval_loss).abs() < 1e-4,
        "train {} vs eval {out}",
        lines[0]
    );
    // An accuracy that changes nothing would still be a poor test: this one is not trivially 0 or 100.
    assert!(acc > 0.0 && acc < 100.0, "{acc}");
}

#[test]
fn a_run_stopped_inside_an_epoch_says_how_much_of_it_the_line_covers() {
    let (code, out, err) = dmc(&["run", "examples/mlp.dm", "--steps", "5"]);
    assert_eq!(code, 0, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("epoch 1/1 (5 of its 16 steps): train loss "))
        .unwrap_or_else(|| panic!("{err}"));
    assert_eq!(epoch_train_metrics(line).2, 5 * 64, "{line}");
    // The run ends with the memory line, in one unit.
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("memory: planned ") && last.ends_with("no --vram-cap given"),
        "{out}"
    );
    let units: std::collections::BTreeSet<&str> = last
        .split_whitespace()
        .filter(|w| w.trim_end_matches([',', ';', ')']).ends_with("iB"))
        .map(|w| w.trim_end_matches([',', ';', ')']))
        .collect();
    assert_eq!(units.len(), 1, "{last}");
}

/// The memory line's "other allocations during steps" is the steps' host peak: the final
/// `--save`, after the steps, copies the weights (at least their 940,584 bytes for the MLP) and
/// must not be counted in it.
#[test]
fn the_final_save_is_not_counted_as_memory_of_the_steps() {
    let dir = tempfile::tempdir().unwrap();
    let other = |extra: &[&str]| -> u64 {
        let json = dir.path().join("s.json");
        let js = json.to_str().unwrap();
        let args = [
            &[
                "run",
                "examples/mlp.dm",
                "--steps",
                "2",
                "-q",
                "--summary-json",
                js,
            ][..],
            extra,
        ]
        .concat();
        let (code, _, err) = dmc(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        v["other_allocation_bytes"].as_u64().unwrap()
    };
    let w = dir.path().join("w.safetensors");
    let without = other(&[]);
    let with = other(&["--save", w.to_str().unwrap()]);
    assert!(w.exists());
    // The steps' own allocations vary by a few hundred KB between runs (thread scheduling); a
    // counted save would add at least the parameters' 940,584 bytes.
    assert!(
        with < without + 700_000,
        "with --save {with} B, without {without} B"
    );
}
