//! CLI-level tests of `dmc check` and `dmc summary`.

use crate::common;
use common::dmc;

#[test]
fn check_examples() {
    let (code, out, err) = dmc(&["check", "examples/seed.dm"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "examples/seed.dm: ok (33 layers, 206,538,153 parameters)\n"
    );
    for ex in ["mlp.dm", "resnet_small.dm", "deep_convnet.dm"] {
        let (code, out, err) = dmc(&["check", &format!("examples/{ex}")]);
        assert_eq!(code, 0, "{ex}: {err}");
        assert!(out.contains(": ok ("), "{out}");
    }
}

#[test]
fn summary_of_seed() {
    let (code, out, err) = dmc(&["summary", "examples/seed.dm"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Total params:       206,538,153"));
    assert!(out.contains("826,152,612 bytes (787.9 MiB)"));
    insta::assert_snapshot!("cli_seed_summary", out);
}

#[test]
fn summary_json() {
    let (code, out, err) = dmc(&["summary", "examples/seed.dm", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["total_params"], 206_538_153);
    assert_eq!(v["param_bytes"], 826_152_612);
    assert_eq!(v["batch"], 1);
    assert_eq!(v["layers"][32]["name"], "dense_2");
}

#[test]
fn errors_exit_1_with_a_rendered_diagnostic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.dm");
    std::fs::write(&path, "input x: [16, 16, 1]\ntarget y: [1]\nout = x |> conv2d(8, 3) |> dense(1)\nloss mse(out, y)\ntrain { batch: 1, optimizer: sgd }\n")
        .expect("write");
    let p = path.display().to_string();
    let (code, out, err) = dmc(&["check", &p]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.contains(
            "`dense` expects flat features [n] or a sequence of them [t, n], got [16, 16, 8]"
        ),
        "{err}"
    );
    assert!(err.contains(&format!("{p}:3:28")), "{err}");
    assert!(err.contains("add `|> flatten`"), "{err}");
    assert!(!err.contains("panicked"));

    let (code, _, err) = dmc(&["summary", "does/not/exist.dm"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: cannot read `does/not/exist.dm`"),
        "{err}"
    );
}

#[test]
fn plan_of_seed_is_pinned_and_within_one_percent_of_the_parameters() {
    let (code, out, err) = dmc(&["plan", "examples/seed.dm", "--verbose"]);
    assert_eq!(code, 0, "{err}");
    insta::assert_snapshot!("cli_seed_plan", out);
    let arena: u64 = out
        .lines()
        .find(|l| l.trim_start().starts_with("arena size"))
        .and_then(|l| l.split_whitespace().nth(2))
        .map(|s| s.replace(',', ""))
        .and_then(|s| s.parse().ok())
        .expect("arena size line");
    assert!(
        arena <= 834_413_138,
        "arena {arena} > 1.01 x parameter bytes"
    );
    assert!(out.contains("Keep-everything baseline"), "{out}");
    // Without --verbose: the verdict only, which is the first lines of the verbose report.
    let (code, short, err) = dmc(&["plan", "examples/seed.dm"]);
    assert_eq!(code, 0, "{err}");
    assert!(short.lines().count() <= 10, "{short}");
    assert!(short.contains("no cap given"), "{short}");
    assert!(short.contains("--verbose"), "{short}");
    // (the performance models' lines, GPU and CPU, end both reports)
    let verdict: Vec<&str> = short
        .lines()
        .filter(|l| {
            !l.contains("--verbose")
                && !l.starts_with("predicted step on")
                && !l.starts_with("CPU step:")
        })
        .collect();
    assert!(
        short.contains("CPU step: ") && short.contains("predicted by the CPU time model"),
        "{short}"
    );
    assert!(
        out.starts_with(&(verdict.join("\n") + "\n")),
        "{short}\n---\n{out}"
    );
}

#[test]
fn plan_verdict_says_whether_the_cap_fits_and_what_recomputation_costs() {
    // deep_convnet's arena without recomputation is 550.7 MiB: under a 300 MB cap, its activations
    // kept in the arena, it recomputes.
    let (code, out, err) = dmc(&[
        "plan",
        "examples/deep_convnet.dm",
        "--vram-cap",
        "300MB",
        "--no-offload",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().count() <= 10, "{out}");
    let first: Vec<&str> = out.lines().take(4).collect();
    assert!(first[1].contains("fits the cap of 286.1 MiB"), "{out}");
    let remat = out
        .lines()
        .find(|l| l.trim_start().starts_with("recomputation:"))
        .expect("a recomputation line");
    assert!(
        remat.contains("saves") && remat.contains("more FLOPs"),
        "{out}"
    );
    // The arena it names is under the cap.
    let arena: u64 = first[0]
        .split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .map(|s| s.replace(',', ""))
        .and_then(|s| s.parse().ok())
        .expect("arena bytes on the first line");
    assert!(arena <= 300_000_000, "{out}");
}

#[test]
fn cap_below_the_parameters_is_refused_with_the_smallest_cap() {
    let (code, out, err) = dmc(&[
        "compile",
        "examples/seed.dm",
        "--vram-cap",
        "800MB",
        "--no-stream",
    ]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.contains("parameters 787.9 MiB + optimizer state 0 B"),
        "{err}"
    );
    assert!(err.contains("the smallest cap that works"), "{err}");
    let (code, _, err) = dmc(&["compile", "examples/seed.dm", "--vram-cap", "12 parsecs"]);
    assert_eq!(code, 2, "clap usage error expected: {err}");
    assert!(err.contains("unknown unit"), "{err}");
}

#[test]
fn plan_timeline_is_svg() {
    let dir = tempfile::tempdir().expect("tempdir");
    let svg = dir.path().join("t.svg");
    let (code, _, err) = dmc(&[
        "plan",
        "examples/resnet_small.dm",
        "--vram-cap",
        "64MiB",
        "--timeline",
        &svg.display().to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&svg).expect("svg written");
    let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(text.contains("cap"), "the cap line is drawn");
}

#[test]
fn plan_explains_remat_sweeps_and_finds_the_largest_batch() {
    // resnet_small's arena without recomputation is 1.4 MB: 1.25 MB needs remat.
    let (code, out, err) = dmc(&[
        "plan",
        "examples/resnet_small.dm",
        "--vram-cap",
        "1.25MB",
        "--no-stream",
        "--verbose",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Rematerialization"), "{out}");
    assert!(out.contains("memory saved"), "{out}");
    assert!(out.contains("of the step's"), "{out}");
    let (code, _, err) = dmc(&[
        "plan",
        "examples/resnet_small.dm",
        "--vram-cap",
        "1.25MB",
        "--remat",
        "off",
        "--no-stream",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the smallest cap that works"), "{err}");
    // Below what remat and streaming reach: refused, naming that smallest cap.
    let (code, _, err) = dmc(&["plan", "examples/resnet_small.dm", "--vram-cap", "100KB"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the smallest cap that works"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let svg = dir.path().join("sweep.svg");
    let (code, out, err) = dmc(&[
        "plan",
        "examples/resnet_small.dm",
        "--sweep",
        "--points",
        "5",
        "--svg",
        &svg.display().to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("sqrt(n)") && out.contains("checkpoint-all"),
        "{out}"
    );
    let text = std::fs::read_to_string(&svg).expect("svg written");
    let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");

    let (code, out, err) = dmc(&[
        "plan",
        "examples/resnet_small.dm",
        "--vram-cap",
        "2MB",
        "--max-batch",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("the largest batch that fits"), "{out}");
}
