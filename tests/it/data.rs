//! `dmc run` with data files: the data order (`--no-shuffle`, `train { shuffle: false }`),
//! `.npz` archives, uint8 inputs with `--scale`, the data memory in the report.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::common;
use common::dmc;

const SAMPLES: usize = 16;

fn program(dir: &Path, name: &str, train_extra: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "input x: [4]\ntarget y: [1]\nout = x |> dense(3) |> relu |> dense(1)\nloss mse(out, y)\n\
             train {{ batch: 4, optimizer: sgd(lr: 0.05), seed: 3{train_extra} }}\n"
        ),
    )
    .expect("program");
    p
}

/// Sample `i`: distinct inputs and a target, as (x row, y).
fn sample(i: usize) -> ([f32; 4], f32) {
    let x = [0, 1, 2, 3].map(|k| ((i * 7 + k * 3) % 11) as f32 / 11.0);
    (x, x[0] - 0.5 * x[3] + 0.1 * i as f32)
}

/// `x.npy` and `y.npy` of the samples in `order`, in `dir`; the `--data` argument for them.
fn npy_data(dir: &Path, order: &[usize]) -> String {
    std::fs::create_dir_all(dir).expect("dir");
    let xs: Vec<f32> = order.iter().flat_map(|&i| sample(i).0).collect();
    let ys: Vec<f32> = order.iter().map(|&i| sample(i).1).collect();
    let (x, y) = (dir.join("x.npy"), dir.join("y.npy"));
    dmc_runtime::io::write_npy_f32(&x, &[order.len(), 4], &xs).expect("x");
    dmc_runtime::io::write_npy_f32(&y, &[order.len(), 1], &ys).expect("y");
    format!("x={},y={}", x.display(), y.display())
}

/// Runs `dmc run` and returns the loss column of its `--loss-log` and its stdout.
fn losses(dir: &Path, args: &[&str]) -> (Vec<String>, String) {
    let log = dir.join(format!("loss{}.txt", rand_suffix(args)));
    let log_s = log.display().to_string();
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--loss-log", &log_s, "-q"]);
    let (code, out, err) = dmc(&all);
    assert_eq!(code, 0, "{args:?}: {err}");
    let text = std::fs::read_to_string(&log).expect("loss log");
    let col = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().nth(1).expect("loss").to_string())
        .collect();
    (col, out)
}

/// A file name part that differs between argument lists.
fn rand_suffix(args: &[&str]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    args.hash(&mut h);
    h.finish()
}

#[test]
fn no_shuffle_keeps_the_file_order() {
    let d = tempfile::tempdir().expect("tempdir");
    let net = program(d.path(), "net.dm", "");
    let net = net.to_str().expect("utf-8");
    let in_order: Vec<usize> = (0..SAMPLES).collect();
    let data = npy_data(&d.path().join("a"), &in_order);
    // The shuffled run reads epoch 0 in the seeded order; the same samples written to a file in
    // that order and read with --no-shuffle give the same steps, bit for bit.
    let (shuffled, _) = losses(d.path(), &[net, "--data", &data, "--epochs", "1"]);
    let perm = dmc_runtime::io::epoch_order(SAMPLES, 3, 0);
    let pre = npy_data(&d.path().join("b"), &perm);
    let (file_order, _) = losses(
        d.path(),
        &[net, "--data", &pre, "--epochs", "1", "--no-shuffle"],
    );
    assert_eq!(shuffled.len(), SAMPLES / 4);
    assert_eq!(file_order, shuffled);
    // --no-shuffle on the original file is another order: other losses.
    let (plain, _) = losses(
        d.path(),
        &[net, "--data", &data, "--epochs", "1", "--no-shuffle"],
    );
    assert_ne!(plain, shuffled);
    // Every epoch in file order: epoch 2 reads the batches of epoch 1 again, in the same order.
    let (two, _) = losses(
        d.path(),
        &[net, "--data", &pre, "--epochs", "2", "--no-shuffle"],
    );
    assert_eq!(&two[..4], &file_order[..]);
    // `train { shuffle: false }` is --no-shuffle; --shuffle overrides it.
    let fixed = program(d.path(), "fixed.dm", ", shuffle: false");
    let fixed = fixed.to_str().expect("utf-8");
    let (by_file, _) = losses(d.path(), &[fixed, "--data", &pre, "--epochs", "1"]);
    assert_eq!(by_file, file_order);
    let (overridden, _) = losses(
        d.path(),
        &[fixed, "--data", &data, "--epochs", "1", "--shuffle"],
    );
    assert_eq!(overridden, shuffled);
    let (code, _, err) = dmc(&["run", net, "--shuffle", "--no-shuffle", "--steps", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("--no-shuffle"), "{err}");
}

#[test]
fn resume_refuses_another_data_order() {
    let d = tempfile::tempdir().expect("tempdir");
    let net = program(d.path(), "net.dm", "");
    let net = net.to_str().expect("utf-8");
    let data = npy_data(&d.path().join("a"), &(0..SAMPLES).collect::<Vec<_>>());
    let w = d.path().join("w.safetensors");
    let w = w.to_str().expect("utf-8");
    let base = [
        "run",
        net,
        "--data",
        &data,
        "--save",
        w,
        "--save-every",
        "1",
        "-q",
    ];
    let (code, _, err) = dmc(&[&base[..], &["--steps", "2"]].concat());
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = dmc(&[&base[..], &["--steps", "4", "--resume", "--no-shuffle"]].concat());
    assert_ne!(code, 0);
    assert!(err.contains("file-order"), "{err}");
    let (code, _, err) = dmc(&[&base[..], &["--steps", "4", "--resume"]].concat());
    assert_eq!(code, 0, "{err}");
}

/// A `.npy` file by hand (numpy's layout), for dtypes the writer does not produce.
fn npy_bytes(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if shape.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn uint8_inputs_with_a_scale() {
    let d = tempfile::tempdir().expect("tempdir");
    let net = program(d.path(), "net.dm", "");
    let net = net.to_str().expect("utf-8");
    let pixels: Vec<u8> = (0..SAMPLES * 4).map(|i| (i * 37 % 256) as u8).collect();
    let ys: Vec<f32> = (0..SAMPLES).map(|i| sample(i).1).collect();
    let (x8, y) = (d.path().join("x8.npy"), d.path().join("y.npy"));
    std::fs::write(&x8, npy_bytes("|u1", &[SAMPLES, 4], &pixels)).expect("x8");
    dmc_runtime::io::write_npy_f32(&y, &[SAMPLES, 1], &ys).expect("y");
    let data8 = format!("x={},y={}", x8.display(), y.display());
    // Without a scale: refused, saying how.
    let (code, _, err) = dmc(&["run", net, "--data", &data8, "--steps", "1", "-q"]);
    assert_ne!(code, 0);
    assert!(err.contains("--scale x=1/255"), "{err}");
    // With one: the same run as on the f32 values b * (1/255).
    let (scaled, _) = losses(
        d.path(),
        &[net, "--data", &data8, "--scale", "x=1/255", "--steps", "4"],
    );
    let k = 1.0f32 / 255.0;
    let xf: Vec<f32> = pixels.iter().map(|&b| f32::from(b) * k).collect();
    let x32 = d.path().join("x32.npy");
    dmc_runtime::io::write_npy_f32(&x32, &[SAMPLES, 4], &xf).expect("x32");
    let data32 = format!("x={},y={}", x32.display(), y.display());
    let (reference, _) = losses(d.path(), &[net, "--data", &data32, "--steps", "4"]);
    assert_eq!(scaled, reference);
    // A bad scale is a usage error naming the form.
    let (code, _, err) = dmc(&[
        "run", net, "--data", &data8, "--scale", "x=0", "--steps", "1",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("NAME=FACTOR"), "{err}");
}

fn npz(path: &Path, members: &[(&str, Vec<u8>)]) {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in members {
        z.start_file(format!("{name}.npy"), opts).expect("member");
        z.write_all(bytes).expect("write");
    }
    std::fs::write(path, z.finish().expect("finish").into_inner()).expect("npz");
}

#[test]
fn npz_data_and_the_data_memory_report() {
    let d = tempfile::tempdir().expect("tempdir");
    let net = program(d.path(), "net.dm", "");
    let net = net.to_str().expect("utf-8");
    let order: Vec<usize> = (0..SAMPLES).collect();
    let data = npy_data(&d.path().join("a"), &order);
    let json = d.path().join("summary.json");
    let json_s = json.to_str().expect("utf-8");
    let data_bytes = |out: &str| {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("summary")).expect("json");
        assert!(out.contains("host data "), "{out}");
        (
            v["data_mapped_bytes"].as_u64().expect("mapped"),
            v["data_in_memory_bytes"].as_u64().expect("in memory"),
        )
    };
    let (reference, out) = losses(
        d.path(),
        &[
            net,
            "--data",
            &data,
            "--steps",
            "4",
            "--summary-json",
            json_s,
        ],
    );
    // The report: x.npy mapped in place, the f32 targets (16 x 4 B) in memory.
    let x_len = std::fs::metadata(d.path().join("a/x.npy"))
        .expect("x")
        .len();
    assert_eq!(data_bytes(&out), (x_len, (SAMPLES * 4) as u64));
    // The same arrays in an .npz archive: the same run, the archive mapped.
    let read = |n: &str| std::fs::read(d.path().join("a").join(n)).expect("npy");
    let arc = d.path().join("d.npz");
    npz(&arc, &[("x", read("x.npy")), ("y", read("y.npy"))]);
    let arc_s = arc.to_str().expect("utf-8");
    let (from_npz, out) = losses(
        d.path(),
        &[
            net,
            "--data",
            arc_s,
            "--steps",
            "4",
            "--summary-json",
            json_s,
        ],
    );
    assert_eq!(from_npz, reference);
    let arc_len = std::fs::metadata(&arc).expect("npz").len();
    assert_eq!(data_bytes(&out), (arc_len, (SAMPLES * 4) as u64));
}
