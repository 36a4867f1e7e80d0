//! `mpirun -np N dmc run --data-parallel` on the examples, against one process with the same
//! global batch: the weights after 5 steps (mlp, resnet_small, deep_convnet at a small batch), a
//! run resumed at another number of ranks, the per-rank memory, and a rank killed mid-run (the
//! others end, and the weights file is left as it was). Needs `mpirun` (Open MPI, which `.ci/run`
//! installs): without it the tests are ignored (the build script's probe), under `CI` they run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::dmc;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `mpirun -np n dmc args..` (as root where the tests run as root; more ranks than cores allowed).
fn mpirun_cmd(n: usize, args: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--oversubscribe",
        "-np",
        &n.to_string(),
        env!("CARGO_BIN_EXE_dmc"),
    ])
    .args(args)
    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    // no cross-memory attach (containers often forbid ptrace): plain shared-memory copies
    .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    .env("DMC_CPU_RATES", "nominal")
    .current_dir(root());
    c
}

fn mpirun(n: usize, args: &[&str]) -> Output {
    let out = mpirun_cmd(n, args).output().expect("mpirun");
    assert!(
        out.status.success(),
        "mpirun -np {n} dmc {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The parameters of `example` in `file`, in plan order, as one vector.
fn weights(example: &str, file: &Path) -> Vec<f32> {
    let src = std::fs::read_to_string(root().join("examples").join(example)).expect("example");
    let m = dmc_grammar::compile_source(&src, example).expect("parse");
    let p = dmc_compiler::compile(&m, &Default::default()).expect("plan");
    let expected: Vec<(String, Vec<usize>)> = p
        .params
        .iter()
        .map(|b| (b.name.clone(), b.shape.clone()))
        .collect();
    dmc_runtime::io::load_weights(file, &expected)
        .expect("weights")
        .into_iter()
        .flat_map(|(_, v)| v)
        .collect()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (d / n).sqrt()
}

fn path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// 5 steps of `example` (with `extra` flags) by one process and by 2 ranks: the weights within
/// 1e-5 of each other (relative L2 over all parameters).
fn like_one_process(example: &str, extra: &[&str]) {
    like_one_process_on(example, extra, "cpu");
}

/// [`like_one_process`], the ranks on `device` (one process on the CPU).
fn like_one_process_on(example: &str, extra: &[&str], device: &str) {
    like_one_process_with(example, extra, device, &[]);
}

/// [`like_one_process_on`], the ranks given `ranks_only` too (e.g. `--shard-parameters`).
fn like_one_process_with(example: &str, extra: &[&str], device: &str, ranks_only: &[&str]) {
    let dir = tempfile::tempdir().expect("tmp");
    let (one, two) = (path(&dir, "one.safetensors"), path(&dir, "two.safetensors"));
    let file = format!("examples/{example}");
    let mut a = vec!["run", &file, "--steps", "5", "-q", "--device", "cpu"];
    a.extend_from_slice(extra);
    let s1 = one.to_str().expect("path");
    let (code, _, err) = dmc(&[&a[..], &["--save", s1]].concat());
    assert_eq!(code, 0, "{err}");
    let s2 = two.to_str().expect("path");
    a[6] = device;
    let out = mpirun(
        2,
        &[&a[..], &["--save", s2, "--data-parallel"], ranks_only].concat(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.matches("5 steps, final loss").count(),
        1,
        "rank 0 alone reports: {stdout}"
    );
    let e = rel(&weights(example, &two), &weights(example, &one));
    assert!(
        e <= 1e-5,
        "{example}: 2 ranks' weights {e:e} from one process's"
    );
}

#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn mlp_trains_on_two_ranks_as_on_one_process() {
    like_one_process("mlp.dm", &[]);
}

#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn resnet_small_trains_on_two_ranks_as_on_one_process() {
    like_one_process("resnet_small.dm", &[]);
}

/// Sharded parameters (ZeRO-3) over MPI: each rank keeps its rows of the weights, gathers them
/// for each use, and the weights file rank 0 writes is whole and one process's (resnet_small:
/// convolutions, batchnorm, a residual).
#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn sharded_parameters_train_on_two_ranks_as_on_one_process() {
    like_one_process_with("mlp.dm", &[], "cpu", &["--shard-parameters"]);
    like_one_process_with("resnet_small.dm", &[], "cpu", &["--shard-parameters"]);
}

/// The CUDA path under MPI without a GPU: each rank the emulated CUDA backend, its sharded steps'
/// collectives over MPI where the GPU's go over NCCL.
#[test]
#[cfg_attr(
    not(all(dmc_has_mpi, dmc_has_gxx)),
    ignore = "needs mpirun (Open MPI) and g++; CI installs them"
)]
fn mlp_and_resnet_small_train_on_two_emulated_gpu_ranks_as_on_one_process() {
    like_one_process_on("mlp.dm", &[], "cuda-emu");
    like_one_process_on("resnet_small.dm", &[], "cuda-emu");
}

/// deep_convnet at a small batch and a small learning rate: at its own 0.01 a 16-layer ReLU net at
/// initialisation amplifies rounding (one process, one step from weights 4.5e-7 apart: 7.6e-5
/// apart), which would measure the network's chaos rather than the ranks.
#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn deep_convnet_trains_on_two_ranks_as_on_one_process() {
    like_one_process("deep_convnet.dm", &["--batch", "8", "--lr", "0.001"]);
}

/// The ranks share the validation batches (rank r runs batches r, r + N, ...) and sum what they
/// found: the epoch's validation loss and accuracy are one process's.
#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn the_ranks_share_the_validation_and_report_one_processs_numbers() {
    let a = [
        "run",
        "examples/mlp.dm",
        "--epochs",
        "1",
        "--val-split",
        "0.25",
        "-q",
        "--device",
        "cpu",
    ];
    let (code, _, one) = dmc(&a);
    assert_eq!(code, 0, "{one}");
    let out = mpirun(2, &[&a[..], &["--data-parallel"]].concat());
    let two = String::from_utf8_lossy(&out.stderr);
    let val = |s: &str| -> (f64, String) {
        let l = s
            .lines()
            .find(|l| l.contains("validation loss"))
            .unwrap_or_else(|| panic!("{s}"));
        let rest = &l[l.find("validation loss ").expect("loss") + 16..];
        let (loss, acc) = rest.split_once(',').expect("accuracy");
        (loss.parse().expect("number"), acc.trim().to_string())
    };
    let ((l1, a1), (l2, a2)) = (val(&one), val(&two));
    assert!(
        (l1 - l2).abs() <= 1e-5 * l1.abs(),
        "validation loss {l2} on 2 ranks, {l1} alone"
    );
    assert_eq!(a1, a2, "the same accuracy and samples");
}

/// An error every rank meets alike (here the batch that does not split over 3 ranks) is said
/// once, by rank 0.
#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn an_error_of_every_rank_is_said_once() {
    let out = mpirun_cmd(
        3,
        &[
            "run",
            "examples/mlp.dm",
            "--steps",
            "2",
            "-q",
            "--data-parallel",
        ],
    )
    .output()
    .expect("mpirun");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("does not split evenly").count(), 1, "{err}");
    assert!(err.contains("multiple of 3"), "{err}");
}

/// 3 steps on 2 ranks saving the training state, then 2 more on one process resuming it: the
/// weights of 5 uninterrupted steps on one process (the state gathered whole, then read whole).
#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn a_run_of_two_ranks_resumes_on_one_process() {
    let dir = tempfile::tempdir().expect("tmp");
    let (w, u) = (path(&dir, "w.safetensors"), path(&dir, "u.safetensors"));
    let (ws, us) = (w.to_str().expect("path"), u.to_str().expect("path"));
    let base = ["run", "examples/resnet_small.dm", "-q", "--device", "cpu"];
    mpirun(
        2,
        &[
            &base[..],
            &[
                "--steps",
                "3",
                "--save",
                ws,
                "--save-every",
                "3",
                "--data-parallel",
            ],
        ]
        .concat(),
    );
    let (code, _, err) = dmc(&[&base[..], &["--steps", "5", "--save", ws, "--resume"]].concat());
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = dmc(&[&base[..], &["--steps", "5", "--save", us]].concat());
    assert_eq!(code, 0, "{err}");
    let e = rel(
        &weights("resnet_small.dm", &w),
        &weights("resnet_small.dm", &u),
    );
    assert!(
        e <= 1e-5,
        "resumed across world sizes: {e:e} from uninterrupted"
    );
}

/// Each rank's arena holds half the optimizer state: the planned and the measured arena of a rank
/// of 2 against one process's, both less by about half the state.
#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn each_rank_measures_half_the_optimizer_state() {
    let dir = tempfile::tempdir().expect("tmp");
    let (j1, j2) = (path(&dir, "one.json"), path(&dir, "two.json"));
    let base = [
        "run",
        "examples/mlp.dm",
        "--steps",
        "2",
        "-q",
        "--device",
        "cpu",
    ];
    let (code, _, err) = dmc(&[&base[..], &["--summary-json", j1.to_str().expect("p")]].concat());
    assert_eq!(code, 0, "{err}");
    mpirun(
        2,
        &[
            &base[..],
            &["--summary-json", j2.to_str().expect("p"), "--data-parallel"],
        ]
        .concat(),
    );
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).expect("json")).expect("parse")
    };
    let (one, two) = (read(&j1), read(&j2));
    let num = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    // mlp's SGD momentum: one state tensor per parameter, 918.5 KiB in all
    let state: u64 = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    for k in ["planned_arena_bytes", "measured_arena_bytes"] {
        let saved = num(&one, k) as i64 - num(&two, k) as i64;
        assert!(
            saved >= (state / 2) as i64 - 4096,
            "{k}: a rank of 2 holds {} B, one process {} B: less than half the state ({} B) saved",
            num(&two, k),
            num(&one, k),
            state / 2
        );
    }
}

/// `mpirun -np 2 dmc run examples/mlp.dm` for a long run, saving to `w` and logging its losses to
/// `log`, returned once rank 0 has logged three steps.
fn long_run(w: &Path, log: &Path) -> std::process::Child {
    let (ws, logs) = (w.to_str().expect("path"), log.to_str().expect("path"));
    let child = mpirun_cmd(
        2,
        &[
            "run",
            "examples/mlp.dm",
            "--steps",
            "100000",
            "-q",
            "--device",
            "cpu",
            "--save",
            ws,
            "--loss-log",
            logs,
            "--data-parallel",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("mpirun");
    let t0 = Instant::now();
    while std::fs::read_to_string(log).map_or(0, |s| s.lines().count()) < 3 {
        assert!(t0.elapsed() < Duration::from_secs(120), "no steps logged");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// A rank killed mid-run ends the others (mpirun fails), and the weights file that existed before
/// is left exactly as it was.
#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn a_killed_rank_ends_the_run_and_loses_no_weights() {
    let dir = tempfile::tempdir().expect("tmp");
    let (w, log) = (path(&dir, "w.safetensors"), path(&dir, "loss.txt"));
    let ws = w.to_str().expect("path");
    let (code, _, err) = dmc(&["run", "examples/mlp.dm", "--steps", "2", "-q", "--save", ws]);
    assert_eq!(code, 0, "{err}");
    let before = std::fs::read(&w).expect("weights");
    // once rank 0 has logged a few steps, kill rank 1
    let child = long_run(&w, &log);
    let rank1 = rank_pid(1).expect("rank 1's process");
    // SAFETY: kill(2) with a pid read from /proc and SIGKILL; no memory is shared.
    assert_eq!(unsafe { libc::kill(rank1, libc::SIGKILL) }, 0);
    let out = child.wait_with_output().expect("mpirun");
    assert!(!out.status.success(), "mpirun succeeded with a rank killed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("signal 9") || stderr.contains("Killed") || stderr.contains("killed"),
        "mpirun says a rank was killed: {stderr}"
    );
    assert_eq!(
        std::fs::read(&w).expect("weights"),
        before,
        "the weights file was replaced"
    );
}

/// SIGTERM to `mpirun` (which forwards it to every rank) stops every rank after the same step:
/// rank 0 saves the weights whole and says so, and the file holds finite trained weights.
#[test]
#[cfg_attr(not(dmc_has_mpi), ignore = "needs mpirun (Open MPI); CI installs it")]
fn a_signal_stops_every_rank_at_the_same_step_and_saves() {
    let dir = tempfile::tempdir().expect("tmp");
    let (w, log) = (path(&dir, "w.safetensors"), path(&dir, "loss.txt"));
    let child = long_run(&w, &log);
    // SAFETY: kill(2) on our own child's pid with SIGTERM; no memory is shared.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().expect("mpirun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("interrupted after") && stderr.contains("the weights were saved"),
        "rank 0 says it stopped and saved: {stderr}"
    );
    assert_eq!(stderr.matches("interrupted after").count(), 1, "{stderr}");
    let trained = weights("mlp.dm", &w);
    assert!(trained.iter().all(|v| v.is_finite()));
}

/// The pid of this test's dmc rank `rank` (its environment names it, and its command line runs
/// dmc with --data-parallel).
fn rank_pid(rank: usize) -> Option<i32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let (Ok(env), Ok(cmd)) = (
            std::fs::read(e.path().join("environ")),
            std::fs::read(e.path().join("cmdline")),
        ) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("--data-parallel")
            && cmd.contains("100000")
            && env.split(|b| *b == 0).any(|v| v == want.as_bytes())
        {
            return Some(pid);
        }
    }
    None
}
