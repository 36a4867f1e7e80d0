//! The reproducers of issue 18 (an adversarial pass over main), each as a regression test at the
//! CLI level: every one must end with a clear error (exit 1 or 2, the message says what and what to
//! do) or behave correctly, and no input may replace or lose an existing weights file except a
//! successful save of finite weights from at least one completed step (or an explicit `--steps 0`).

use crate::common;
use common::dmc;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `dmc run examples/mlp.dm -q` with more arguments.
fn run_mlp(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["run", "examples/mlp.dm", "-q"];
    all.extend_from_slice(args);
    dmc(&all)
}

/// A small file of good weights for examples/mlp.dm, trained by one step.
fn good_weights(dir: &Path) -> PathBuf {
    let w = dir.join("good.safetensors");
    let (code, _, err) = run_mlp(&[
        "--steps",
        "1",
        "--synthetic-samples",
        "64",
        "--save",
        &s(&w),
    ]);
    assert_eq!(code, 0, "{err}");
    w
}

/// The files in `dir` whose names look like dmc's temp files.
fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect()
}

fn write_program(dir: &Path, name: &str, src: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, src).expect("write program");
    s(&p)
}

fn mkfifo(p: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path");
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(r, 0, "mkfifo {}", p.display());
}

#[test]
fn predict_and_eval_run_on_every_example_after_run_save() {
    let dir = tempfile::tempdir().expect("tempdir");
    for ex in ["mlp", "resnet_small", "deep_convnet", "seed"] {
        let file = format!("examples/{ex}.dm");
        let w = s(&dir.path().join(format!("{ex}.safetensors")));
        let small = ["--batch", "1", "--synthetic-samples", "2", "-q"];
        let mut run = vec!["run", &file, "--steps", "1", "--save", &w];
        run.extend(small);
        let (code, _, err) = dmc(&run);
        assert_eq!(code, 0, "{ex} run: {err}");
        let mut eval = vec!["eval", &file, "--init", &w];
        eval.extend(small);
        let (code, out, err) = dmc(&eval);
        assert_eq!(code, 0, "{ex} eval: {err}");
        assert!(
            out.contains("loss ") && out.contains("(2 samples)"),
            "{out}"
        );
        let pred = s(&dir.path().join(format!("{ex}.npy")));
        let mut predict = vec!["predict", &file, "--init", &w, "-o", &pred];
        predict.extend(small);
        let (code, out, err) = dmc(&predict);
        assert_eq!(code, 0, "{ex} predict: {err}");
        assert!(out.contains("wrote 2 predictions"), "{out}");
        let arr = dmc_runtime::io::read_npy(Path::new(&pred)).expect("predictions");
        assert_eq!(arr.shape[0], 2);
    }
}

#[test]
fn unusable_learning_rates_are_refused_on_the_command_line() {
    for lr in ["nan", "inf", "-inf", "0", "1e39", "-1", "1e-50", "abc"] {
        let flag = format!("--lr={lr}");
        let (code, _, err) = run_mlp(&["--steps", "1", &flag]);
        assert_eq!(code, 2, "--lr {lr}: {err}");
        assert!(
            err.contains("learning rate") || err.contains("not a number"),
            "{lr}: {err}"
        );
        assert!(err.contains("pass a positive number"), "{lr}: {err}");
    }
}

#[test]
fn unusable_learning_rates_are_refused_in_programs() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (lr, what) in [("1e39", "too large"), ("1e-50", "too small")] {
        let p = write_program(
            dir.path(),
            "lr.dm",
            &format!(
                "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\ntrain {{ batch: 2, optimizer: sgd(lr: {lr}) }}\n"
            ),
        );
        let (code, _, err) = dmc(&["check", &p]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(what), "{lr}: {err}");
        assert!(err.contains("lr.dm:5:"), "file:line:col: {err}");
    }
    // The other optimizer settings must survive f32 too.
    let p = write_program(
        dir.path(),
        "eps.dm",
        "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 2, optimizer: adam(lr: 0.001, eps: 1e-50) }\n",
    );
    let (code, _, err) = dmc(&["check", &p]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not fit in f32"), "{err}");
}

#[test]
fn non_finite_weights_never_replace_a_good_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = good_weights(dir.path());
    let before = std::fs::read(&good).expect("read");
    // lr 3e38: the first update sends the weights far out, the next loss is not finite; the
    // weights that gave it are not saved over the good file.
    let (code, _, err) = run_mlp(&[
        "--steps",
        "5",
        "--lr=3e38",
        "--synthetic-samples",
        "64",
        "--save",
        &s(&good),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("NaN or infinite"), "{err}");
    assert!(
        err.contains("were NOT saved") && err.contains("is untouched"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&good).expect("read"),
        before,
        "the good file changed"
    );
    assert!(temp_files(dir.path()).is_empty());
}

#[test]
fn a_first_loss_that_is_not_finite_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let x = dir.path().join("x.npy");
    let y = dir.path().join("y.npy");
    // Finite inputs whose products overflow f32: the first loss is already infinite.
    dmc_runtime::io::write_npy_f32(&x, &[8, 4], &[3e38; 32]).expect("x");
    dmc_runtime::io::write_npy_f32(&y, &[8, 1], &[0.0; 8]).expect("y");
    let p = write_program(
        dir.path(),
        "big.dm",
        "input x: [4]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 8, optimizer: sgd(lr: 0.01) }\n",
    );
    let data = format!("x={},y={}", s(&x), s(&y));
    let w = dir.path().join("w.safetensors");
    let (code, _, err) = dmc(&[
        "run",
        &p,
        "--data",
        &data,
        "--steps",
        "1",
        "-q",
        "--save",
        &s(&w),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("at step 1 (no finite loss before it)"),
        "{err}"
    );
    assert!(!err.contains("last finite loss NaN"), "{err}");
    assert!(!w.exists(), "nothing trained, nothing saved");
}

#[test]
fn a_failed_loss_log_still_saves_the_trained_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = dir.path().join("w.safetensors");
    let (code, _, err) = run_mlp(&[
        "--steps",
        "2",
        "--synthetic-samples",
        "128",
        "--loss-log",
        "/dev/full",
        "--save",
        &s(&w),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--loss-log"), "{err}");
    assert!(err.contains("the weights were saved to"), "{err}");
    let (code, _, err) = dmc(&[
        "eval",
        "examples/mlp.dm",
        "--init",
        &s(&w),
        "-q",
        "--synthetic-samples",
        "64",
    ]);
    assert_eq!(code, 0, "the saved weights load: {err}");
}

#[test]
fn zero_steps_writes_only_when_asked_and_warns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = good_weights(dir.path());
    let before = std::fs::read(&good).expect("read");
    // --epochs 0: no step, nothing written over the file.
    let (code, out, err) = run_mlp(&["--epochs", "0", "--save", &s(&good)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no training step completed"), "{out}");
    assert_eq!(std::fs::read(&good).expect("read"), before);
    // --steps 0 asks for the initial weights: written, with a warning (even with -q).
    let (code, _, err) = run_mlp(&["--steps", "0", "--seed", "5", "--save", &s(&good)]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("warning: --steps 0"), "{err}");
    assert_ne!(std::fs::read(&good).expect("read"), before);
}

/// Spawns `dmc run` and returns the child.
fn spawn_run(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_dmc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dmc")
}

fn signal(child: &std::process::Child, sig: libc::c_int) {
    // SAFETY: sending a signal to our own child process.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(r, 0);
}

#[test]
fn a_signal_before_the_first_step_completes_leaves_the_checkpoint_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = good_weights(dir.path());
    let before = std::fs::read(&good).expect("read");
    // The seed network: compiling, allocating and one step take seconds; the signal comes during
    // the first of them, so no step completes.
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let child = spawn_run(&[
            "run",
            "examples/seed.dm",
            "--steps",
            "3",
            "-q",
            "--save",
            &s(&good),
        ]);
        std::thread::sleep(Duration::from_millis(300));
        signal(&child, sig);
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        // 130 from our handler (or, if it was not installed yet, the signal's default action).
        assert!(
            out.status.code().is_none_or(|c| c == 130),
            "{:?} {err}",
            out.status
        );
        assert_eq!(
            std::fs::read(&good).expect("read"),
            before,
            "signal {sig}: {err}"
        );
        assert!(temp_files(dir.path()).is_empty());
    }
}

#[test]
fn sigterm_during_training_saves_the_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = dir.path().join("w.safetensors");
    let log = dir.path().join("loss.log");
    let child = spawn_run(&[
        "run",
        "examples/mlp.dm",
        "--steps",
        "100000000",
        "-q",
        "--synthetic-samples",
        "256",
        "--loss-log",
        &s(&log),
        "--save",
        &s(&w),
    ]);
    // Wait until steps are running (the log is buffered: a few KiB of lines), at most a minute.
    let t0 = Instant::now();
    while std::fs::metadata(&log).map_or(0, |m| m.len()) == 0
        && t0.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&child, libc::SIGTERM);
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted after") && err.contains("the weights were saved"),
        "{err}"
    );
    let (code, _, err) = dmc(&[
        "eval",
        "examples/mlp.dm",
        "--init",
        &s(&w),
        "-q",
        "--synthetic-samples",
        "64",
    ]);
    assert_eq!(code, 0, "the saved weights load: {err}");
}

#[test]
fn saves_never_replace_non_regular_files_and_write_through_links() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = good_weights(dir.path());
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let sub = dir.path().join("subdir");
    std::fs::create_dir(&sub).expect("mkdir");
    for target in [&fifo, &sub] {
        let (code, _, err) = run_mlp(&["--steps", "1", "--save", &s(target)]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("cannot save to"), "{err}");
        assert!(
            err.contains("choose") || err.contains("pass a file path"),
            "{err}"
        );
        let (code, _, err) = dmc(&["predict", "examples/mlp.dm", "-q", "-o", &s(target)]);
        assert_eq!(code, 1, "{err}");
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .expect("fifo")
        .file_type()
        .is_fifo_like());
    // A dangling link is refused; a link to a regular file is written through and stays a link.
    let dangling = dir.path().join("dangling.safetensors");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).expect("symlink");
    let (code, _, err) = run_mlp(&["--steps", "1", "--save", &s(&dangling)]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("dangling"), "{err}");
    let link = dir.path().join("link.safetensors");
    std::os::unix::fs::symlink(&good, &link).expect("symlink");
    let before = std::fs::read(&good).expect("read");
    let (code, _, err) = run_mlp(&[
        "--steps",
        "2",
        "--synthetic-samples",
        "128",
        "--save",
        &s(&link),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::symlink_metadata(&link)
        .expect("link")
        .file_type()
        .is_symlink());
    assert_ne!(
        std::fs::read(&good).expect("read"),
        before,
        "written through the link"
    );
    assert!(temp_files(dir.path()).is_empty());
}

/// `FileType::is_fifo` via the Unix extension trait, named for the assertion above.
trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}
impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_fifo(self)
    }
}

#[test]
fn stale_temp_files_of_killed_saves_are_swept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = dir.path().join("w.safetensors");
    // A pid above Linux's largest pid_max (2^22): no such process.
    let stale = dir.path().join(".w.safetensors.tmp.4194305");
    std::fs::write(&stale, vec![0u8; 1 << 16]).expect("stale");
    // pid 1 is alive: its temp file is someone's save in progress and stays.
    let alive = dir.path().join(".w.safetensors.tmp.1");
    std::fs::write(&alive, b"x").expect("alive");
    let (code, _, err) = run_mlp(&[
        "--steps",
        "1",
        "--synthetic-samples",
        "64",
        "--save",
        &s(&w),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!stale.exists(), "the stale temp file was swept");
    assert!(alive.exists(), "a live process' temp file was kept");
}

#[test]
fn unreadable_kinds_of_input_are_clear_errors_not_hangs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("data.npy");
    mkfifo(&fifo);
    let (code, _, err) = run_mlp(&["--steps", "1", "--data", &s(&fifo)]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("FIFO") && err.contains("not a regular file"),
        "{err}"
    );
    let (code, _, err) = run_mlp(&["--steps", "1", "--init", "/dev/zero"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("character device"), "{err}");
}

#[test]
fn data_that_cannot_fit_is_an_error_not_an_abort() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_program(
        dir.path(),
        "wide.dm",
        "input x: [2147483648]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n",
    );
    let (code, _, err) = dmc(&["run", &p, "--steps", "1", "-q"]);
    assert!(code == 1, "{code} {err}");
    assert!(err.contains("smaller") || err.contains("memory"), "{err}");
    for n in ["1000000000000", "18446744073709551615"] {
        let (code, _, err) = run_mlp(&["--steps", "1", "--synthetic-samples", n]);
        assert_eq!(code, 1, "{n}: {err}");
        assert!(err.contains("--synthetic-samples"), "{err}");
    }
}

#[test]
fn huge_counts_are_refused_with_a_reason() {
    let (code, _, err) = dmc(&["plan", "examples/mlp.dm", "--batch", "18446744073709551615"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("use a smaller --batch") && !err.contains("aligned"),
        "{err}"
    );
    let (code, _, err) = run_mlp(&["--epochs", "1152921504606846976"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("epochs"), "{err}");
    let (code, _, err) = dmc(&[
        "plan",
        "examples/mlp.dm",
        "--vram-cap",
        "18446744073709551616",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("too large"), "{err}");
}

#[test]
fn max_batch_has_no_hidden_ceiling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write_program(
        dir.path(),
        "tiny.dm",
        "input x: [1]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n",
    );
    let (code, out, err) = dmc(&["plan", &p, "--vram-cap", "1GiB", "--max-batch"]);
    assert_eq!(code, 0, "{err}");
    let b: usize = out
        .split("is ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no batch in {out}"));
    assert!(b > 1 << 20, "{out}");
    // It is the largest: one more does not fit.
    let (code, _, err) = dmc(&[
        "plan",
        &p,
        "--vram-cap",
        "1GiB",
        "--batch",
        &(b + 1).to_string(),
    ]);
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = dmc(&["plan", &p, "--vram-cap", "1GiB", "--batch", &b.to_string()]);
    assert_eq!(code, 0, "{err}");
}

/// A pool window the checker accepts must run: `avgpool(17)` was refused by the runtime's own
/// shape check ("bad pool geometry") after compiling; a `maxpool(17)` window, whose argmax does
/// not fit a byte, is now the checker's clear error instead of a "bad plan" at run time.
#[test]
fn large_pool_windows_run_or_are_refused_by_the_checker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = |pool: &str| {
        format!(
            "input x: [40, 40, 3]\ntarget y: [10]\nout = x |> {pool}(17) |> flatten |> dense(10)\n\
             loss mse(out, y)\ntrain {{ batch: 2, optimizer: sgd(lr: 0.01) }}\n"
        )
    };
    let avg = write_program(dir.path(), "avg.dm", &prog("avgpool"));
    let (code, _, err) = dmc(&[
        "run",
        &avg,
        "-q",
        "--steps",
        "1",
        "--synthetic-samples",
        "4",
    ]);
    assert_eq!(code, 0, "{err}");
    let max = write_program(dir.path(), "max.dm", &prog("maxpool"));
    let (code, _, err) = dmc(&[
        "run",
        &max,
        "-q",
        "--steps",
        "1",
        "--synthetic-samples",
        "4",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("max.dm:3:"), "{err}");
    assert!(err.contains("16x16"), "{err}");
    assert!(!err.contains("bad plan"), "{err}");
}
