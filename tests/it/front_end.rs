//! The `dmc` binary on hostile `.dm` input: no panic, bounded reading, and every error with
//! `file:line:col` (what and where). Every command that takes a program reads it through the same
//! `load_model`; `check` and `summary` stand for them.

use crate::common;
use common::dmc;
use std::path::Path;
use std::time::{Duration, Instant};

const HEAD: &str = "input x: [4]\ntarget y: [1]\n";
const TAIL: &str = "loss mse(out, y)\ntrain { batch: 1, optimizer: sgd }\n";

/// Runs `dmc check` and `dmc summary` on `path`; both must fail with exit code 1, no panic, and
/// every `needles` in stderr. Returns the stderr of `check`.
fn fails(path: &Path, needles: &[&str]) -> String {
    let p = path.display().to_string();
    let mut first = None;
    for cmd in ["check", "summary"] {
        let (code, out, err) = dmc(&[cmd, &p]);
        assert_eq!(code, 1, "dmc {cmd}: {err}");
        assert!(out.is_empty(), "dmc {cmd}: {out}");
        assert!(!err.contains("panicked"), "dmc {cmd}: {err}");
        for n in needles {
            assert!(err.contains(n), "dmc {cmd}: no {n:?} in\n{err}");
        }
        first.get_or_insert(err);
    }
    first.unwrap_or_default()
}

#[test]
fn errors_far_right_on_a_line_are_shown_as_a_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    for col in [70_000usize, 200_000] {
        let path = dir.path().join(format!("col{col}.dm"));
        let pad = " ".repeat(col - "out = x |> ".len() - 1);
        std::fs::write(&path, format!("{HEAD}out = x |>{pad} bogus(1)\n{TAIL}")).expect("write");
        let at = format!("{}:3:{col}", path.display());
        let err = fails(&path, &["unknown operation `bogus`", &at, "bogus(1)"]);
        assert!(err.len() < 4_000, "{} bytes:\n{err}", err.len());
    }
}

#[test]
fn a_70000_character_layer_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let name = "n".repeat(70_000);
    // Valid: check and summary succeed; the table shortens the name.
    let ok = dir.path().join("ok.dm");
    std::fs::write(
        &ok,
        format!("{HEAD}out = x |> dense(4) as {name} |> dense(1)\n{TAIL}"),
    )
    .expect("write");
    let p = ok.display().to_string();
    let (code, out, err) = dmc(&["check", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (2 layers, 25 parameters)"), "{out}");
    let (code, out, err) = dmc(&["summary", &p]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Total params:       25"), "{out}");
    assert!(out.len() < 4_000, "{} bytes", out.len());
    let (code, out, err) = dmc(&["summary", &p, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&name));
    // The same name twice: a duplicate whose span is 70,000 characters long.
    let bad = dir.path().join("dup.dm");
    std::fs::write(
        &bad,
        format!("{HEAD}out = x |> dense(4) as {name} |> dense(1) as {name}\n{TAIL}"),
    )
    .expect("write");
    let at = format!("{}:3:", bad.display());
    let err = fails(&bad, &["duplicate layer name `nnnn", "…", &at]);
    assert!(err.len() < 4_000, "{} bytes:\n{err}", err.len());
}

#[cfg(unix)]
#[test]
fn endless_and_special_files_are_read_only_up_to_the_limit() {
    let t = Instant::now();
    fails(
        Path::new("/dev/zero"),
        &["error: `/dev/zero` is too large (more than 16,777,216 bytes); a .dm program is at most 16,777,216 bytes (16 MiB)"],
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());

    // A FIFO fed without end by `yes`.
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo.dm");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    if made {
        let mut yes = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec yes > '{}'", fifo.display()))
            .spawn()
            .expect("spawn yes");
        let (code, _, err) = dmc(&["check", &fifo.display().to_string()]);
        let _ = yes.kill();
        let _ = yes.wait();
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("too large (more than 16,777,216 bytes)"),
            "{err}"
        );
    }
}

#[test]
fn directories_large_files_and_missing_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    fails(dir.path(), &["is a directory, not a .dm file"]);
    let big = dir.path().join("big.dm");
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(16 * 1024 * 1024 + 1).expect("set_len");
    fails(
        &big,
        &["is too large (16,777,217 bytes); a .dm program is at most 16,777,216 bytes"],
    );
    fails(
        &dir.path().join("missing.dm"),
        &["cannot read", "missing.dm"],
    );
}

#[test]
fn byte_order_mark_and_invalid_utf8() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bom = dir.path().join("bom.dm");
    std::fs::write(&bom, format!("\u{feff}{HEAD}out = x |> dense(1)\n{TAIL}")).expect("write");
    let (code, out, err) = dmc(&["check", &bom.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (1 layers"), "{out}");
    std::fs::write(&bom, "\u{feff}input x [4]\n").expect("write");
    fails(&bom, &[&format!("{}:1:9", bom.display()), "expected `:`"]);

    let latin1 = dir.path().join("latin1.dm");
    std::fs::write(&latin1, b"input x: [4]\ntarget y\xe9: [1]\n").expect("write");
    fails(
        &latin1,
        &[
            &format!("{}:2:9", latin1.display()),
            "is not valid UTF-8 (byte 0xE9 at 2:9",
            "save the file as UTF-8",
        ],
    );
}

#[test]
fn the_loss_must_come_after_its_prediction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("order.dm");
    std::fs::write(
        &path,
        format!(
            "{HEAD}loss mse(out, y)\nout = x |> dense(1)\ntrain {{ batch: 1, optimizer: sgd }}\n"
        ),
    )
    .expect("write");
    fails(
        &path,
        &[
            "`out` is used before it is defined",
            &format!("{}:3:10", path.display()),
            "move the definition of `out` above",
        ],
    );
}

#[test]
fn every_error_of_a_file_in_one_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("three.dm");
    std::fs::write(
        &path,
        "input x: [4]\ntarget y: [1]\nh = x |> dens(8)\nout = h |> dense(1, activation: selu)\nloss hinge(out, y)\ntrain { batch: 1, optimizer: sgd }\n",
    )
    .expect("write");
    let p = path.display();
    let err = fails(
        &path,
        &[
            &format!("{p}:3:10"),
            "unknown operation `dens`",
            "did you mean `dense`?",
            &format!("{p}:5:6"),
            "`hinge` is not supported yet (supported losses: mse, cross_entropy, mae, huber,",
            // `h` is in error, but the activation does not depend on it.
            &format!("{p}:4:33"),
            "`selu` is not supported yet (supported activations: relu",
        ],
    );
    assert!(!err.contains("did you mean `mse`"), "{err}");
    assert!(!err.contains("did you mean `gelu`"), "{err}");
    assert!(
        err.trim_end().ends_with(&format!("3 errors in {p}")),
        "{err}"
    );
}
