//! Random flags and values through the `dmc` binary.
//!
//! A case is a subcommand with 0-5 of its flags, each with a value drawn from a list of
//! interesting ones (0, 1, 2^31, 2^64-1, 2^64, nan, inf, -1 written `--x=-1`, empty, garbage, paths
//! that are missing, a directory, `/dev/null`, `/dev/zero`). A case fails when the process dies by a
//! signal (an abort, a segfault), exits with 101 (a Rust panic) or any code but 0, 1, 2 and 130, or
//! fails without saying why on stderr. Cases that run past the time limit are counted, not failed
//! (`--steps 2^63` is a legitimate request for a very long run). The commands run in a scratch
//! directory with copies of the examples, so a case that names an example as its output (which dmc
//! then legitimately writes) never touches the repository.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{CaseFile, Failure, Report};

const NUMS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "64",
    "2147483648",
    "18446744073709551615",
    "18446744073709551616",
    "1152921504606846976",
    "-1",
    "nan",
    "inf",
    "1e39",
    "1e-50",
    "0.5",
    "",
    "abc",
    "1GiB",
    "1B",
    "0.2",
    "1.5",
];

/// (subcommand, flags that take a value, switches)
const COMMANDS: &[(&str, &[&str], &[&str])] = &[
    ("check", &[], &[]),
    ("summary", &[], &["--json"]),
    (
        "plan",
        &[
            "--batch",
            "--vram-cap",
            "--remat",
            "--points",
            "--timeline",
            "--lr",
        ],
        &["--json", "--sweep", "--max-batch", "--no-fuse"],
    ),
    (
        "compile",
        &["--batch", "--vram-cap", "--mode", "-o", "--remat", "--lr"],
        &["--no-fuse", "--no-split-k"],
    ),
    (
        "run",
        &[
            "--steps",
            "--epochs",
            "--lr",
            "--batch",
            "--seed",
            "--vram-cap",
            "--val-split",
            "--save",
            "--loss-log",
            "--init",
            "--data",
            "--remat",
            "--save-every",
        ],
        &[
            "--no-fuse",
            "--poison",
            "--verify",
            "--no-split-k",
            "--resume",
            "--save-best",
        ],
    ),
    (
        "eval",
        &["--batch", "--seed", "--init", "--data", "--vram-cap"],
        &["--poison", "--no-split-k", "--verify"],
    ),
    (
        "predict",
        &["--batch", "--seed", "--init", "--data", "-o", "--vram-cap"],
        &["--poison", "--no-split-k", "--verify", "--softmax"],
    ),
];

fn value(r: &mut ChaCha8Rng, flag: &str, dir: &Path) -> String {
    let paths = [
        dir.join("out.safetensors").display().to_string(),
        dir.join("missing/x.npy").display().to_string(),
        dir.display().to_string(),
        "/dev/null".into(),
        "/dev/zero".into(),
        "examples/mlp.dm".into(),
        "".into(),
    ];
    match flag {
        "--save" | "--loss-log" | "--init" | "--data" | "-o" | "--timeline" => {
            paths[r.random_range(0..paths.len())].clone()
        }
        "--remat" => ["off", "auto", "on", ""][r.random_range(0..4)].into(),
        "--mode" => ["train", "eval", "predict", "x"][r.random_range(0..4)].into(),
        // a long run is legitimate; keep most cases short
        "--steps" | "--epochs" if r.random_bool(0.7) => r.random_range(0..3).to_string(),
        _ => NUMS[r.random_range(0..NUMS.len())].into(),
    }
}

/// One command line for case `i`.
pub fn case(r: &mut ChaCha8Rng, dir: &Path) -> Vec<String> {
    let (cmd, flags, switches) = COMMANDS[r.random_range(0..COMMANDS.len())];
    let program =
        ["examples/mlp.dm", "examples/resnet_small.dm", "/dev/null"][r.random_range(0..3)];
    let mut args = vec![cmd.to_string(), program.to_string()];
    if cmd == "compile" || cmd == "predict" {
        args.push("-o".into());
        args.push(dir.join("out").display().to_string());
    }
    if matches!(cmd, "run" | "eval" | "predict") {
        args.extend(["-q".into(), "--device".into(), "cpu".into()]);
        args.extend(["--synthetic-samples".into(), "32".into()]);
    }
    for _ in 0..r.random_range(0..=5) {
        if !switches.is_empty() && r.random_bool(0.3) {
            args.push(switches[r.random_range(0..switches.len())].into());
        } else if !flags.is_empty() {
            let f = flags[r.random_range(0..flags.len())];
            let v = value(r, f, dir);
            // `--x=-1` reaches the value parser; `--x -1` would be a flag
            args.push(format!("{f}={v}"));
        }
    }
    args
}

/// Runs `cases` command lines through the binary `dmc`, each with `timeout`.
pub fn run(
    dmc: &Path,
    cases: u64,
    seed: u64,
    timeout: Duration,
    case_file: &mut CaseFile,
) -> Report {
    let mut rep = Report::default();
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            rep.failures.push(Failure {
                target: "cli",
                case: String::new(),
                what: format!("cannot make a temp dir: {e}"),
            });
            return rep;
        }
    };
    // The commands run in a scratch directory holding copies of the examples: an output flag given
    // `examples/mlp.dm` (a case like any other) must not overwrite the repository's file.
    let root = dir.path().join("work");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let copied = std::fs::create_dir_all(root.join("examples")).and_then(|()| {
        for name in ["mlp.dm", "resnet_small.dm"] {
            std::fs::copy(examples.join(name), root.join("examples").join(name))?;
        }
        Ok(())
    });
    if let Err(e) = copied {
        rep.failures.push(Failure {
            target: "cli",
            case: String::new(),
            what: format!("cannot copy the examples into the scratch directory: {e}"),
        });
        return rep;
    }
    // The binary as given from here, before the commands change directory.
    let dmc = std::fs::canonicalize(dmc).unwrap_or_else(|_| dmc.to_path_buf());
    for i in 0..cases {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(i);
        let args = case(&mut r, dir.path());
        for name in ["mlp.dm", "resnet_small.dm"] {
            let _ = std::fs::copy(examples.join(name), root.join("examples").join(name));
        }
        let line = format!("dmc {}", args.join(" "));
        case_file.record(line.as_bytes());
        rep.cases += 1;
        let fail = |what: String| Failure {
            target: "cli",
            case: line.clone(),
            what,
        };
        let child = Command::new(&dmc)
            .args(&args)
            .current_dir(&root)
            .env("DMC_CACHE_DIR", dir.path().join("cache"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                rep.failures
                    .push(fail(format!("cannot start {}: {e}", dmc.display())));
                return rep;
            }
        };
        let t0 = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if t0.elapsed() < timeout => std::thread::sleep(Duration::from_millis(5)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let Some(status) = status else {
            continue; // ran past the limit: a long run, not a crash
        };
        match status.code() {
            None => rep
                .failures
                .push(fail(format!("killed by a signal ({status}): {err}"))),
            Some(0) => rep.accepted += 1,
            Some(1 | 2 | 130) if !err.trim().is_empty() => {}
            Some(c @ (1 | 2 | 130)) => rep
                .failures
                .push(fail(format!("exit {c} without a message"))),
            Some(c) => rep.failures.push(fail(format!("exit {c}: {err}"))),
        }
    }
    rep
}
