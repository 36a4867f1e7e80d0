//! `dmc run --save-every N --save W` and `--resume`: a run stopped (after K steps, by SIGTERM, or
//! killed with SIGKILL at an unknown moment) and resumed ends with the same bytes in its weights
//! and training-state files as one uninterrupted run; the state is refused when it belongs to
//! another run; `--save-best` keeps the best validation loss across a resume.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::dmc;

const MLP: &str = "examples/mlp.dm";
const RESNET: &str = "examples/resnet_small.dm";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `dmc data PROGRAM -o FILE --samples N`.
fn data(dir: &Path, program: &str, samples: usize) -> std::path::PathBuf {
    let p = dir.join(format!(
        "{}-data.safetensors",
        Path::new(program).file_stem().unwrap().to_str().unwrap()
    ));
    let (code, _, err) = dmc(&[
        "data",
        program,
        "-o",
        s(&p),
        "--samples",
        &samples.to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    p
}

/// `dmc run` with `args` appended; panics unless it succeeds.
fn run_ok(args: &[&str]) -> String {
    let (code, out, err) = dmc(args);
    assert_eq!(code, 0, "dmc {args:?} failed:\n{out}\n{err}");
    err
}

fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn state_of(w: &Path) -> std::path::PathBuf {
    let name = w.file_name().unwrap().to_str().unwrap();
    w.with_file_name(name.replace(".safetensors", ".state.safetensors"))
}

/// The `steps` recorded in a training state file (its safetensors header's metadata).
fn steps_in_state(p: &Path) -> u64 {
    let b = bytes(p);
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let meta = header["__metadata__"]["dmc_train_state"].as_str().unwrap();
    let v: serde_json::Value = serde_json::from_str(meta).unwrap();
    v["steps"].as_u64().unwrap()
}

/// Asserts that the weights and state files of `a` and `b` hold the same bytes.
fn assert_same_files(a: &Path, b: &Path) {
    assert!(
        bytes(a) == bytes(b),
        "{} and {} differ",
        a.display(),
        b.display()
    );
    let (sa, sb) = (state_of(a), state_of(b));
    assert!(
        bytes(&sa) == bytes(&sb),
        "{} and {} differ",
        sa.display(),
        sb.display()
    );
}

#[test]
fn stopped_after_k_steps_and_resumed_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), MLP, 320);
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    let common = [
        "run",
        MLP,
        "--data",
        s(&d),
        "--val-split",
        "0.2",
        "--save-every",
        "10",
        "-q",
    ];
    // 256 training samples in batches of 64: 4 steps per epoch; 30 steps end mid-epoch.
    run_ok(&[&common[..], &["--steps", "30", "--save", s(&a)]].concat());
    // Stopped after 17 steps (mid-epoch, between two periodic saves), resumed twice.
    run_ok(&[&common[..], &["--steps", "17", "--save", s(&b)]].concat());
    assert_eq!(steps_in_state(&state_of(&b)), 17);
    assert!(bytes(&a) != bytes(&b), "17 steps must differ from 30");
    run_ok(&[&common[..], &["--steps", "24", "--save", s(&b), "--resume"]].concat());
    let err = run_ok(&[&common[..], &["--steps", "30", "--save", s(&b), "--resume"]].concat());
    assert_eq!(steps_in_state(&state_of(&b)), 30);
    assert_same_files(&a, &b);
    let _ = err;

    // Without the optimizer state (weights only, with --init) the run is not the same: the
    // momentum matters, so the state file is what makes the resume exact.
    let c = dir.path().join("c.safetensors");
    run_ok(&[&common[..], &["--steps", "17", "--save", s(&c)]].concat());
    let c17 = dir.path().join("c17.safetensors");
    std::fs::copy(&c, &c17).unwrap();
    run_ok(
        &[
            &common[..],
            &["--steps", "13", "--save", s(&c), "--init", s(&c17)],
        ]
        .concat(),
    );
    assert!(
        bytes(&a) != bytes(&c),
        "--init from step 17 must not equal the resumed run"
    );
}

/// Starts `dmc` with `args`, waits until the training state beside `w` records at least 30
/// steps, then sends `sig`; returns the step the state records afterwards.
fn interrupt_after_some_saves(
    args: &[String],
    w: &Path,
    sig: libc::c_int,
) -> (u64, std::process::ExitStatus) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dmc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let state = state_of(w);
    let t0 = Instant::now();
    while !(state.exists() && steps_in_state(&state) >= 30) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no training state appeared"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it was stopped"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: sending a signal to our own child process, which has not been waited for yet.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(r, 0);
    let status = child.wait().unwrap();
    (steps_in_state(&state), status)
}

#[test]
fn stopped_by_sigkill_or_sigterm_at_any_moment_then_resumed_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), MLP, 320);
    let total = "1500";
    let args = |w: &Path| -> Vec<String> {
        [
            "run",
            MLP,
            "--data",
            s(&d),
            "--save-every",
            "10",
            "--steps",
            total,
            "-q",
            "--save",
            s(w),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect()
    };
    let a = dir.path().join("a.safetensors");
    run_ok(&args(&a).iter().map(String::as_str).collect::<Vec<_>>());

    for (sig, name) in [(libc::SIGKILL, "b"), (libc::SIGTERM, "c")] {
        let b = dir.path().join(format!("{name}.safetensors"));
        let (at, status) = interrupt_after_some_saves(&args(&b), &b, sig);
        assert!(
            !status.success(),
            "the run was to be stopped, it ended: {status:?}"
        );
        assert!((30..1500).contains(&at), "state after step {at}");
        if sig == libc::SIGKILL {
            // Killed at an unknown moment, maybe mid-write: the last periodic save.
            assert_eq!(at % 10, 0, "state after step {at}");
        } else {
            // Stopped after its current step, and saved there.
            assert_eq!(status.code(), Some(130), "{status:?}");
        }
        let mut resumed = args(&b);
        resumed.push("--resume".into());
        run_ok(&resumed.iter().map(String::as_str).collect::<Vec<_>>());
        assert_same_files(&a, &b);
    }
    // No temp file of the killed process is left beside the weights.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(left.is_empty(), "temp files left: {left:?}");
}

#[test]
fn the_state_alone_resumes_even_when_the_weights_file_is_older() {
    // A run killed between its two renames leaves a new state beside older weights: --resume
    // reads only the state, so it still continues exactly.
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), MLP, 320);
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    let common = ["run", MLP, "--data", s(&d), "--save-every", "5", "-q"];
    run_ok(&[&common[..], &["--steps", "20", "--save", s(&a)]].concat());
    run_ok(&[&common[..], &["--steps", "5", "--save", s(&b)]].concat());
    let old = bytes(&b);
    run_ok(&[&common[..], &["--steps", "10", "--save", s(&b), "--resume"]].concat());
    std::fs::write(&b, old).unwrap(); // the weights of step 5 beside the state of step 10
    run_ok(&[&common[..], &["--steps", "20", "--save", s(&b), "--resume"]].concat());
    assert_same_files(&a, &b);
}

#[test]
fn adam_and_save_best_resume_across_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), RESNET, 48);
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    // 32 training samples in batches of 8: 4 steps per epoch; saves every 3 steps.
    let common = [
        "run",
        RESNET,
        "--data",
        s(&d),
        "--val-split",
        "0.33",
        "--save-every",
        "3",
        "--save-best",
        "-q",
    ];
    let full = run_ok(&[&common[..], &["--epochs", "3", "--save", s(&a)]].concat());
    run_ok(&[&common[..], &["--steps", "5", "--save", s(&b)]].concat());
    let resumed = run_ok(&[&common[..], &["--epochs", "3", "--save", s(&b), "--resume"]].concat());
    assert_same_files(&a, &b);
    // The resumed run reports the validations of epochs 2 and 3 exactly as the full run did.
    let tail = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.starts_with("epoch 2") || l.starts_with("epoch 3"))
            .filter_map(|l| l.split("; validation ").nth(1))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(tail(&full).len(), 2, "{full}");
    assert_eq!(tail(&full), tail(&resumed));
    // Epoch 3 ran whole in the resumed process: its train metrics are the full run's too; epoch 2
    // resumed inside, and its line says how many of its steps it covers.
    let line = |log: &str, e: &str| -> String {
        log.lines()
            .find(|l| l.starts_with(e))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(line(&full, "epoch 3/3: "), line(&resumed, "epoch 3/3: "));
    assert!(
        line(&resumed, "epoch 2/3 (").contains(" of its "),
        "{resumed}"
    );
}

#[test]
fn rmsprop_and_lion_state_is_saved_and_resumed_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    for (name, opt, states) in [
        (
            "rmsprop",
            "rmsprop(lr: 0.01, momentum: 0.9)",
            &["square_avg", "momentum_buffer"][..],
        ),
        (
            "lion",
            "lion(lr: 0.0003, weight_decay: 0.1)",
            &["exp_avg"][..],
        ),
    ] {
        let prog = dir.path().join(format!("{name}.dm"));
        std::fs::write(
            &prog,
            format!(
                "input x: [12]\ntarget y: [2]\nout = x |> dense(8, activation: leaky_relu(0.1)) |> dense(2)\n\
                 loss huber(out, y)\ntrain {{ batch: 8, optimizer: {opt}, seed: 3 }}\n"
            ),
        )
        .unwrap();
        let d = data(dir.path(), s(&prog), 64);
        let (a, b) = (
            dir.path().join(format!("{name}-a.safetensors")),
            dir.path().join(format!("{name}-b.safetensors")),
        );
        let common = ["run", s(&prog), "--data", s(&d), "--save-every", "5", "-q"];
        run_ok(&[&common[..], &["--steps", "20", "--save", s(&a)]].concat());
        run_ok(&[&common[..], &["--steps", "7", "--save", s(&b)]].concat());
        assert!(
            bytes(&a) != bytes(&b),
            "{name}: 7 steps must differ from 20"
        );
        run_ok(&[&common[..], &["--steps", "20", "--save", s(&b), "--resume"]].concat());
        assert_same_files(&a, &b);
        // the state file holds the optimizer's own tensors, under PyTorch's names
        let st = String::from_utf8_lossy(&bytes(&state_of(&a))).to_string();
        for s in states {
            assert!(
                st.contains(&format!(".{s}")),
                "{name}: no `{s}` in the state"
            );
        }
    }
}

#[test]
fn resume_refuses_another_runs_state_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), MLP, 320);
    let w = dir.path().join("w.safetensors");
    let common = ["run", MLP, "--data", s(&d), "--save", s(&w), "-q"];

    // No state yet.
    let (code, _, err) = dmc(&[&common[..], &["--steps", "4", "--resume"]].concat());
    assert_ne!(code, 0);
    assert!(
        err.contains("no training state") && err.contains("w.state.safetensors"),
        "{err}"
    );
    assert!(!w.exists(), "a refused resume must not write");

    run_ok(&[&common[..], &["--steps", "4", "--save-every", "2"]].concat());
    let before = (bytes(&w), bytes(&state_of(&w)));
    for (flags, says) in [
        (vec!["--seed", "7"], "seed 1 (now 7)"),
        (vec!["--lr", "0.5"], "optimizer"),
        (vec!["--batch", "32"], "batch 64 (now 32)"),
    ] {
        let (code, _, err) =
            dmc(&[&common[..], &["--steps", "8", "--resume"], &flags[..]].concat());
        assert_ne!(code, 0, "{flags:?}");
        assert!(
            err.contains(says) && err.contains("--init"),
            "{flags:?}: {err}"
        );
    }
    // Another program's state.
    let other = dir.path().join("other.dm");
    std::fs::write(
        &other,
        "input image: [784]\ntarget label: int\nlogits = image |> dense(10) as classifier\nloss cross_entropy(logits, label)\ntrain { batch: 64, optimizer: sgd(lr: 0.01, momentum: 0.9), seed: 1 }\n",
    )
    .unwrap();
    let (code, _, err) = dmc(&[
        "run",
        s(&other),
        "--data",
        s(&d),
        "--save",
        s(&w),
        "-q",
        "--steps",
        "8",
        "--resume",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("not a usable training checkpoint"), "{err}");
    // A weights file is no state.
    let (code, _, err) = dmc(&[
        "run",
        MLP,
        "--data",
        s(&d),
        "--save",
        s(&dir.path().join("x.safetensors")),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    std::fs::copy(
        dir.path().join("x.safetensors"),
        dir.path().join("x.state.safetensors"),
    )
    .unwrap();
    let (code, _, err) = dmc(&[
        "run",
        MLP,
        "--data",
        s(&d),
        "--save",
        s(&dir.path().join("x.safetensors")),
        "-q",
        "--resume",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("not a dmc training checkpoint"), "{err}");
    // Nothing was replaced by the refused runs.
    assert!(before == (bytes(&w), bytes(&state_of(&w))));

    // Flag rules: --resume with --init, --save-best without validation, --save-every 0.
    let (code, _, err) = dmc(&[&common[..], &["--resume", "--init", s(&w)]].concat());
    assert_ne!(code, 0, "{err}");
    let (code, _, err) = dmc(&[&common[..], &["--save-best"]].concat());
    assert_ne!(code, 0);
    assert!(err.contains("--val"), "{err}");
    let (code, _, _) = dmc(&[&common[..], &["--save-every", "0"]].concat());
    assert_ne!(code, 0);
    let (code, _, err) = dmc(&["run", MLP, "--save-every", "3", "-q", "--steps", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("--save"), "{err}");
}

#[test]
#[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
fn resume_is_bit_identical_on_the_emulated_cuda_backend() {
    // The CUDA and emulated backends read and write the optimizer state through `HostArena`: Adam's
    // moments round-trip through the state file there too.
    let dir = tempfile::tempdir().unwrap();
    let program = "tests/fixtures/interop/resnet_tiny.dm";
    let d = data(dir.path(), program, 16);
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    let common = [
        "run",
        program,
        "--data",
        s(&d),
        "--device",
        "cuda-emu",
        "--save-every",
        "3",
        "-q",
    ];
    run_ok(&[&common[..], &["--steps", "6", "--save", s(&a)]].concat());
    run_ok(&[&common[..], &["--steps", "3", "--save", s(&b)]].concat());
    run_ok(&[&common[..], &["--steps", "6", "--save", s(&b), "--resume"]].concat());
    assert_same_files(&a, &b);
}

/// `train { accumulate: N }` written into a copy of the MLP example.
fn mlp_accumulating(dir: &Path, n: usize) -> std::path::PathBuf {
    let src = std::fs::read_to_string(MLP).unwrap();
    let train = src.lines().find(|l| l.starts_with("train {")).unwrap();
    let with = train.replacen("train {", &format!("train {{ accumulate: {n},"), 1);
    let p = dir.join(format!("mlp-acc{n}.dm"));
    std::fs::write(&p, src.replace(train, &with)).unwrap();
    p
}

#[test]
fn accumulating_runs_resume_bit_identically_and_refuse_another_accumulation() {
    let dir = tempfile::tempdir().unwrap();
    let d = data(dir.path(), MLP, 640);
    let (acc2, acc4) = (
        mlp_accumulating(dir.path(), 2),
        mlp_accumulating(dir.path(), 4),
    );
    let (whole, parts) = (
        dir.path().join("whole.safetensors"),
        dir.path().join("parts.safetensors"),
    );
    let run = |program: &Path, w: &Path, extra: &[&str]| {
        let args = [
            &["run", s(program), "--data", s(&d), "--save", s(w), "-q"][..],
            &["--save-every", "2"][..],
            extra,
        ]
        .concat();
        dmc(&args)
    };
    let ok = |r: (i32, String, String)| assert_eq!(r.0, 0, "{}", r.2);
    ok(run(&acc2, &whole, &["--steps", "4"]));
    ok(run(&acc2, &parts, &["--steps", "2"]));
    assert_eq!(steps_in_state(&state_of(&parts)), 2);
    // Resuming with another accumulation is another run: refused, nothing replaced.
    let before = (bytes(&parts), bytes(&state_of(&parts)));
    let (code, _, err) = run(&acc4, &parts, &["--steps", "4", "--resume"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("accumulate 2") && err.contains("accumulate 4"),
        "{err}"
    );
    assert!(before == (bytes(&parts), bytes(&state_of(&parts))));
    // The same accumulation continues where it stopped: the micro-batches of steps 3 and 4 are the
    // uninterrupted run's.
    ok(run(&acc2, &parts, &["--steps", "4", "--resume"]));
    assert_same_files(&whole, &parts);
}
