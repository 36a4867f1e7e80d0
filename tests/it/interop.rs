//! `dmc weights import|export` against fixtures made independently of dmc
//! (`bench/interop_fixture.py`, numpy only): PyTorch- and Keras-layout weight files for small
//! programs shaped like the examples (dense, conv2d, residual adds, global average pooling,
//! maxpool + flatten + dense), each with the eval loss that framework's forward pass gives. The
//! imported weights must give that loss in dmc (relative 1e-5), an export must give back the
//! file's own tensors, export -> import must give back the same bytes, and loading an unconverted
//! file with --init must point to the importer.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::dmc;

const DIR: &str = "tests/fixtures/interop";
const FIXTURES: &[&str] = &[
    "mlp_torch",
    "resnet_torch",
    "convnet_torch",
    "seed_torch",
    "seed_keras",
    "convnet_keras",
];

struct Fixture {
    program: String,
    framework: String,
    weights: String,
    data: String,
    samples: u64,
    eval_loss: f64,
}

fn fixture(key: &str) -> Fixture {
    let text = std::fs::read_to_string(Path::new(DIR).join(format!("{key}.json"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let f = |k: &str| format!("{DIR}/{}", v[k].as_str().unwrap());
    Fixture {
        program: f("program"),
        framework: v["framework"].as_str().unwrap().to_string(),
        weights: f("weights"),
        data: f("data"),
        samples: v["samples"].as_u64().unwrap(),
        eval_loss: v["eval_loss"].as_f64().unwrap(),
    }
}

/// `program` trained 3 steps on 32 synthetic samples, its weights saved to `w`.
pub(crate) fn trained(program: &str, w: &Path) {
    ok(&[
        "run",
        program,
        "--steps",
        "3",
        "--save",
        s(w),
        "-q",
        "--synthetic-samples",
        "32",
    ]);
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub(crate) fn ok(args: &[&str]) -> String {
    let (code, out, err) = dmc(args);
    assert_eq!(code, 0, "dmc {args:?}:\n{out}\n{err}");
    out
}

/// `dmc eval` of `program` with weights `w` on `data`: (loss, samples).
fn eval_loss(program: &str, w: &Path, data: &str) -> (f64, u64) {
    let out = ok(&["eval", program, "--init", s(w), "--data", data, "-q"]);
    // "loss 2.538397, accuracy 12.50% (16 samples)" / "loss 4.114942 (16 samples)"
    let loss = out
        .split_whitespace()
        .nth(1)
        .and_then(|t| t.trim_end_matches(',').parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no loss in {out:?}"));
    let samples = out
        .split('(')
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no sample count in {out:?}"));
    (loss, samples)
}

/// Every tensor of a safetensors file: name -> (dtype, shape, bytes), parsed here (not by dmc).
pub(crate) fn tensors(p: &Path) -> BTreeMap<String, (String, Vec<u64>, Vec<u8>)> {
    let b = std::fs::read(p).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let data = &b[8 + n..];
    let mut out = BTreeMap::new();
    for (name, t) in header.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        let off: Vec<usize> = t["data_offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let shape = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        out.insert(
            name.clone(),
            (
                t["dtype"].as_str().unwrap().to_string(),
                shape,
                data[off[0]..off[1]].to_vec(),
            ),
        );
    }
    out
}

fn imported(dir: &Path, key: &str, f: &Fixture) -> (PathBuf, String) {
    let w = dir.join(format!("{key}.dmc.safetensors"));
    let out = ok(&[
        "weights",
        "import",
        &f.program,
        &f.weights,
        "--from",
        &f.framework,
        "-o",
        s(&w),
    ]);
    (w, out)
}

#[test]
fn imported_weights_give_the_frameworks_eval_loss() {
    let dir = tempfile::tempdir().unwrap();
    for key in FIXTURES {
        let f = fixture(key);
        let (w, table) = imported(dir.path(), key, &f);
        let (loss, samples) = eval_loss(&f.program, &w, &f.data);
        assert_eq!(samples, f.samples, "{key}");
        // dmc prints 6 decimals: allow their rounding on top of the relative tolerance.
        let tol = 1e-5 * f.eval_loss.abs() + 5e-7;
        assert!(
            (loss - f.eval_loss).abs() <= tol,
            "{key}: dmc eval loss {loss} vs {} from {}'s forward pass (bench/interop_fixture.py)\n{table}",
            f.eval_loss,
            f.framework
        );
        // The table names every tensor of the file once, and each program parameter once.
        let file_names = tensors(Path::new(&f.weights));
        for name in file_names.keys() {
            let rows = table
                .lines()
                .filter(|l| l.starts_with(&format!("{name} ")))
                .count();
            assert_eq!(rows, 1, "{key}: `{name}` in the table:\n{table}");
        }
        assert_eq!(tensors(&w).len(), file_names.len(), "{key}");
    }
}

#[test]
fn the_flatten_permutation_is_applied_and_named_in_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture("seed_torch");
    let (_, table) = imported(dir.path(), "seed_torch", &f);
    let row = table
        .lines()
        .find(|l| l.starts_with("classifier.0.weight"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("dense_1.weight") && row.contains("rows C,H,W -> H,W,C (flatten of [2,3,6])"),
        "{row}"
    );
    // Keras flattens as dmc does: no permutation.
    let k = fixture("seed_keras");
    let (_, table) = imported(dir.path(), "seed_keras", &k);
    assert!(!table.contains("C,H,W"), "{table}");
}

#[test]
fn export_gives_back_the_files_tensors_and_import_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for key in FIXTURES {
        let f = fixture(key);
        let (w, _) = imported(dir.path(), key, &f);
        let e = dir.path().join(format!("{key}.export.safetensors"));
        ok(&[
            "weights",
            "export",
            &f.program,
            "--init",
            s(&w),
            "--to",
            &f.framework,
            "-o",
            s(&e),
        ]);
        // The exported tensors are the original file's, value for value (under dmc's layer names):
        // compare the multisets of (shape, bytes).
        let bag = |m: BTreeMap<String, (String, Vec<u64>, Vec<u8>)>| {
            let mut v: Vec<(Vec<u64>, Vec<u8>)> = m.into_values().map(|(_, s, b)| (s, b)).collect();
            v.sort();
            v
        };
        assert!(
            bag(tensors(Path::new(&f.weights))) == bag(tensors(&e)),
            "{key}: the export is not the imported file's tensors"
        );
        // export -> import: the same bytes as the first import.
        let back = dir.path().join(format!("{key}.back.safetensors"));
        ok(&[
            "weights",
            "import",
            &f.program,
            s(&e),
            "--from",
            &f.framework,
            "-o",
            s(&back),
        ]);
        assert!(
            std::fs::read(&back).unwrap() == std::fs::read(&w).unwrap(),
            "{key}: round trip"
        );
    }
}

#[test]
fn export_like_a_file_takes_its_names() {
    // Exported with the names of the original PyTorch/Keras file: the same tensors, name for name.
    let dir = tempfile::tempdir().unwrap();
    for key in FIXTURES {
        let f = fixture(key);
        let (w, _) = imported(dir.path(), key, &f);
        let e = dir.path().join(format!("{key}.like.safetensors"));
        ok(&[
            "weights",
            "export",
            &f.program,
            "--init",
            s(&w),
            "--to",
            &f.framework,
            "--like",
            &f.weights,
            "-o",
            s(&e),
            "-q",
        ]);
        assert!(tensors(Path::new(&f.weights)) == tensors(&e), "{key}");
    }
}

#[test]
fn trained_weights_round_trip_through_both_frameworks() {
    let dir = tempfile::tempdir().unwrap();
    for program in ["examples/mlp.dm", "examples/resnet_small.dm"] {
        let w = dir.path().join("w.safetensors");
        ok(&[
            "run",
            program,
            "--steps",
            "2",
            "--save",
            s(&w),
            "-q",
            "--synthetic-samples",
            "128",
        ]);
        for fw in ["torch", "keras"] {
            let e = dir.path().join(format!("{fw}.safetensors"));
            let back = dir.path().join(format!("{fw}.back.safetensors"));
            ok(&[
                "weights",
                "export",
                program,
                "--init",
                s(&w),
                "--to",
                fw,
                "-o",
                s(&e),
                "-q",
            ]);
            ok(&[
                "weights",
                "import",
                program,
                s(&e),
                "--from",
                fw,
                "-o",
                s(&back),
                "-q",
            ]);
            assert!(
                std::fs::read(&back).unwrap() == std::fs::read(&w).unwrap(),
                "{program} {fw}"
            );
        }
    }
}

#[test]
fn unconverted_files_given_to_init_name_the_importer() {
    let dir = tempfile::tempdir().unwrap();
    // A PyTorch state_dict of an nn.Sequential: no name in common with the program.
    let f = fixture("mlp_torch");
    let (code, _, err) = dmc(&[
        "eval", &f.program, "--init", &f.weights, "--data", &f.data, "-q",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("dmc weights import") && err.contains("mlp_torch.safetensors"),
        "{err}"
    );
    assert!(!err.contains("did you mean"), "{err}");
    // dmc's names in PyTorch's layouts (an export): the transposed shape is named as such.
    let (w, _) = imported(dir.path(), "mlp_torch", &f);
    let e = dir.path().join("e.safetensors");
    ok(&[
        "weights",
        "export",
        &f.program,
        "--init",
        s(&w),
        "--to",
        "torch",
        "-o",
        s(&e),
    ]);
    let (code, _, err) = dmc(&["eval", &f.program, "--init", s(&e), "--data", &f.data, "-q"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("file has [32,48], program expects [48,32]"),
        "{err}"
    );
    assert!(
        err.contains("transposed") && err.contains("dmc weights import"),
        "{err}"
    );
    assert!(!err.contains("different program"), "{err}");
    let c = fixture("convnet_torch");
    let (wc, _) = imported(dir.path(), "convnet_torch", &c);
    let ec = dir.path().join("ec.safetensors");
    ok(&[
        "weights",
        "export",
        &c.program,
        "--init",
        s(&wc),
        "--to",
        "torch",
        "-o",
        s(&ec),
    ]);
    let (code, _, err) = dmc(&[
        "eval",
        &c.program,
        "--init",
        s(&ec),
        "--data",
        &c.data,
        "-q",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("OIHW") && err.contains("dmc weights import"),
        "{err}"
    );
}

#[test]
fn import_errors_say_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.safetensors");
    // PyTorch layouts read as Keras: no module fits, and the message says which framework would.
    let f = fixture("seed_torch");
    let (code, _, err) = dmc(&[
        "weights",
        "import",
        &f.program,
        &f.weights,
        "--from",
        "keras",
        "-o",
        s(&out),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("no module fits layer `conv2d_1`") && err.contains("--from torch"),
        "{err}"
    );
    assert!(!out.exists());
    // Another network's file: the first layer that finds nothing is named.
    let m = fixture("mlp_torch");
    let (code, _, err) = dmc(&[
        "weights",
        "import",
        &f.program,
        &m.weights,
        "--from",
        "torch",
        "-o",
        s(&out),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("no module fits layer"), "{err}");
    // A tensor dmc has no place for (batch norm statistics).
    let extra = dir.path().join("bn.safetensors");
    let mut t = tensors(Path::new(&m.weights));
    t.insert(
        "1.running_mean".into(),
        ("F32".into(), vec![32], vec![0; 128]),
    );
    write_safetensors(&extra, &t);
    let (code, _, err) = dmc(&[
        "weights",
        "import",
        &m.program,
        s(&extra),
        "--from",
        "torch",
        "-o",
        s(&out),
    ]);
    assert_ne!(code, 0);
    // A batchnorm statistic of a module with no weight (the fixture has no module `1`).
    assert!(
        err.contains("module `1`") && err.contains("but no weight"),
        "{err}"
    );
    // A tensor that is no weight, bias or statistic at all is named.
    let mut t = tensors(Path::new(&m.weights));
    t.insert("1.lookup".into(), ("F32".into(), vec![32], vec![0; 128]));
    write_safetensors(&extra, &t);
    let (code, _, err) = dmc(&[
        "weights",
        "import",
        &m.program,
        s(&extra),
        "--from",
        "torch",
        "-o",
        s(&out),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("`1.lookup`") && err.contains("neither a weight"),
        "{err}"
    );
    // The argument order (file before program) works too.
    ok(&[
        "weights",
        "import",
        "--from",
        "torch",
        &m.weights,
        "-o",
        s(&out),
        &m.program,
    ]);
    assert!(out.exists());
}

/// Writes tensors (name -> (dtype, shape, bytes)) as a safetensors file, by hand.
pub(crate) fn write_safetensors(p: &Path, t: &BTreeMap<String, (String, Vec<u64>, Vec<u8>)>) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, (dtype, shape, bytes)) in t {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(p, out).unwrap();
}
