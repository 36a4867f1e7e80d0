//! Data files: `.npz` archives, uint8 inputs with a scale, memory-mapped reading and the memory it
//! reports, the channels-first (NCHW) shape hint, file-order epochs, and the one atomic writer.

use crate::npyfile;

use std::fs;
use std::path::Path;

use dmc_plan::op::DType;
use dmc_runtime::io::{
    epoch_order, parse_scale, write_file_atomic, write_file_atomic_with, Dataset, Epoch, IoError,
    LoadOptions, TensorSpec,
};
use npyfile::{encode_npy, encode_npy_order, encode_npz, entries, f32b, i32b};

fn specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec::input("x", &[2, 3]),
        TensorSpec::target("y", &[], DType::I32),
    ]
}

/// Sample `i`'s six values: distinct across samples and positions.
fn xs(n: usize) -> Vec<f32> {
    (0..n * 6).map(|i| i as f32 * 0.25 - 3.0).collect()
}

fn labels(n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| i % 3).collect()
}

fn scaled(opts: &[(&str, f32)]) -> LoadOptions {
    LoadOptions {
        scales: opts.iter().map(|(n, f)| (n.to_string(), *f)).collect(),
    }
}

fn write(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).expect("write fixture");
}

#[test]
fn npz_archives_stored_and_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let n = 7;
    let y64: Vec<u8> = labels(n)
        .iter()
        .flat_map(|&v| (v as i64).to_le_bytes())
        .collect();
    let members = [
        ("x", encode_npy("<f4", &[n, 2, 3], &f32b(&xs(n)))),
        ("y", encode_npy("<i8", &[n], &y64)),
        ("extra", encode_npy("<f4", &[1], &f32b(&[9.0]))),
    ];
    for compressed in [false, true] {
        let p = dir.path().join(format!("d{compressed}.npz"));
        write(&p, &encode_npz(&members, compressed));
        let d = Dataset::load(&p, &specs()).unwrap();
        assert_eq!(d.len(), n);
        assert_eq!(d.tensor_f32("x").unwrap(), xs(n).as_slice());
        assert_eq!(d.tensor_i32("y").unwrap(), labels(n).as_slice());
        assert_eq!(d.ignored(), &["extra".to_string()]);
        // A stored member is read in place from the archive; a deflated one is decompressed.
        assert_eq!(d.is_mapped("x"), !compressed);
        let mut b = vec![0f32; 12];
        d.fill_f32("x", &[5, 1], &mut b).unwrap();
        assert_eq!(&b[..6], &xs(n)[30..36]);
        assert_eq!(&b[6..], &xs(n)[6..12]);
    }
    // A missing array: named, with what the archive has.
    let p = dir.path().join("missing.npz");
    write(&p, &encode_npz(&members[..1], false));
    let e = Dataset::load(&p, &specs()).unwrap_err();
    assert!(
        matches!(&e, IoError::MissingTensor { name, .. } if name == "y"),
        "{e:?}"
    );
    // Not a zip archive.
    let p = dir.path().join("bad.npz");
    write(&p, b"this is not a zip archive at all");
    let e = Dataset::load(&p, &specs()).unwrap_err();
    assert!(matches!(e, IoError::Npz { .. }), "{e:?}");
    assert!(e.to_string().contains("numpy.savez"), "{e}");
    // A member that is not a valid .npy.
    let p = dir.path().join("badmember.npz");
    let mut broken = members.to_vec();
    broken[0].1.truncate(100);
    write(&p, &encode_npz(&broken, false));
    let e = Dataset::load(&p, &specs()).unwrap_err();
    assert!(
        matches!(&e, IoError::Npz { reason, .. } if reason.contains("x.npy")),
        "{e:?}"
    );
}

#[test]
fn uint8_inputs_need_and_get_an_explicit_scale() {
    let dir = tempfile::tempdir().unwrap();
    let n = 4;
    let pixels: Vec<u8> = (0..n * 6).map(|i| (i * 11 % 256) as u8).collect();
    let x = dir.path().join("x.npy");
    write(&x, &encode_npy("|u1", &[n, 2, 3], &pixels));
    let y = dir.path().join("y.npy");
    write(&y, &encode_npy("<i4", &[n], &i32b(&labels(n))));
    let arg = format!("x={},y={}", x.display(), y.display());
    // Without a scale: a clear error naming the flag.
    let e = Dataset::load(Path::new(&arg), &specs()).unwrap_err();
    assert!(
        matches!(&e, IoError::NeedsScale { name, found, .. } if name == "x" && found == "u8"),
        "{e:?}"
    );
    assert!(e.to_string().contains("--scale x=1/255"), "{e}");
    // With one: each value times the factor, read in place (one byte per value in the file).
    let k = 1.0f32 / 255.0;
    let d = Dataset::load_with(Path::new(&arg), &specs(), &scaled(&[("x", k)])).unwrap();
    assert!(d.is_mapped("x"));
    let want: Vec<f32> = pixels.iter().map(|&p| f32::from(p) * k).collect();
    assert_eq!(d.tensor_f32("x").unwrap(), want.as_slice());
    let mut b = vec![0f32; 6];
    d.fill_f32("x", &[3], &mut b).unwrap();
    assert_eq!(b, want[18..24]);
    // Other integer inputs are converted into memory with the scale.
    let wide = dir.path().join("x16.npy");
    let v16: Vec<u8> = (0..n * 6)
        .flat_map(|i| (i as i16 - 5).to_le_bytes())
        .collect();
    write(&wide, &encode_npy("<i2", &[n, 2, 3], &v16));
    let arg16 = format!("x={},y={}", wide.display(), y.display());
    let d = Dataset::load_with(Path::new(&arg16), &specs(), &scaled(&[("x", 0.5)])).unwrap();
    assert!(!d.is_mapped("x"));
    let want: Vec<f32> = (0..n * 6).map(|i| (i as f32 - 5.0) * 0.5).collect();
    assert_eq!(d.tensor_f32("x").unwrap(), want.as_slice());
    // A scale for something that is not an input.
    for name in ["y", "z"] {
        let e = Dataset::load_with(Path::new(&arg), &specs(), &scaled(&[(name, k)])).unwrap_err();
        assert!(matches!(e, IoError::BadScale { .. }), "{e:?}");
        assert!(e.to_string().contains("not an input"), "{e}");
    }
}

#[test]
fn scale_arguments() {
    assert_eq!(
        parse_scale("image=1/255").unwrap(),
        ("image".into(), 1.0 / 255.0)
    );
    assert_eq!(parse_scale(" x = 0.5 ").unwrap(), ("x".into(), 0.5));
    assert_eq!(parse_scale("x=-2e-1").unwrap(), ("x".into(), -0.2));
    for bad in ["x", "=1", "x=", "x=0", "x=1/0", "x=abc", "x=1/y", "x=1e60"] {
        let e = parse_scale(bad).unwrap_err();
        assert!(matches!(e, IoError::BadScale { .. }), "{bad}: {e:?}");
        assert!(e.to_string().contains("NAME=FACTOR"), "{bad}: {e}");
    }
}

#[test]
fn channels_first_data_is_told_to_transpose() {
    let dir = tempfile::tempdir().unwrap();
    let specs = [
        TensorSpec::input("img", &[4, 4, 3]),
        TensorSpec::target("y", &[], DType::I32),
    ];
    let err_for = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let x = dir.path().join("img.npy");
        write(&x, &encode_npy("<f4", shape, &f32b(&vec![0.0; n])));
        let y = dir.path().join("y.npy");
        write(&y, &encode_npy("<i4", &[2], &i32b(&[0, 1])));
        Dataset::load(dir.path(), &specs).unwrap_err().to_string()
    };
    let nchw = err_for(&[2, 3, 4, 4]);
    assert!(nchw.contains("channels-first"), "{nchw}");
    assert!(nchw.contains("x.transpose(0, 2, 3, 1)"), "{nchw}");
    assert!(!nchw.contains("reshape the data"), "{nchw}");
    // Another order of the same dimensions: the transpose that restores the program's.
    let other = err_for(&[2, 4, 3, 4]);
    assert!(other.contains("x.transpose(0, 1, 3, 2)"), "{other}");
    assert!(other.contains("a reshape would scramble"), "{other}");
    // Different dimensions: a reshape is the right advice.
    let diff = err_for(&[2, 48, 1]);
    assert!(
        diff.contains("reshape the data to [samples,4,4,3]"),
        "{diff}"
    );
}

#[test]
fn file_order_epochs() {
    let (n, batch) = (10, 3);
    let e = Epoch::in_order(n, batch);
    assert_eq!(e.num_batches(), 3);
    let got: Vec<Vec<usize>> = e.batches().map(<[usize]>::to_vec).collect();
    assert_eq!(got, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]);
    assert_eq!(e.dropped(), 1);
    // Through a dataset: the batches hold the file's rows in order, every epoch alike.
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    write(&x, &encode_npy("<f4", &[n, 2, 3], &f32b(&xs(n))));
    let y = dir.path().join("y.npy");
    write(&y, &encode_npy("<i4", &[n], &i32b(&labels(n))));
    let d = Dataset::load(dir.path(), &specs()).unwrap();
    let mut rows = Vec::new();
    let mut b = vec![0f32; batch * 6];
    for _epoch in 0..2 {
        for idx in d.epoch_in_order(batch).unwrap().batches() {
            d.fill_f32("x", idx, &mut b).unwrap();
            rows.extend_from_slice(&b);
        }
    }
    let once = &xs(n)[..9 * 6];
    assert_eq!(&rows[..54], once);
    assert_eq!(&rows[54..], once);
    // The shuffled epoch is the seeded permutation (what `--no-shuffle` turns off).
    let s = d.epoch(batch, 5, 0).unwrap();
    assert_eq!(s.batch(0), &epoch_order(n, 5, 0)[..3]);
    assert!(d.epoch_in_order(11).is_err());
}

#[test]
fn mapped_data_is_held_once_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let n = 64;
    let p = dir.path().join("d.safetensors");
    let x = f32b(&xs(n));
    let y: Vec<u8> = labels(n)
        .iter()
        .flat_map(|&v| (v as i64).to_le_bytes())
        .collect();
    let views = vec![
        (
            "x".to_string(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![n, 2, 3], &x)
                .unwrap(),
        ),
        (
            "y".to_string(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![n], &y).unwrap(),
        ),
    ];
    write(&p, &safetensors::serialize(views, None).unwrap());
    let file_len = fs::metadata(&p).unwrap().len();
    let d = Dataset::load(&p, &specs()).unwrap();
    assert!(d.is_mapped("x") && !d.is_mapped("y"));
    let m = d.memory();
    // The file once, mapped; the labels converted to i32 in memory; no copy of x.
    assert_eq!(m.mapped, file_len);
    assert_eq!(m.in_memory, (n * 4) as u64);
    // A split keeps reading the same mapping: only the sample indices are new.
    let (tr, va) = d.split(0.25, 0).unwrap();
    assert!(tr.shares_files_with(&va) && tr.is_mapped("x"));
    assert_eq!(tr.memory().mapped, file_len);
    let mut all: Vec<f32> = tr.tensor_f32("x").unwrap().to_vec();
    all.extend_from_slice(&va.tensor_f32("x").unwrap());
    let mut want = xs(n);
    all.sort_by(f32::total_cmp);
    want.sort_by(f32::total_cmp);
    assert_eq!(all, want);
    // Replacing the file atomically (a new file renamed over it, as dmc writes files) leaves the
    // loaded data as it was: the mapping keeps the old file.
    write_file_atomic(&p, b"not the data any more").unwrap();
    assert_eq!(d.tensor_f32("x").unwrap(), xs(n).as_slice());
    // Converted inputs (f64) are in memory, and nothing is mapped then.
    let xd: Vec<u8> = xs(n)
        .iter()
        .flat_map(|&v| (v as f64).to_le_bytes())
        .collect();
    let q = dir.path().join("d64");
    fs::create_dir(&q).unwrap();
    write(&q.join("x.npy"), &encode_npy("<f8", &[n, 2, 3], &xd));
    write(
        &q.join("y.npy"),
        &encode_npy("<i4", &[n], &i32b(&labels(n))),
    );
    let d = Dataset::load(&q, &specs()).unwrap();
    assert_eq!(d.memory().mapped, 0);
    assert_eq!(d.memory().in_memory, (n * 6 * 4 + n * 4) as u64);
}

#[test]
fn big_endian_and_fortran_npy_are_converted() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2;
    let v = xs(n);
    let be: Vec<u8> = v.iter().flat_map(|x| x.to_be_bytes()).collect();
    // Fortran order of [n, 2, 3]: the first axis fastest.
    let mut fort = Vec::new();
    for k in 0..3 {
        for j in 0..2 {
            for i in 0..n {
                fort.extend_from_slice(&v[i * 6 + j * 3 + k].to_le_bytes());
            }
        }
    }
    for (descr, fortran, bytes) in [(">f4", false, be), ("<f4", true, fort)] {
        let d = dir.path().join(format!("{}{fortran}", &descr[..1] == ">"));
        fs::create_dir(&d).unwrap();
        write(
            &d.join("x.npy"),
            &encode_npy_order(descr, fortran, &[n, 2, 3], &bytes),
        );
        write(&d.join("y.npy"), &encode_npy("<i4", &[n], &i32b(&[0, 1])));
        let ds = Dataset::load(&d, &specs()).unwrap();
        assert!(!ds.is_mapped("x"), "{descr} {fortran}");
        assert_eq!(
            ds.tensor_f32("x").unwrap(),
            v.as_slice(),
            "{descr} {fortran}"
        );
    }
}

#[test]
fn non_finite_mapped_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = xs(3);
    v[13] = f32::NAN;
    write(
        &dir.path().join("x.npy"),
        &encode_npy("<f4", &[3, 2, 3], &f32b(&v)),
    );
    write(
        &dir.path().join("y.npy"),
        &encode_npy("<i4", &[3], &i32b(&[0, 1, 2])),
    );
    let e = Dataset::load(dir.path(), &specs()).unwrap_err();
    assert!(matches!(e, IoError::NonFinite { index: 13, .. }), "{e:?}");
}

#[test]
fn the_atomic_writer() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("out.json");
    write_file_atomic(&p, b"first").unwrap();
    write_file_atomic(&p, b"second").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"second");
    // The mode of a file created the ordinary way (the umask applies), not a private 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let plain = dir.path().join("plain");
        fs::File::create(&plain).unwrap();
        let mode = |q: &Path| fs::metadata(q).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&p), mode(&plain));
        fs::remove_file(&plain).unwrap();
    }
    // An error while writing: the target is untouched and no temp file is left.
    let e = write_file_atomic_with(&p, |w| {
        std::io::Write::write_all(w, b"partial")?;
        Err(std::io::Error::other("disk on fire"))
    })
    .unwrap_err();
    assert!(matches!(e, IoError::Write { .. }), "{e:?}");
    assert_eq!(fs::read(&p).unwrap(), b"second");
    assert_eq!(entries(dir.path()), vec!["out.json".to_string()]);
    // Not a regular file: refused, nothing replaced.
    let sub = dir.path().join("sub");
    fs::create_dir(&sub).unwrap();
    let e = write_file_atomic(&sub, b"x").unwrap_err();
    assert!(matches!(e, IoError::NotWritable { .. }), "{e:?}");
    assert!(sub.is_dir());
    // Through a symbolic link: the file it names is written, the link stays a link.
    #[cfg(unix)]
    {
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        write_file_atomic(&link, b"third").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&p).unwrap(), b"third");
    }
}

#[test]
fn cache_entries_use_the_same_writer() {
    use dmc_runtime::cuda::nvrtc::{read_entry, write_entry, Compiled};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a").join("b").join("k.entry");
    let c = Compiled {
        image: b"\x7fELF image bytes".to_vec(),
        log: "ptxas info".into(),
        from_cache: false,
    };
    write_entry(&p, &c).unwrap();
    let back = read_entry(&p).expect("entry reads back");
    assert_eq!((back.image, back.log), (c.image.clone(), c.log.clone()));
    assert_eq!(entries(p.parent().unwrap()), vec!["k.entry".to_string()]);
    // A directory where the entry should go: an error, the directory stays.
    let d = dir.path().join("dir.entry");
    fs::create_dir(&d).unwrap();
    assert!(write_entry(&d, &c).is_err());
    assert!(d.is_dir());
    assert_eq!(
        entries(dir.path()),
        vec!["a".to_string(), "dir.entry".to_string()]
    );
}
