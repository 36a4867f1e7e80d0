//! Predictions and `.npy` files: round trips, format choice, atomicity.

use crate::npyfile;
use npyfile::{encode_npy, entries};

use std::fs;

use dmc_runtime::io::npy::parse_npy;
use dmc_runtime::io::{
    read_npy, write_npy_f32, write_npy_i32, write_tensor, write_tensor_i32, ElemType, IoError,
};
use safetensors::{Dtype, SafeTensors};

const SHAPES: &[&[usize]] = &[&[], &[1], &[7], &[2, 3], &[4, 1, 3, 2], &[0, 5]];

#[test]
fn npy_round_trips_f32_and_i32() {
    let dir = tempfile::tempdir().unwrap();
    for (k, shape) in SHAPES.iter().enumerate() {
        let n: usize = shape.iter().product();
        let f: Vec<f32> = (0..n).map(|i| i as f32 * -1.25 + 0.5).collect();
        let i: Vec<i32> = (0..n as i32).map(|v| v * 7 - 3).collect();
        let pf = dir.path().join(format!("f{k}.npy"));
        let pi = dir.path().join(format!("i{k}.npy"));
        write_npy_f32(&pf, shape, &f).unwrap();
        write_npy_i32(&pi, shape, &i).unwrap();
        let a = read_npy(&pf).unwrap();
        assert_eq!((a.shape.as_slice(), a.dtype), (*shape, ElemType::F32));
        assert_eq!(a.to_f32().unwrap(), f);
        let b = read_npy(&pi).unwrap();
        assert_eq!((b.shape.as_slice(), b.dtype), (*shape, ElemType::I32));
        assert_eq!(b.to_i32().unwrap(), i);
        // numpy's own layout: header aligned to 64 bytes, v1.0, ends with '\n'.
        let bytes = fs::read(&pf).unwrap();
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        assert_eq!(bytes[10 + hlen - 1], b'\n');
    }
    // Only the written files, no temp files.
    assert_eq!(entries(dir.path()).len(), 2 * SHAPES.len());
    assert!(entries(dir.path()).iter().all(|n| !n.starts_with('.')));
}

#[test]
fn npy_accepts_numpy_variants() {
    // Written by numpy 1.x/2.x: double quotes are not used, but v2.0 headers and
    // trailing spaces are; also Python-2 'L' suffixes.
    for header in [
        "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }",
        "{'fortran_order': False, 'shape': (2L, 2L), 'descr': '<f8'}",
        "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2, 2)}",
    ] {
        for v2 in [false, true] {
            let mut b = b"\x93NUMPY".to_vec();
            let h = format!("{header}    \n");
            if v2 {
                b.extend_from_slice(&[2, 0]);
                b.extend_from_slice(&(h.len() as u32).to_le_bytes());
            } else {
                b.extend_from_slice(&[1, 0]);
                b.extend_from_slice(&(h.len() as u16).to_le_bytes());
            }
            b.extend_from_slice(h.as_bytes());
            for v in [1.0f64, 2.0, 3.0, 4.0] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            let a = parse_npy(&b).unwrap();
            assert_eq!(a.shape, vec![2, 2]);
            assert_eq!(a.to_f32().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        }
    }
}

#[test]
fn npy_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    let full = encode_npy("<f4", &[10], &[0u8; 40]);
    // Truncated data.
    fs::write(&p, &full[..full.len() - 1]).unwrap();
    let e = read_npy(&p).unwrap_err();
    assert!(matches!(e, IoError::Npy { .. }), "{e:?}");
    assert!(
        e.to_string().contains("truncated") && e.to_string().contains("a.npy"),
        "{e}"
    );
    // Truncated header.
    fs::write(&p, &full[..30]).unwrap();
    let e = read_npy(&p).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    // Trailing garbage.
    let mut long = full.clone();
    long.extend_from_slice(b"xx");
    fs::write(&p, &long).unwrap();
    assert!(matches!(read_npy(&p), Err(IoError::Npy { .. })));
    // Unsupported dtype.
    fs::write(&p, encode_npy("<c8", &[1], &[0u8; 8])).unwrap();
    let e = read_npy(&p).unwrap_err();
    assert!(e.to_string().contains("unsupported dtype"), "{e}");
    // Missing file.
    let e = read_npy(&dir.path().join("none.npy")).unwrap_err();
    assert!(matches!(e, IoError::NotFound { .. }), "{e:?}");
    // Wrong length on write.
    let e = write_npy_f32(&p, &[3], &[1.0]).unwrap_err();
    assert!(matches!(e, IoError::LengthMismatch { .. }), "{e:?}");
}

#[test]
fn write_tensor_chooses_format_by_extension() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();

    let p = dir.path().join("pred.safetensors");
    write_tensor(&p, "logits", &[4, 3], &data).unwrap();
    let bytes = fs::read(&p).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!((t.dtype(), t.shape()), (Dtype::F32, &[4usize, 3][..]));
    let back: Vec<f32> = t
        .data()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(back, data);

    let p = dir.path().join("pred.npy");
    write_tensor(&p, "logits", &[4, 3], &data).unwrap();
    assert_eq!(read_npy(&p).unwrap().to_f32().unwrap(), data);

    let p = dir.path().join("classes.NPY");
    write_tensor_i32(&p, "classes", &[3], &[2, 0, 1]).unwrap();
    assert_eq!(read_npy(&p).unwrap().to_i32().unwrap(), vec![2, 0, 1]);
    let p = dir.path().join("classes.safetensors");
    write_tensor_i32(&p, "classes", &[3], &[2, 0, 1]).unwrap();
    let bytes = fs::read(&p).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("classes").unwrap().dtype(), Dtype::I32);

    let e = write_tensor(&dir.path().join("pred.csv"), "y", &[1], &[1.0]).unwrap_err();
    assert!(matches!(e, IoError::UnsupportedFormat { .. }), "{e:?}");
    assert!(e.to_string().contains("pred.csv"), "{e}");
    let e = write_tensor(&dir.path().join("p.npy"), "y", &[2], &[1.0]).unwrap_err();
    assert!(matches!(e, IoError::LengthMismatch { .. }), "{e:?}");

    assert!(entries(dir.path()).iter().all(|n| !n.starts_with('.')));
}

#[test]
fn write_tensor_onto_directory_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out.npy");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("keep"), b"old").unwrap();
    assert!(write_tensor(&target, "y", &[1], &[1.0]).is_err());
    assert_eq!(fs::read(target.join("keep")).unwrap(), b"old");
    assert_eq!(entries(dir.path()), vec!["out.npy"]);
}

#[test]
fn npy_shapes_that_overflow_are_errors_not_panics() {
    for shape in [
        "(18446744073709551615, 2)",
        "(4294967296, 4294967296)",
        "(0, 4294967296, 4294967296)",
        "(4294967296L, 4294967296L)",
        "(99999999999999999999999, 1)",
    ] {
        let h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        let e = parse_npy(&b).unwrap_err();
        assert!(
            e.contains("overflow") || e.contains("larger than"),
            "{shape}: {e}"
        );
    }
}
