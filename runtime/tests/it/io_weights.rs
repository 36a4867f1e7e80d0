//! Weights: atomic save, writability check, strict load; the streaming atomic write plans use.

use crate::npyfile;
use npyfile::entries;

use std::fs;
use std::path::Path;

use dmc_runtime::io::{
    check_writable, load_weights, save_weights, write_file_atomic_with, IoError,
};
use safetensors::{Dtype, SafeTensors};

fn save(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let t: Vec<(String, Vec<usize>, &[f32])> = tensors
        .iter()
        .map(|(n, s, d)| (n.to_string(), s.clone(), d.as_slice()))
        .collect();
    save_weights(path, &t).unwrap();
}

fn seq(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 - 3.0).collect()
}

/// Writes a safetensors file with raw dtypes.
fn write_raw(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.to_string(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    fs::write(path, bytes).unwrap();
}

fn expected(v: &[(&str, Vec<usize>)]) -> Vec<(String, Vec<usize>)> {
    v.iter().map(|(n, s)| (n.to_string(), s.clone())).collect()
}

#[test]
fn round_trip_several_shapes_and_no_temp_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let tensors = vec![
        ("conv1.weight", vec![3, 3, 1, 8], seq(72)),
        ("conv1.bias", vec![8], seq(8)),
        ("scale", vec![], vec![2.5]),
        ("fc.weight", vec![4, 5], seq(20)),
    ];
    save(&path, &tensors);
    assert_eq!(entries(dir.path()), vec!["w.safetensors"]);
    let exp: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|(n, s, _)| (n.to_string(), s.clone()))
        .collect();
    let loaded = load_weights(&path, &exp).unwrap();
    assert_eq!(loaded.len(), 4);
    for ((n, _, d), (ln, ld)) in tensors.iter().zip(&loaded) {
        assert_eq!(n, ln);
        assert_eq!(d, ld);
    }
    // The file is plain safetensors, f32.
    let bytes = fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("fc.weight").unwrap().dtype(), Dtype::F32);
    assert_eq!(st.tensor("fc.weight").unwrap().shape(), &[4, 5]);
}

#[test]
fn overwrite_replaces_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    save(&path, &[("a", vec![2], vec![1.0, 2.0])]);
    save(&path, &[("a", vec![2], vec![3.0, 4.0])]);
    let l = load_weights(&path, &expected(&[("a", vec![2])])).unwrap();
    assert_eq!(l[0].1, vec![3.0, 4.0]);
    assert_eq!(entries(dir.path()), vec!["w.safetensors"]);
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.safetensors");
    let e = load_weights(&path, &expected(&[("a", vec![1])])).unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("nope.safetensors"), "{e}");
}

#[test]
fn truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    save(&path, &[("a", vec![64], seq(64)), ("b", vec![8], seq(8))]);
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_weights(&path, &expected(&[("a", vec![64]), ("b", vec![8])])).unwrap_err();
    assert!(matches!(e, IoError::Safetensors { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("w.safetensors"), "{msg}");
    assert!(msg.contains("--init"), "{msg}");
}

#[test]
fn corrupt_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    fs::write(
        &path,
        b"\x10\x00\x00\x00\x00\x00\x00\x00garbage garbage!garbage",
    )
    .unwrap();
    let e = load_weights(&path, &expected(&[("a", vec![1])])).unwrap_err();
    assert!(matches!(e, IoError::Safetensors { .. }), "{e:?}");
    fs::write(&path, b"xyz").unwrap();
    let e = load_weights(&path, &expected(&[("a", vec![1])])).unwrap_err();
    assert!(matches!(e, IoError::Safetensors { .. }), "{e:?}");
    assert!(e.to_string().contains("re-save the file"), "{e}");
}

#[test]
fn missing_names_with_suggestions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    save(
        &path,
        &[
            ("conv3.weights", vec![2], seq(2)),
            ("fc.bias", vec![2], seq(2)),
        ],
    );
    let e = load_weights(
        &path,
        &expected(&[
            ("conv3.weight", vec![2]),
            ("fc.bias", vec![2]),
            ("other", vec![1]),
        ]),
    )
    .unwrap_err();
    match &e {
        IoError::MissingParams {
            missing,
            suggestions,
            extra,
            ..
        } => {
            assert_eq!(
                missing,
                &vec!["conv3.weight".to_string(), "other".to_string()]
            );
            assert_eq!(
                suggestions,
                &vec![("conv3.weight".to_string(), "conv3.weights".to_string())]
            );
            assert_eq!(extra, &vec!["conv3.weights".to_string()]);
        }
        _ => panic!("{e:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("`conv3.weight`"), "{msg}");
    assert!(msg.contains("did you mean `conv3.weights`"), "{msg}");
    assert!(msg.contains("w.safetensors"), "{msg}");
}

#[test]
fn unexpected_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    save(&path, &[("a", vec![2], seq(2)), ("stray", vec![1], seq(1))]);
    let e = load_weights(&path, &expected(&[("a", vec![2])])).unwrap_err();
    assert!(
        matches!(&e, IoError::UnexpectedParams { extra, .. } if extra == &vec!["stray".to_string()]),
        "{e:?}"
    );
    assert!(e.to_string().contains("`stray`"), "{e}");
}

#[test]
fn shape_mismatch_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    save(&path, &[("conv3.weight", vec![3, 3, 1, 256], seq(2304))]);
    let e = load_weights(&path, &expected(&[("conv3.weight", vec![3, 3, 1, 128])])).unwrap_err();
    assert!(matches!(e, IoError::ShapeMismatch { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("`conv3.weight`: file has [3,3,1,256], program expects [3,3,1,128]"),
        "{e}"
    );
}

#[test]
fn other_float_dtypes_are_converted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let f64s: Vec<u8> = [1.5f64, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let f16s: Vec<u8> = [0x3c00u16, 0xc000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = [0x3f80u16, 0x4040]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    write_raw(
        &path,
        &[
            ("a", Dtype::F64, vec![2], f64s),
            ("b", Dtype::F16, vec![2], f16s),
            ("c", Dtype::BF16, vec![2], bf16s),
        ],
    );
    let l = load_weights(
        &path,
        &expected(&[("a", vec![2]), ("b", vec![2]), ("c", vec![2])]),
    )
    .unwrap();
    assert_eq!(l[0].1, vec![1.5, -2.0]);
    assert_eq!(l[1].1, vec![1.0, -2.0]);
    assert_eq!(l[2].1, vec![1.0, 3.0]);
}

#[test]
fn integer_dtype_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let b: Vec<u8> = [1i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_raw(&path, &[("fc.weight", Dtype::I32, vec![2], b)]);
    let e = load_weights(&path, &expected(&[("fc.weight", vec![2])])).unwrap_err();
    assert!(matches!(e, IoError::DtypeMismatch { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("`fc.weight`") && msg.contains("i32"), "{msg}");
}

#[test]
fn non_finite_values_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    // Written by another tool: dmc itself refuses to save them (below).
    write_raw(
        &path,
        &[
            ("ok", Dtype::F32, vec![2], f32s(&seq(2))),
            ("bad", Dtype::F32, vec![3], f32s(&[1.0, f32::NAN, 2.0])),
        ],
    );
    let e = load_weights(&path, &expected(&[("ok", vec![2]), ("bad", vec![3])])).unwrap_err();
    match &e {
        IoError::NonFinite { name, index, .. } => {
            assert_eq!(name, "bad");
            assert_eq!(*index, 1);
        }
        _ => panic!("{e:?}"),
    }
    assert!(e.to_string().contains("`bad`"), "{e}");
    write_raw(
        &path,
        &[("inf", Dtype::F32, vec![1], f32s(&[f32::INFINITY]))],
    );
    let e = load_weights(&path, &expected(&[("inf", vec![1])])).unwrap_err();
    assert!(matches!(e, IoError::NonFinite { .. }), "{e:?}");
}

#[test]
fn non_finite_weights_are_never_saved_and_the_old_file_stays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    save(&path, &[("w", vec![3], seq(3))]);
    let before = fs::read(&path).unwrap();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let data = [1.0, 2.0, bad];
        let e = save_weights(&path, &[("w".to_string(), vec![3], &data[..])]).unwrap_err();
        match &e {
            IoError::NonFiniteWeights { name, index, .. } => {
                assert_eq!((name.as_str(), *index), ("w", 2));
            }
            _ => panic!("{e:?}"),
        }
        assert!(e.to_string().contains("untouched"), "{e}");
        assert_eq!(fs::read(&path).unwrap(), before);
        assert_eq!(entries(dir.path()), vec!["w.safetensors".to_string()]);
    }
}

#[test]
fn length_mismatch_rejected_on_save() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    let d = [1.0f32, 2.0];
    let e = save_weights(&path, &[("a".to_string(), vec![3], &d[..])]).unwrap_err();
    assert!(matches!(e, IoError::LengthMismatch { .. }), "{e:?}");
    assert!(!path.exists());
}

#[test]
fn check_writable_cases() {
    let dir = tempfile::tempdir().unwrap();
    check_writable(&dir.path().join("w.safetensors")).unwrap();
    assert!(entries(dir.path()).is_empty(), "probe file left behind");

    // Directory does not exist.
    let p = dir.path().join("no/such/dir/w.safetensors");
    let e = check_writable(&p).unwrap_err();
    assert!(matches!(e, IoError::NotWritable { .. }), "{e:?}");
    assert!(e.to_string().contains("does not exist"), "{e}");

    // Parent is a regular file (fails even as root).
    let f = dir.path().join("file");
    fs::write(&f, b"x").unwrap();
    let e = check_writable(&f.join("w.safetensors")).unwrap_err();
    assert!(matches!(e, IoError::NotWritable { .. }), "{e:?}");
    assert!(e.to_string().contains("not a directory"), "{e}");

    // The path is a directory.
    let e = check_writable(dir.path()).unwrap_err();
    assert!(matches!(e, IoError::NotWritable { .. }), "{e:?}");
}

#[cfg(unix)]
#[test]
fn check_writable_read_only_dir() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    fs::create_dir(&ro).unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores permissions: only assert when they bite.
    let bites = fs::write(ro.join("probe"), b"x").is_err();
    let _ = fs::remove_file(ro.join("probe"));
    let r = check_writable(&ro.join("w.safetensors"));
    if bites {
        let e = r.unwrap_err();
        assert!(matches!(e, IoError::NotWritable { .. }), "{e:?}");
        assert!(e.to_string().contains("permissions"), "{e}");
    } else {
        r.unwrap();
    }
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn save_into_missing_dir_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("missing").join("w.safetensors");
    let e = save_weights(&p, &[("a".to_string(), vec![1], &[1.0f32][..])]).unwrap_err();
    assert!(matches!(e, IoError::NotWritable { .. }), "{e:?}");
    assert!(e.to_string().contains("w.safetensors"), "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    // Parent is a file.
    let f = dir.path().join("file");
    fs::write(&f, b"x").unwrap();
    let e = save_weights(
        &f.join("w.safetensors"),
        &[("a".to_string(), vec![1], &[1.0f32][..])],
    )
    .unwrap_err();
    assert!(matches!(e, IoError::NotWritable { .. }), "{e:?}");
    assert_eq!(entries(dir.path()), vec!["file"]);
}

#[test]
fn save_onto_directory_leaves_it_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("w.safetensors");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("keep"), b"old").unwrap();
    let e = save_weights(&target, &[("a".to_string(), vec![1], &[1.0f32][..])]).unwrap_err();
    assert!(
        matches!(e, IoError::NotWritable { .. } | IoError::Write { .. }),
        "{e:?}"
    );
    assert_eq!(fs::read(target.join("keep")).unwrap(), b"old");
    assert_eq!(entries(&target), vec!["keep"]);
    assert_eq!(
        entries(dir.path()),
        vec!["w.safetensors"],
        "temp file left behind"
    );
}

/// A file written as it is produced (plan.json) lands whole, and an error while writing leaves
/// the old file as it was and no temp file behind.
#[test]
fn streamed_atomic_write_is_all_or_nothing() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    write_file_atomic_with(&path, |w| {
        for i in 0..10_000 {
            writeln!(w, "line {i}")?;
        }
        Ok(())
    })
    .unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 10_000);
    assert!(text.ends_with("line 9999\n"));
    let err = write_file_atomic_with(&path, |w| {
        writeln!(w, "partial")?;
        Err(std::io::Error::other("serialiser failed"))
    });
    assert!(err.is_err());
    assert_eq!(fs::read_to_string(&path).unwrap(), text);
    assert_eq!(entries(dir.path()), vec!["plan.json".to_string()]);
}
