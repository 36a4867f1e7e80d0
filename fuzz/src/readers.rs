//! Mutated data and weights files through the readers.
//!
//! A case is a valid file (a `.safetensors` of inputs and labels, an `.npy` of f32 or i32, an
//! `.npz` archive of one, stored or deflated, a weights file) with 1-4 byte-level mutations: bytes flipped or set to interesting values
//! (0x00, 0xFF, 0x7F, the bytes of 2^32 or 2^64-1 in header fields), the file truncated or extended,
//! header text edited (shapes, dtypes, offsets, `fortran_order`). Loading must return data or an
//! `IoError`, never panic or abort, whatever the bytes say about sizes.

use std::path::Path;

use dmc_plan::op::DType;
use dmc_runtime::io::{self, Dataset, TensorSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{guarded, CaseFile, Failure, Report};

/// The kinds of file a case starts from.
#[derive(Debug, Clone, Copy)]
enum Kind {
    DataSafetensors,
    NpyF32,
    NpyI32,
    /// `numpy.savez`: the `.npy` member stored as it is.
    Npz,
    /// `numpy.savez_compressed`: the member deflated.
    NpzDeflated,
    Weights,
}

fn valid_file(kind: Kind, dir: &Path) -> Result<(std::path::PathBuf, Vec<u8>), String> {
    let e = |e: io::IoError| e.to_string();
    let p = match kind {
        Kind::DataSafetensors => {
            // inputs `x` [4, 3] and labels `y` [4], as a data file: written by the predictions
            // writer (f32) and re-read as bytes
            let p = dir.join("seed-data.safetensors");
            io::write_tensor(&p, "x", &[4, 3], &[0.5; 12]).map_err(e)?;
            p
        }
        Kind::NpyF32 => {
            let p = dir.join("seed-x.npy");
            io::write_npy_f32(&p, &[4, 3], &[0.25; 12]).map_err(e)?;
            p
        }
        Kind::NpyI32 => {
            let p = dir.join("seed-y.npy");
            io::write_npy_i32(&p, &[4], &[0, 1, 2, 1]).map_err(e)?;
            p
        }
        Kind::Npz | Kind::NpzDeflated => {
            let x = dir.join("seed-npz-x.npy");
            io::write_npy_f32(&x, &[4, 3], &[0.75; 12]).map_err(e)?;
            let member = std::fs::read(&x).map_err(|e| e.to_string())?;
            let method = if matches!(kind, Kind::Npz) {
                zip::CompressionMethod::Stored
            } else {
                zip::CompressionMethod::Deflated
            };
            let z = (|| -> zip::result::ZipResult<Vec<u8>> {
                let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
                let opts = zip::write::SimpleFileOptions::default().compression_method(method);
                z.start_file("x.npy", opts)?;
                std::io::Write::write_all(&mut z, &member)?;
                Ok(z.finish()?.into_inner())
            })()
            .map_err(|e| e.to_string())?;
            let p = dir.join("seed-d.npz");
            std::fs::write(&p, z).map_err(|e| e.to_string())?;
            p
        }
        Kind::Weights => {
            let p = dir.join("seed-w.safetensors");
            let w = [0.1f32; 6];
            let b = [0.0f32; 2];
            io::save_weights(
                &p,
                &[
                    ("fc.weight".into(), vec![3, 2], &w[..]),
                    ("fc.bias".into(), vec![2], &b[..]),
                ],
            )
            .map_err(e)?;
            p
        }
    };
    let bytes = std::fs::read(&p).map_err(|e| e.to_string())?;
    Ok((p, bytes))
}

const INTERESTING: &[&[u8]] = &[
    b"\x00",
    b"\xFF",
    b"\x7F",
    b"\x80",
    b"\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF",
    b"\x00\x00\x00\x00\x01\x00\x00\x00",
    b"18446744073709551615",
    b"4294967296",
    b"-1",
    b"0",
    b"1e39",
    b"NaN",
    b"\"F64\"",
    b"\"I64\"",
    b"\"U8\"",
    b"'<f8'",
    b"'<i8'",
    b"'|u1'",
    b"True",
    b"[]",
    b"[0]",
    b"[99999999999, 99999999999]",
    b"(4294967296,)",
    b"{",
    b"}",
    b",",
];

fn mutate(r: &mut ChaCha8Rng, mut b: Vec<u8>) -> Vec<u8> {
    for _ in 0..r.random_range(1..=4) {
        let n = b.len().max(1);
        let i = r.random_range(0..n).min(b.len());
        match r.random_range(0..6) {
            0 if !b.is_empty() => {
                let i = i.min(b.len() - 1);
                b[i] ^= 1 << r.random_range(0..8);
            }
            1 => {
                let v = INTERESTING[r.random_range(0..INTERESTING.len())];
                let end = (i + v.len()).min(b.len());
                b.splice(i..end, v.iter().copied());
            }
            2 => {
                let v = INTERESTING[r.random_range(0..INTERESTING.len())];
                b.splice(i..i, v.iter().copied());
            }
            3 => b.truncate(i),
            4 => {
                let extra = r.random_range(1..64);
                b.extend((0..extra).map(|_| r.random::<u8>()));
            }
            _ => {
                // the first bytes: a safetensors header length, an npy magic/version/length
                let j = r.random_range(0..12.min(n));
                if j < b.len() {
                    b[j] = r.random();
                }
            }
        }
    }
    b
}

/// Runs `cases` mutated files through the loaders (case `i` uses the stream `(seed, i)`).
pub fn run(cases: u64, seed: u64, case_file: &mut CaseFile) -> Report {
    let mut rep = Report::default();
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            rep.failures.push(Failure {
                target: "readers",
                case: String::new(),
                what: format!("cannot make a temp dir: {e}"),
            });
            return rep;
        }
    };
    let kinds = [
        Kind::DataSafetensors,
        Kind::NpyF32,
        Kind::NpyI32,
        Kind::Npz,
        Kind::NpzDeflated,
        Kind::Weights,
    ];
    let mut seeds = Vec::new();
    for k in kinds {
        match valid_file(k, dir.path()) {
            Ok((_, bytes)) => seeds.push((k, bytes)),
            Err(e) => rep.failures.push(Failure {
                target: "readers",
                case: format!("{k:?}"),
                what: format!("cannot write the seed file: {e}"),
            }),
        }
    }
    if seeds.is_empty() {
        return rep;
    }
    let x_spec = [TensorSpec::input("x", &[3])];
    let xy_specs = [
        TensorSpec::input("x", &[3]),
        TensorSpec::target("y", &[], DType::I32),
    ];
    let weights = [
        ("fc.weight".to_string(), vec![3, 2]),
        ("fc.bias".to_string(), vec![2]),
    ];
    for i in 0..cases {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(i);
        let (kind, good) = &seeds[r.random_range(0..seeds.len())];
        let bytes = mutate(&mut r, good.clone());
        case_file.record(&bytes);
        rep.cases += 1;
        let name = match kind {
            Kind::DataSafetensors => "d.safetensors",
            Kind::NpyF32 => "x.npy",
            Kind::NpyI32 => "y.npy",
            Kind::Npz | Kind::NpzDeflated => "d.npz",
            Kind::Weights => "w.safetensors",
        };
        let path = dir.path().join(name);
        if let Err(e) = std::fs::write(&path, &bytes) {
            rep.failures.push(Failure {
                target: "readers",
                case: String::new(),
                what: format!("cannot write the case file: {e}"),
            });
            return rep;
        }
        let outcome = guarded(|| -> bool {
            match kind {
                Kind::Weights => io::load_weights(&path, &weights).is_ok(),
                Kind::NpyI32 => {
                    let _ = io::read_npy(&path);
                    let list = format!(
                        "x={},y={}",
                        dir.path().join("seed-x.npy").display(),
                        path.display()
                    );
                    Dataset::load(Path::new(&list), &xy_specs).is_ok()
                }
                _ => {
                    let _ = io::read_npy(&path);
                    Dataset::load(&path, &x_spec).is_ok()
                }
            }
        });
        match outcome {
            Ok(true) => rep.accepted += 1,
            Ok(false) => {}
            Err(panic) => rep.failures.push(Failure {
                target: "readers",
                case: format!("{kind:?}: {}", hex(&bytes)),
                what: format!("panicked: {panic}"),
            }),
        }
    }
    rep
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
