//! README.md's "A short tour", run as written: the command lines are read from the fenced block
//! under `## A short tour` and run in order in a fresh directory (with `examples/` linked to the
//! repository's), `dmc` being the binary under test. Every line must exit 0, except one whose
//! comment starts with `refused:`, which must fail with a message; a quoted text in a comment is
//! output that must appear (`...` stands for any text); every file a line names with `-o`,
//! `--save`, `--svg` or `--timeline` must exist afterwards.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// One line of the tour.
#[derive(Debug)]
struct TourLine {
    /// The line as written in the README.
    text: String,
    /// The words of the command, `dmc` first.
    args: Vec<String>,
    /// The comment says `refused:`: the command must fail.
    refused: bool,
    /// Texts the output must contain, in order (the quoted part of the comment, split at `...`).
    expect: Vec<String>,
}

/// The command lines of the fenced block under `## A short tour` (lines that are only a comment
/// continue the previous line's comment and are skipped).
fn tour_lines(readme: &str) -> Vec<TourLine> {
    let after = readme
        .split_once("\n## A short tour\n")
        .map(|(_, rest)| rest)
        .expect("README.md has a `## A short tour` section");
    let mut lines = after.lines().skip_while(|l| !l.starts_with("```"));
    let fence = lines
        .next()
        .expect("a fenced block under `## A short tour`");
    assert_eq!(fence.trim(), "```sh", "the tour is a ```sh block");
    let mut out = Vec::new();
    for line in lines.take_while(|l| !l.starts_with("```")) {
        let (cmd, comment) = match line.find(" #").or(line.starts_with('#').then_some(0)) {
            Some(i) => (
                &line[..i],
                line[i..].trim_start().trim_start_matches('#').trim(),
            ),
            None => (line, ""),
        };
        let args: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
        if args.is_empty() {
            continue;
        }
        assert_eq!(
            args[0], "dmc",
            "a tour line that is not a dmc command: {line}"
        );
        let expect = match comment.split('"').nth(1) {
            Some(quoted) => quoted
                .split("...")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            None => Vec::new(),
        };
        out.push(TourLine {
            text: line.to_string(),
            args,
            refused: comment.starts_with("refused:"),
            expect,
        });
    }
    out
}

#[test]
fn every_line_of_the_readme_tour_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let tour = tour_lines(&readme);
    assert!(tour.len() >= 10, "the tour was not found whole: {tour:?}");
    assert_eq!(
        tour.iter().filter(|l| l.refused).count(),
        1,
        "the tour shows one refused cap: {tour:?}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(root.join("examples"), dir.path().join("examples"))
        .expect("link examples/");
    let total = Instant::now();
    for line in &tour {
        let t0 = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_dmc"))
            .args(&line.args[1..])
            .current_dir(dir.path())
            .output()
            .expect("run dmc");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = format!("{stdout}{stderr}");
        eprintln!("{:6.2} s  {}", t0.elapsed().as_secs_f64(), line.text);
        let ctx = || {
            format!(
                "`{}`:\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
                line.text
            )
        };
        if line.refused {
            assert_eq!(out.status.code(), Some(1), "must be refused: {}", ctx());
            assert!(stderr.contains("error:"), "no error message: {}", ctx());
        } else {
            assert!(out.status.success(), "failed: {}", ctx());
        }
        assert!(!all.contains("panicked"), "{}", ctx());
        let mut at = 0;
        for want in &line.expect {
            match all[at..].find(want.as_str()) {
                Some(i) => at += i + want.len(),
                None => panic!("the README promises {want:?} here: {}", ctx()),
            }
        }
        for pair in line.args.windows(2) {
            if matches!(pair[0].as_str(), "-o" | "--save" | "--svg" | "--timeline") {
                let p = dir.path().join(&pair[1]);
                assert!(p.exists(), "{} was not written: {}", pair[1], ctx());
            }
        }
    }
    eprintln!("the tour took {:.1} s", total.elapsed().as_secs_f64());
}

#[test]
fn tour_lines_are_parsed_with_their_comments() {
    let readme = "x\n## A short tour\n\n```sh\n\
        dmc check a.dm   # ok: \"a.dm: ok (1 layer...)\"\n\
        \x20                # a continued comment\n\
        dmc plan a.dm --vram-cap 1MB # refused: \"... > cap ...\"\n\
        ```\n\ndmc not-a-tour-line\n";
    let t = tour_lines(readme);
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(t[0].args, ["dmc", "check", "a.dm"]);
    assert!(!t[0].refused);
    assert_eq!(t[0].expect, ["a.dm: ok (1 layer", ")"]);
    assert_eq!(t[1].args, ["dmc", "plan", "a.dm", "--vram-cap", "1MB"]);
    assert!(t[1].refused);
    assert_eq!(t[1].expect, ["> cap"]);
}
