//! Training data: loading, checks, synthetic data, splitting, batching.

use crate::npyfile;
use npyfile::encode_npy;

use std::fs;
use std::path::Path;

use dmc_plan::op::DType;
use dmc_runtime::io::data::BatchData;
use dmc_runtime::io::{epoch_order, Dataset, Epoch, IoError, Task, TensorSpec};
use safetensors::Dtype;

fn specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec::input("x", &[2, 3]),
        TensorSpec::target("y", &[], DType::I32),
    ]
}

fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn f64b(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn i32b(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn i64b(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn xs(n: usize) -> Vec<f32> {
    (0..n * 6).map(|i| i as f32 / 10.0).collect()
}

fn write_st(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.to_string(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn write_npy(path: &Path, descr: &str, shape: &[usize], bytes: &[u8]) {
    fs::write(path, encode_npy(descr, shape, bytes)).unwrap();
}

/// A standard good dataset file: x f32 [5,2,3], y i64 [5] (+ an extra tensor).
fn good_st(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("d.safetensors");
    write_st(
        &p,
        &[
            ("x", Dtype::F32, vec![5, 2, 3], f32b(&xs(5))),
            ("y", Dtype::I64, vec![5], i64b(&[0, 1, 2, 1, 0])),
            ("meta", Dtype::U8, vec![2], vec![1, 2]),
        ],
    );
    p
}

#[test]
fn safetensors_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = good_st(dir.path());
    let d = Dataset::load(&p, &specs()).unwrap();
    assert_eq!(d.len(), 5);
    assert_eq!(d.tensor_f32("x").unwrap(), xs(5).as_slice());
    assert_eq!(d.tensor_i32("y").unwrap(), &[0, 1, 2, 1, 0]);
    assert_eq!(d.ignored(), &["meta".to_string()]);
    d.check_classes("y", 3).unwrap();
    let e = d.check_classes("y", 2).unwrap_err();
    assert!(
        matches!(e, IoError::LabelOutOfRange { index: 2, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("`y`"), "{e}");
}

#[test]
fn npy_directory_and_lists() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(&dir.path().join("x.npy"), "<f4", &[4, 2, 3], &f32b(&xs(4)));
    write_npy(&dir.path().join("y.npy"), "<i4", &[4], &i32b(&[3, 2, 1, 0]));
    write_npy(&dir.path().join("unused.npy"), "<i4", &[1], &i32b(&[7]));
    let d = Dataset::load(dir.path(), &specs()).unwrap();
    assert_eq!(d.len(), 4);
    assert_eq!(d.tensor_f32("x").unwrap(), xs(4).as_slice());
    assert_eq!(d.tensor_i32("y").unwrap(), &[3, 2, 1, 0]);
    assert_eq!(d.ignored(), &["unused".to_string()]);

    // By stem.
    let list = format!(
        "{},{}",
        dir.path().join("x.npy").display(),
        dir.path().join("y.npy").display()
    );
    let d2 = Dataset::load(Path::new(&list), &specs()).unwrap();
    assert_eq!(d2.tensor_f32("x"), d.tensor_f32("x"));
    assert_eq!(d2.tensor_i32("y"), d.tensor_i32("y"));
    assert!(d2.ignored().is_empty());
    // Explicit names, different file names.
    fs::copy(dir.path().join("x.npy"), dir.path().join("a.npy")).unwrap();
    fs::copy(dir.path().join("y.npy"), dir.path().join("b.npy")).unwrap();
    let list = format!(
        "x={}, y={}",
        dir.path().join("a.npy").display(),
        dir.path().join("b.npy").display()
    );
    let d3 = Dataset::load(Path::new(&list), &specs()).unwrap();
    assert_eq!(d3.tensor_i32("y").unwrap(), &[3, 2, 1, 0]);

    // Duplicate names.
    let list = format!(
        "x={},x={}",
        dir.path().join("a.npy").display(),
        dir.path().join("b.npy").display()
    );
    let e = Dataset::load(Path::new(&list), &specs()).unwrap_err();
    assert!(matches!(e, IoError::DuplicateTensor { .. }), "{e:?}");
}

#[test]
fn missing_tensor_lists_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.safetensors");
    write_st(
        &p,
        &[
            ("x", Dtype::F32, vec![5, 2, 3], f32b(&xs(5))),
            ("labels", Dtype::I32, vec![5], i32b(&[0; 5])),
        ],
    );
    let s = vec![
        TensorSpec::input("x", &[2, 3]),
        TensorSpec::target("label", &[], DType::I32),
    ];
    let e = Dataset::load(&p, &s).unwrap_err();
    match &e {
        IoError::MissingTensor {
            name,
            expected,
            found,
            ..
        } => {
            assert_eq!(name, "label");
            assert_eq!(expected, &vec!["x".to_string(), "label".to_string()]);
            assert_eq!(found, &vec!["labels".to_string(), "x".to_string()]);
        }
        _ => panic!("{e:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("d.safetensors"), "{msg}");
    assert!(msg.contains("did you mean `labels`"), "{msg}");

    // npy directory without y.npy.
    write_npy(&dir.path().join("x.npy"), "<f4", &[4, 2, 3], &f32b(&xs(4)));
    let e = Dataset::load(dir.path(), &specs()).unwrap_err();
    assert!(
        matches!(&e, IoError::MissingTensor { name, .. } if name == "y"),
        "{e:?}"
    );
}

#[test]
fn wrong_per_sample_shape() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.safetensors");
    write_st(
        &p,
        &[
            ("x", Dtype::F32, vec![5, 3, 2], f32b(&xs(5))),
            ("y", Dtype::I32, vec![5], i32b(&[0; 5])),
        ],
    );
    let e = Dataset::load(&p, &specs()).unwrap_err();
    assert!(
        matches!(&e, IoError::SampleShapeMismatch { name, .. } if name == "x"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("[5,3,2]") && msg.contains("[2,3]") && msg.contains("`x`"),
        "{msg}"
    );
    assert!(msg.contains("d.safetensors"), "{msg}");
}

#[test]
fn size_one_dims_are_tolerated() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.safetensors");
    write_st(
        &p,
        &[
            ("x", Dtype::F32, vec![5, 1, 2, 3], f32b(&xs(5))),
            ("y", Dtype::I32, vec![5, 1], i32b(&[1; 5])),
        ],
    );
    let d = Dataset::load(&p, &specs()).unwrap();
    assert_eq!(d.tensor_i32("y").unwrap(), &[1; 5]);
}

#[test]
fn disagreeing_sample_counts() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.safetensors");
    write_st(
        &p,
        &[
            ("x", Dtype::F32, vec![5, 2, 3], f32b(&xs(5))),
            ("y", Dtype::I32, vec![4], i32b(&[0; 4])),
        ],
    );
    let e = Dataset::load(&p, &specs()).unwrap_err();
    assert!(matches!(e, IoError::SampleCountMismatch { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("`x` has 5") && msg.contains("`y` has 4"),
        "{msg}"
    );
}

#[test]
fn zero_samples() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.safetensors");
    write_st(
        &p,
        &[
            ("x", Dtype::F32, vec![0, 2, 3], vec![]),
            ("y", Dtype::I32, vec![0], vec![]),
        ],
    );
    let e = Dataset::load(&p, &specs()).unwrap_err();
    assert!(matches!(e, IoError::NoSamples { .. }), "{e:?}");
}

#[test]
#[allow(clippy::result_large_err)]
fn dtype_rules() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.safetensors");
    let load = |x: (Dtype, Vec<u8>), y: (Dtype, Vec<u8>)| {
        write_st(
            &p,
            &[("x", x.0, vec![2, 2, 3], x.1), ("y", y.0, vec![2], y.1)],
        );
        Dataset::load(&p, &specs())
    };
    let xf = || (Dtype::F32, f32b(&xs(2)));
    // f64 inputs converted.
    let xd: Vec<f64> = xs(2).iter().map(|&v| v as f64).collect();
    let d = load((Dtype::F64, f64b(&xd)), (Dtype::U8, vec![1, 2])).unwrap();
    assert_eq!(d.tensor_f32("x").unwrap(), xs(2).as_slice());
    assert_eq!(d.tensor_i32("y").unwrap(), &[1, 2]);
    // Integer inputs rejected without a scale, saying how to give one.
    let e = load((Dtype::I32, i32b(&[0; 12])), (Dtype::I32, i32b(&[0, 0]))).unwrap_err();
    assert!(
        matches!(&e, IoError::NeedsScale { name, found, .. } if name == "x" && found == "i32"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("--scale x=1/255") && e.to_string().contains("float32"),
        "{e}"
    );
    // Integral float labels accepted, others rejected.
    let d = load(xf(), (Dtype::F32, f32b(&[2.0, 0.0]))).unwrap();
    assert_eq!(d.tensor_i32("y").unwrap(), &[2, 0]);
    let e = load(xf(), (Dtype::F32, f32b(&[2.0, 0.5]))).unwrap_err();
    assert!(
        matches!(e, IoError::NonIntegralLabel { index: 1, .. }),
        "{e:?}"
    );
    // Negative and too large labels.
    let e = load(xf(), (Dtype::I64, i64b(&[0, -1]))).unwrap_err();
    assert!(
        matches!(e, IoError::LabelOutOfRange { index: 1, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("negative"), "{e}");
    let e = load(xf(), (Dtype::I64, i64b(&[1 << 40, 0]))).unwrap_err();
    assert!(
        matches!(e, IoError::LabelOutOfRange { index: 0, .. }),
        "{e:?}"
    );
    // NaN input.
    let mut bad = xs(2);
    bad[7] = f32::NAN;
    let e = load((Dtype::F32, f32b(&bad)), (Dtype::I32, i32b(&[0, 0]))).unwrap_err();
    assert!(matches!(e, IoError::NonFinite { index: 7, .. }), "{e:?}");
}

#[test]
fn regression_targets_f32() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(
        &dir.path().join("x.npy"),
        "<f8",
        &[3, 2],
        &f64b(&[1., 2., 3., 4., 5., 6.]),
    );
    write_npy(
        &dir.path().join("t.npy"),
        "<f4",
        &[3],
        &f32b(&[0.5, 1.5, 2.5]),
    );
    let s = vec![
        TensorSpec::input("x", &[2]),
        TensorSpec::target("t", &[1], DType::F32),
    ];
    let d = Dataset::load(dir.path(), &s).unwrap();
    let mut out = [0f32; 2];
    d.fill_f32("t", &[2, 0], &mut out).unwrap();
    assert_eq!(out, [2.5, 0.5]);
}

#[test]
fn truncated_and_corrupt_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = good_st(dir.path());
    let bytes = fs::read(&p).unwrap();
    fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = Dataset::load(&p, &specs()).unwrap_err();
    assert!(matches!(e, IoError::Safetensors { .. }), "{e:?}");
    assert!(e.to_string().contains("d.safetensors"), "{e}");
    fs::write(&p, b"\xff\xff\xff\xff\xff\xff\xff\x00 random garbage").unwrap();
    let e = Dataset::load(&p, &specs()).unwrap_err();
    assert!(matches!(e, IoError::Safetensors { .. }), "{e:?}");

    // Truncated npy.
    let x = encode_npy("<f4", &[4, 2, 3], &f32b(&xs(4)));
    fs::write(dir.path().join("x.npy"), &x[..x.len() - 10]).unwrap();
    write_npy(&dir.path().join("y.npy"), "<i4", &[4], &i32b(&[0; 4]));
    let e = Dataset::load(dir.path(), &specs()).unwrap_err();
    assert!(matches!(e, IoError::Npy { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("x.npy") && msg.contains("truncated"), "{msg}");
    // Garbage npy.
    fs::write(dir.path().join("x.npy"), b"this is not numpy data").unwrap();
    let e = Dataset::load(dir.path(), &specs()).unwrap_err();
    assert!(matches!(e, IoError::Npy { .. }), "{e:?}");
}

#[test]
fn not_found_and_bad_args() {
    let dir = tempfile::tempdir().unwrap();
    let e = Dataset::load(&dir.path().join("nope.safetensors"), &specs()).unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("nope.safetensors"), "{e}");
    let e = Dataset::load(Path::new("x=,y=b.npy"), &specs()).unwrap_err();
    assert!(matches!(e, IoError::BadDataArg { .. }), "{e:?}");
    let list = format!("x={}", dir.path().join("missing.npy").display());
    let e = Dataset::load(Path::new(&list), &specs()).unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e:?}");
    // A file that does not exist is "not found", not a tensor missing by name: a bare file named
    // after no tensor, and one missing file of a list whose names all match.
    let bare = dir.path().join("image.npy");
    let e = Dataset::load(&bare, &specs()).unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e:?}");
    assert!(
        e.to_string().contains("not found") && e.to_string().contains("image.npy"),
        "{e}"
    );
    let x = dir.path().join("x.npy");
    fs::write(&x, encode_npy("<f4", &[2, 2, 3], &f32b(&xs(2)))).unwrap();
    let list = format!("{},y={}", x.display(), dir.path().join("y.npy").display());
    let e = Dataset::load(Path::new(&list), &specs()).unwrap_err();
    assert!(
        matches!(&e, IoError::NotFound { path, .. } if path.ends_with("y.npy")),
        "{e:?}"
    );
    let txt = dir.path().join("d.csv");
    fs::write(&txt, b"1,2").unwrap();
    let e = Dataset::load(&txt, &specs()).unwrap_err();
    assert!(matches!(e, IoError::UnsupportedFormat { .. }), "{e:?}");
}

#[test]
fn synthetic_is_deterministic_and_learnable_shaped() {
    let task = Task::Classification { classes: 4 };
    let a = Dataset::synthetic(&specs(), 500, 7, task).unwrap();
    let b = Dataset::synthetic(&specs(), 500, 7, task).unwrap();
    let c = Dataset::synthetic(&specs(), 500, 8, task).unwrap();
    assert_eq!(a, b);
    assert_ne!(a.tensor_f32("x"), c.tensor_f32("x"));
    assert_ne!(a.tensor_i32("y"), c.tensor_i32("y"));
    let x = a.tensor_f32("x").unwrap();
    assert_eq!(x.len(), 500 * 6);
    assert!(x.iter().all(|&v| (0.0..1.0).contains(&v)));
    let y = a.tensor_i32("y").unwrap();
    let mut counts = [0; 4];
    for &l in y {
        assert!((0..4).contains(&l));
        counts[l as usize] += 1;
    }
    assert!(
        counts.iter().all(|&c| c >= 25),
        "unbalanced classes {counts:?}"
    );
    a.check_classes("y", 4).unwrap();
}

#[test]
fn synthetic_regression_and_one_hot() {
    let s = vec![
        TensorSpec::input("x", &[8]),
        TensorSpec::target("t", &[2], DType::F32),
    ];
    let d = Dataset::synthetic(&s, 400, 1, Task::Regression).unwrap();
    let t = d.tensor_f32("t").unwrap();
    for o in 0..2 {
        let v: Vec<f64> = (0..400).map(|n| t[n * 2 + o] as f64).collect();
        let mean = v.iter().sum::<f64>() / 400.0;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 400.0;
        assert!(
            mean.abs() < 1e-4 && (var - 1.0).abs() < 1e-3,
            "{mean} {var}"
        );
    }
    let s = vec![
        TensorSpec::input("x", &[8]),
        TensorSpec::target("t", &[3], DType::F32),
    ];
    let d = Dataset::synthetic(&s, 50, 1, Task::Classification { classes: 3 }).unwrap();
    for row in d.tensor_f32("t").unwrap().chunks(3) {
        assert_eq!(row.iter().sum::<f32>(), 1.0);
        assert!(row.iter().all(|&v| v == 0.0 || v == 1.0));
    }
    // Errors.
    let e = Dataset::synthetic(&specs(), 10, 1, Task::Regression).unwrap_err();
    assert!(matches!(e, IoError::Synthetic { .. }), "{e:?}");
    let e = Dataset::synthetic(&specs(), 0, 1, Task::Classification { classes: 3 }).unwrap_err();
    assert!(matches!(e, IoError::Synthetic { .. }), "{e:?}");
}

#[test]
fn split_sizes_and_determinism() {
    // x = sample index, so the parts can be identified.
    let dir = tempfile::tempdir().unwrap();
    let xv: Vec<f32> = (0..100).map(|i| i as f32).collect();
    write_npy(&dir.path().join("x.npy"), "<f4", &[100], &f32b(&xv));
    write_npy(&dir.path().join("y.npy"), "<i4", &[100], &i32b(&[0; 100]));
    let s = vec![
        TensorSpec::input("x", &[]),
        TensorSpec::target("y", &[], DType::I32),
    ];
    let d = Dataset::load(dir.path(), &s).unwrap();
    let (tr, va) = d.split(0.2, 3).unwrap();
    assert_eq!((tr.len(), va.len()), (80, 20));
    let (tr2, va2) = d.split(0.2, 3).unwrap();
    assert_eq!((&tr, &va), (&tr2, &va2));
    let mut all: Vec<f32> = tr.tensor_f32("x").unwrap().to_vec();
    all.extend_from_slice(&va.tensor_f32("x").unwrap());
    all.sort_by(f32::total_cmp);
    assert_eq!(all, xv);
    let (_, va3) = d.split(0.2, 4).unwrap();
    assert_ne!(va, va3);
    for f in [0.0, 1.0, -0.5, 0.001, f64::NAN] {
        let e = d.split(f, 0).unwrap_err();
        assert!(matches!(e, IoError::InvalidSplit { .. }), "{f}: {e:?}");
    }
}

#[test]
fn epoch_shuffles_are_deterministic_permutations() {
    let a = epoch_order(37, 5, 0);
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..37).collect::<Vec<_>>());
    assert_eq!(a, epoch_order(37, 5, 0));
    assert_ne!(a, epoch_order(37, 5, 1));
    assert_ne!(a, epoch_order(37, 6, 0));
    assert!(epoch_order(0, 1, 1).is_empty());

    let e = Epoch::shuffled(10, 3, 1, 2);
    assert_eq!(e.num_batches(), 3);
    assert_eq!(e.dropped(), 1);
    let seen: Vec<usize> = e.batches().flatten().copied().collect();
    assert_eq!(seen.len(), 9);
    assert_eq!(&seen[..], &epoch_order(10, 1, 2)[..9]);
    assert_eq!(e.batch(1), &seen[3..6]);

    let p = Epoch::in_order_padded(10, 3);
    assert_eq!(p.num_batches(), 4);
    assert_eq!(p.dropped(), 0);
    assert_eq!(p.batch(3), &[9, 0, 1]);
    assert_eq!((p.valid(0), p.valid(3)), (3, 1));
}

#[test]
fn filling_batches() {
    let d = Dataset::synthetic(&specs(), 10, 2, Task::Classification { classes: 3 }).unwrap();
    let x = d.tensor_f32("x").unwrap().to_vec();
    let y = d.tensor_i32("y").unwrap().to_vec();
    let idx = [4, 0, 9];
    let mut bx = vec![0f32; 18];
    let mut by = vec![0i32; 3];
    d.fill_f32("x", &idx, &mut bx).unwrap();
    d.fill_i32("y", &idx, &mut by).unwrap();
    for (k, &i) in idx.iter().enumerate() {
        assert_eq!(&bx[k * 6..k * 6 + 6], &x[i * 6..i * 6 + 6]);
        assert_eq!(by[k], y[i]);
    }
    assert_eq!(d.fill_batch(&idx, "y").unwrap(), BatchData::I32(by.clone()));
    let mut raw = vec![0u8; 12];
    d.fill_bytes("y", &idx, &mut raw).unwrap();
    assert_eq!(
        raw,
        by.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<_>>()
    );

    let e = d.fill_f32("x", &idx, &mut [0f32; 17]).unwrap_err();
    assert!(matches!(e, IoError::BatchBuffer { .. }), "{e:?}");
    let e = d.fill_i32("x", &idx, &mut [0i32; 18]).unwrap_err();
    assert!(matches!(e, IoError::BatchBuffer { .. }), "{e:?}");
    let e = d.fill_i32("y", &[10], &mut [0i32; 1]).unwrap_err();
    assert!(matches!(e, IoError::BatchBuffer { .. }), "{e:?}");
    let e = d.fill_f32("nope", &idx, &mut bx).unwrap_err();
    assert!(matches!(e, IoError::NoSuchTensor { .. }), "{e:?}");

    let e = d.epoch(11, 0, 0).unwrap_err();
    assert!(matches!(e, IoError::BatchTooLarge { .. }), "{e:?}");
    assert_eq!(d.epoch(4, 0, 0).unwrap().num_batches(), 2);
    assert_eq!(d.in_order_padded(4).unwrap().num_batches(), 3);
}

#[test]
fn unsupported_spec_dtype() {
    let s = vec![TensorSpec::target("m", &[], DType::U8)];
    let e = Dataset::load(Path::new("whatever.safetensors"), &s).unwrap_err();
    assert!(matches!(e, IoError::UnsupportedSpecDtype { .. }), "{e:?}");
}

#[test]
fn specs_from_plan_bindings() {
    use dmc_plan::plan::IoBinding;
    use dmc_runtime::io::TensorRole;
    let b = IoBinding {
        name: "image".into(),
        buffer: 3,
        shape: vec![32, 28, 28, 1],
        dtype: DType::F32,
    };
    let s = TensorSpec::from_binding(&b, TensorRole::Input);
    assert_eq!(s, TensorSpec::input("image", &[28, 28, 1]));
    let b = IoBinding {
        name: "label".into(),
        buffer: 4,
        shape: vec![32],
        dtype: DType::I32,
    };
    let s = TensorSpec::from_binding(&b, TensorRole::Target);
    assert_eq!(s, TensorSpec::target("label", &[], DType::I32));
    assert_eq!(s.sample_len(), 1);
}

#[test]
fn synthetic_bigger_inputs_multiple_tensors() {
    let s = vec![
        TensorSpec::input("a", &[8, 8, 3]),
        TensorSpec::input("b", &[5]),
        TensorSpec::target("y", &[], DType::I32),
        TensorSpec::target("z", &[1], DType::F32),
    ];
    let task = Task::Classification { classes: 10 };
    // An f32 target that is not one-hot of 10 classes is, under classification, a regression
    // target (another loss term's, `loss mse(out, z) + cross_entropy(logits, y)`): standardised
    // values of a linear teacher, while `y` still gets labels.
    let d = Dataset::synthetic(&s, 64, 3, task).unwrap();
    let z = d.tensor_f32("z").expect("z is f32");
    assert_eq!(z.len(), 64);
    let mean = z.iter().map(|&v| v as f64).sum::<f64>() / 64.0;
    let var = z.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 64.0;
    assert!(
        mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4,
        "mean {mean}, var {var}"
    );
    assert!(z.iter().any(|&v| v != 0.0 && v != 1.0));
    let y = d.tensor_i32("y").expect("labels");
    assert!(y.iter().all(|&l| (0..10).contains(&l)));
    let s = &s[..3];
    let d1 = Dataset::synthetic(s, 300, 3, task).unwrap();
    let d2 = Dataset::synthetic(s, 300, 3, task).unwrap();
    assert_eq!(d1, d2);
    assert_eq!(d1.tensor_f32("a").unwrap().len(), 300 * 192);
    assert_eq!(d1.tensor_f32("b").unwrap().len(), 300 * 5);
    let y = d1.tensor_i32("y").unwrap();
    let distinct: std::collections::BTreeSet<i32> = y.iter().copied().collect();
    assert!(distinct.len() >= 5, "{distinct:?}");
    d1.check_classes("y", 10).unwrap();
}

#[test]
fn a_saved_dataset_loads_back_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let data = Dataset::synthetic(&specs(), 10, 4, Task::Classification { classes: 3 }).unwrap();
    // .safetensors: every tensor named, f32 inputs and i32 labels as held.
    let st = dir.path().join("d.safetensors");
    data.save(&st, &["x", "y"]).unwrap();
    let back = Dataset::load(&st, &specs()).unwrap();
    assert_eq!(back.tensor_f32("x"), data.tensor_f32("x"));
    assert_eq!(back.tensor_i32("y"), data.tensor_i32("y"));
    // .npy: one tensor per file, read back by its name.
    let (xp, yp) = (dir.path().join("x.npy"), dir.path().join("y.npy"));
    data.save(&xp, &["x"]).unwrap();
    data.save(&yp, &["y"]).unwrap();
    let list = format!("{},{}", xp.display(), yp.display());
    let back = Dataset::load(Path::new(&list), &specs()).unwrap();
    assert_eq!(back.tensor_f32("x"), data.tensor_f32("x"));
    assert_eq!(back.tensor_i32("y"), data.tensor_i32("y"));
    let a = dmc_runtime::io::read_npy(&yp).unwrap();
    assert_eq!(a.shape, [10]);
    // Two tensors cannot share a .npy file, other extensions are refused, unknown names too;
    // nothing is written then.
    let two = dir.path().join("xy.npy");
    let e = data.save(&two, &["x", "y"]).unwrap_err();
    assert!(matches!(e, IoError::UnsupportedFormat { .. }), "{e:?}");
    let csv = dir.path().join("d.csv");
    let e = data.save(&csv, &["x"]).unwrap_err();
    assert!(matches!(e, IoError::UnsupportedFormat { .. }), "{e:?}");
    let e = data.save(&dir.path().join("z.npy"), &["z"]).unwrap_err();
    assert!(matches!(e, IoError::NoSuchTensor { .. }), "{e:?}");
    assert!(!two.exists() && !csv.exists());
}
