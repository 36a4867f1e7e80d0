//! `dmc weights import|export` of batchnorm and layernorm layers: their scales, shifts and running
//! statistics under PyTorch's and Keras's names, PyTorch's `num_batches_tracked` counter, matching
//! by order and shape, and the error for a module without its statistics. (With real PyTorch:
//! `bench/interop.py`, which loads the exports into `nn.BatchNorm2d` modules strictly.)

use std::path::Path;

use crate::interop::{ok, s, tensors, trained, write_safetensors};

const LAYERNORM: &str = "input x: [8]\ntarget y: int\n\
    logits = x |> dense(16) |> layernorm as ln |> relu |> dense(3)\n\
    loss cross_entropy(logits, y)\ntrain { batch: 4, optimizer: sgd(lr: 0.1) }\n";

fn export(program: &str, w: &Path, fw: &str, out: &Path) {
    ok(&[
        "weights",
        "export",
        program,
        "--init",
        s(w),
        "--to",
        fw,
        "-o",
        s(out),
        "-q",
    ]);
}

fn import(program: &str, file: &Path, fw: &str, out: &Path) -> String {
    ok(&[
        "weights",
        "import",
        program,
        s(file),
        "--from",
        fw,
        "-o",
        s(out),
    ])
}

#[test]
fn batchnorm_statistics_travel_under_each_frameworks_names() {
    let dir = tempfile::tempdir().unwrap();
    let program = "examples/bn_cnn.dm";
    let w = dir.path().join("w.safetensors");
    trained(program, &w);
    let ours = tensors(&w);
    // After training, the statistics are no longer their 0 / 1 initial values.
    let (_, _, mean) = &ours["batchnorm_1.running_mean"];
    assert!(mean.iter().any(|&b| b != 0), "running mean untouched");

    let t = dir.path().join("torch.safetensors");
    export(program, &w, "torch", &t);
    let theirs = tensors(&t);
    for (name, want) in [
        ("batchnorm_2.weight", "batchnorm_2.weight"),
        ("batchnorm_2.running_mean", "batchnorm_2.running_mean"),
        ("batchnorm_3.running_var", "batchnorm_3.running_var"),
    ] {
        assert_eq!(theirs[want], ours[name], "{name} -> {want}");
    }
    // PyTorch's strict load wants the counter: an i64 scalar per batchnorm.
    for i in 1..=3 {
        let (dtype, shape, bytes) = &theirs[&format!("batchnorm_{i}.num_batches_tracked")];
        assert_eq!((dtype.as_str(), shape.len(), bytes.len()), ("I64", 0, 8));
    }
    assert_eq!(theirs.len(), ours.len() + 3);

    let k = dir.path().join("keras.safetensors");
    export(program, &w, "keras", &k);
    let keras = tensors(&k);
    assert_eq!(keras["batchnorm_1/gamma"], ours["batchnorm_1.weight"]);
    assert_eq!(keras["batchnorm_1/beta"], ours["batchnorm_1.bias"]);
    assert_eq!(
        keras["batchnorm_1/moving_mean"],
        ours["batchnorm_1.running_mean"]
    );
    assert_eq!(
        keras["batchnorm_1/moving_variance"],
        ours["batchnorm_1.running_var"]
    );
    assert_eq!(keras.len(), ours.len());

    // Both come back byte for byte (the counter is dropped on the way in).
    for (fw, file) in [("torch", &t), ("keras", &k)] {
        let back = dir.path().join(format!("{fw}.back.safetensors"));
        import(program, file, fw, &back);
        assert!(
            std::fs::read(&back).unwrap() == std::fs::read(&w).unwrap(),
            "{fw}"
        );
    }
}

#[test]
fn batchnorm_modules_match_by_order_and_shape_under_other_names() {
    let dir = tempfile::tempdir().unwrap();
    let program = "examples/bn_cnn.dm";
    let w = dir.path().join("w.safetensors");
    trained(program, &w);
    let t = dir.path().join("torch.safetensors");
    export(program, &w, "torch", &t);
    // An nn.Sequential's names: modules numbered in forward order (conv, bn, conv, bn, dense, bn,
    // dense), so only the order and the shapes can match them.
    let order = [
        "conv2d_1",
        "batchnorm_1",
        "conv2d_2",
        "batchnorm_2",
        "dense_1",
        "batchnorm_3",
        "dense_2",
    ];
    let renamed = tensors(&t)
        .into_iter()
        .map(|(name, v)| {
            let (module, leaf) = name.rsplit_once('.').unwrap();
            let i = order.iter().position(|m| *m == module).unwrap();
            (format!("features.{}.{leaf}", i * 2), v)
        })
        .collect();
    let seq = dir.path().join("seq.safetensors");
    write_safetensors(&seq, &renamed);
    let back = dir.path().join("back.safetensors");
    let table = import(program, &seq, "torch", &back);
    assert!(
        table.contains("features.2.running_var") && table.contains("batchnorm_1.running_var"),
        "{table}"
    );
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&w).unwrap());

    // A batchnorm module without its running variance fits no layer: the error says so.
    let mut partial = tensors(&t);
    partial.remove("batchnorm_2.running_var");
    let bad = dir.path().join("bad.safetensors");
    write_safetensors(&bad, &partial);
    let out = dir.path().join("out.safetensors");
    let (code, _, err) = crate::common::dmc(&[
        "weights",
        "import",
        program,
        s(&bad),
        "--from",
        "torch",
        "-o",
        s(&out),
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("no module fits layer `batchnorm_") && err.contains("running mean [16] only"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written on an error");
}

#[test]
fn layernorm_scale_and_shift_travel_as_gamma_and_beta() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("ln.dm");
    std::fs::write(&program, LAYERNORM).unwrap();
    let program = s(&program);
    let w = dir.path().join("w.safetensors");
    trained(program, &w);
    let ours = tensors(&w);
    let k = dir.path().join("keras.safetensors");
    export(program, &w, "keras", &k);
    let keras = tensors(&k);
    assert_eq!(keras["ln/gamma"], ours["ln.weight"]);
    assert_eq!(keras["ln/beta"], ours["ln.bias"]);
    let t = dir.path().join("torch.safetensors");
    export(program, &w, "torch", &t);
    assert_eq!(tensors(&t).len(), ours.len(), "no statistics, no counter");
    for (fw, file) in [("torch", &t), ("keras", &k)] {
        let back = dir.path().join(format!("{fw}.back.safetensors"));
        import(program, file, fw, &back);
        assert!(
            std::fs::read(&back).unwrap() == std::fs::read(&w).unwrap(),
            "{fw}"
        );
    }
}
