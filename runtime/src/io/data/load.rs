//! Reading a dataset from files: a `.safetensors` file, a directory of `<name>.npy` files, or a
//! list of `.npy` files; every tensor checked against its [`TensorSpec`] (names, shapes, sample
//! counts, dtypes, values) and converted to f32 inputs / i32 labels.

use std::path::{Path, PathBuf};

use dmc_plan::op::DType;
use safetensors::SafeTensors;

use super::{Column, Dataset, TensorSpec};
use crate::io::{closest, decode_f32, decode_wide, npy, read_file, ElemType, IoError, Wide};

const DATA_HINT: &str = "re-export the dataset";

/// A tensor found in the data, before conversion.
struct Found<'a> {
    file: PathBuf,
    shape: Vec<usize>,
    elem: ElemType,
    bytes: std::borrow::Cow<'a, [u8]>,
}

impl Dataset {
    /// Loads data for `specs` from:
    /// - a `.safetensors` file whose tensors are named after the inputs/targets, samples first;
    /// - a directory holding `<name>.npy` for each spec;
    /// - one `.npy` file or a comma-separated list of them, `x=a.npy,y=b.npy` (explicit names) or
    ///   `x.npy,y.npy` (named by file stem).
    ///
    /// Extra tensors are ignored (see [`Dataset::ignored`]). Inputs accept f32/f64/f16/bf16
    /// (converted to f32, must be finite); labels accept any integer type or integral floats
    /// (converted to i32, must be `>= 0`). A per-sample shape may differ from the program's only
    /// by size-1 dimensions (e.g. labels `[N, 1]` for `[]`).
    pub fn load(path: &Path, specs: &[TensorSpec]) -> Result<Dataset, IoError> {
        for s in specs {
            if s.dtype != DType::F32 && s.dtype != DType::I32 {
                return Err(IoError::UnsupportedSpecDtype {
                    name: s.name.clone(),
                    dtype: format!("{:?}", s.dtype),
                });
            }
        }
        let text = path.to_string_lossy().into_owned();
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        if path.is_dir() {
            return Self::load_npy_dir(path, specs);
        }
        if path.is_file() {
            return match ext.as_deref() {
                Some("safetensors") => Self::load_safetensors(path, specs),
                Some("npy") => Self::load_npy_list(&text, specs),
                _ => Err(IoError::UnsupportedFormat {
                    path: path.to_path_buf(),
                    expected: "pass a .safetensors file, a directory of <name>.npy files, or a list like x=a.npy,y=b.npy",
                }),
            };
        }
        if let Ok(m) = std::fs::metadata(path) {
            // It exists but is neither a file nor a directory: a FIFO, a device, a socket.
            return Err(IoError::NotRegularFile {
                path: path.to_path_buf(),
                kind: crate::io::files::kind_of(&m),
                what: "data file",
            });
        }
        if text.contains(',') || text.contains('=') || ext.as_deref() == Some("npy") {
            return Self::load_npy_list(&text, specs);
        }
        Err(IoError::NotFound {
            path: path.to_path_buf(),
            what: "data file",
        })
    }

    fn load_safetensors(path: &Path, specs: &[TensorSpec]) -> Result<Dataset, IoError> {
        let bytes = read_file(path, "data file")?;
        let st_err = |e| IoError::Safetensors {
            path: path.to_path_buf(),
            source: e,
            hint: DATA_HINT,
        };
        let st = SafeTensors::deserialize(&bytes).map_err(st_err)?;
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        let mut found = Vec::new();
        for s in specs {
            if !names.contains(&s.name) {
                return Err(missing(path.display().to_string(), s, specs, &names));
            }
            let v = st.tensor(&s.name).map_err(st_err)?;
            let elem =
                ElemType::from_safetensors(v.dtype()).ok_or_else(|| IoError::DtypeMismatch {
                    path: path.to_path_buf(),
                    name: s.name.clone(),
                    found: format!("{:?}", v.dtype()),
                    expected: expected_dtype(s).into(),
                    hint: dtype_hint(s).into(),
                })?;
            found.push(Found {
                file: path.to_path_buf(),
                shape: v.shape().to_vec(),
                elem,
                bytes: std::borrow::Cow::Borrowed(v.data()),
            });
        }
        let ignored = names
            .into_iter()
            .filter(|n| !specs.iter().any(|s| &s.name == n))
            .collect();
        Self::assemble(path.display().to_string(), path, specs, found, ignored)
    }

    fn load_npy_dir(dir: &Path, specs: &[TensorSpec]) -> Result<Dataset, IoError> {
        let mut present: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| IoError::Read {
                path: dir.to_path_buf(),
                source: e,
            })?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("npy"))
            .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .collect();
        present.sort();
        let mut found = Vec::new();
        for s in specs {
            if !present.contains(&s.name) {
                return Err(missing(
                    format!("directory {}", dir.display()),
                    s,
                    specs,
                    &present,
                ));
            }
            found.push(read_npy_found(&dir.join(format!("{}.npy", s.name)))?);
        }
        let ignored = present
            .into_iter()
            .filter(|n| !specs.iter().any(|s| &s.name == n))
            .collect();
        Self::assemble(dir.display().to_string(), dir, specs, found, ignored)
    }

    fn load_npy_list(arg: &str, specs: &[TensorSpec]) -> Result<Dataset, IoError> {
        let mut given: Vec<(String, PathBuf)> = Vec::new();
        for entry in arg.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, file) = match entry.split_once('=') {
                Some((n, f)) => (n.trim().to_string(), PathBuf::from(f.trim())),
                None => {
                    let p = PathBuf::from(entry);
                    let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned());
                    match stem {
                        Some(s) if !s.is_empty() => (s, p),
                        _ => {
                            return Err(IoError::BadDataArg {
                                arg: arg.to_string(),
                                reason: format!("`{entry}` has no file name"),
                            })
                        }
                    }
                }
            };
            if name.is_empty() || file.as_os_str().is_empty() {
                return Err(IoError::BadDataArg {
                    arg: arg.to_string(),
                    reason: format!("`{entry}` needs both a name and a file (name=file.npy)"),
                });
            }
            if let Some((_, first)) = given.iter().find(|(n, _)| *n == name) {
                return Err(IoError::DuplicateTensor {
                    name,
                    first: first.clone(),
                    second: file,
                });
            }
            given.push((name, file));
        }
        if given.is_empty() {
            return Err(IoError::BadDataArg {
                arg: arg.to_string(),
                reason: "no files given".into(),
            });
        }
        // A file that does not exist is "not found", whatever its name: checked before the names,
        // so that a mistyped path is not reported as a missing tensor.
        for (_, file) in &given {
            if let Err(e) = std::fs::metadata(file) {
                if e.kind() == std::io::ErrorKind::NotFound {
                    return Err(IoError::NotFound {
                        path: file.clone(),
                        what: "data file",
                    });
                }
            }
        }
        let names: Vec<String> = given.iter().map(|(n, _)| n.clone()).collect();
        let mut found = Vec::new();
        for s in specs {
            let Some((_, file)) = given.iter().find(|(n, _)| *n == s.name) else {
                return Err(missing(format!("`{arg}`"), s, specs, &names));
            };
            found.push(read_npy_found(file)?);
        }
        let ignored = names
            .into_iter()
            .filter(|n| !specs.iter().any(|s| &s.name == n))
            .collect();
        Self::assemble(arg.to_string(), Path::new(arg), specs, found, ignored)
    }

    /// Checks shapes, sample counts, dtypes and values, and converts.
    fn assemble(
        source: String,
        where_: &Path,
        specs: &[TensorSpec],
        found: Vec<Found<'_>>,
        ignored: Vec<String>,
    ) -> Result<Dataset, IoError> {
        for (s, f) in specs.iter().zip(&found) {
            if f.shape.is_empty() || !squeeze_eq(&f.shape[1..], &s.per_sample_shape) {
                return Err(IoError::SampleShapeMismatch {
                    path: f.file.clone(),
                    name: s.name.clone(),
                    found: f.shape.clone(),
                    expected: s.per_sample_shape.clone(),
                });
            }
        }
        let counts: Vec<(String, usize)> = specs
            .iter()
            .zip(&found)
            .map(|(s, f)| (s.name.clone(), f.shape[0]))
            .collect();
        if counts.windows(2).any(|w| w[0].1 != w[1].1) {
            return Err(IoError::SampleCountMismatch {
                path: where_.to_path_buf(),
                counts,
            });
        }
        let samples = counts.first().map(|c| c.1).unwrap_or(0);
        if samples == 0 {
            return Err(IoError::NoSamples {
                path: where_.to_path_buf(),
            });
        }
        let mut columns = Vec::with_capacity(specs.len());
        for (s, f) in specs.iter().zip(found) {
            columns.push(convert(s, &f)?);
        }
        Ok(Dataset {
            source,
            samples,
            specs: specs.to_vec(),
            columns,
            ignored,
        })
    }
}

/// Equal up to size-1 dimensions.
fn squeeze_eq(a: &[usize], b: &[usize]) -> bool {
    a.iter()
        .filter(|&&d| d != 1)
        .eq(b.iter().filter(|&&d| d != 1))
}

fn missing(source_desc: String, s: &TensorSpec, specs: &[TensorSpec], found: &[String]) -> IoError {
    let suggestion = closest(
        &s.name,
        found
            .iter()
            .filter(|f| !specs.iter().any(|s| &s.name == *f))
            .map(String::as_str),
    )
    .map(|c| vec![(s.name.clone(), c)])
    .unwrap_or_default();
    IoError::MissingTensor {
        source_desc,
        name: s.name.clone(),
        expected: specs.iter().map(|s| s.name.clone()).collect(),
        found: found.to_vec(),
        suggestion,
    }
}

fn read_npy_found(file: &Path) -> Result<Found<'static>, IoError> {
    let a = npy::read_npy(file)?;
    Ok(Found {
        file: file.to_path_buf(),
        shape: a.shape,
        elem: a.dtype,
        bytes: std::borrow::Cow::Owned(a.data),
    })
}

fn expected_dtype(s: &TensorSpec) -> &'static str {
    match s.dtype {
        DType::I32 => {
            "integer class labels (i32; other integer types and integral floats are converted)"
        }
        _ => "f32 (f64, f16 and bf16 are converted)",
    }
}

fn dtype_hint(s: &TensorSpec) -> &'static str {
    match s.dtype {
        DType::I32 => "store the labels as integers, e.g. y.astype(np.int32)",
        _ => "store floats, e.g. x.astype(np.float32) (scale integer pixels, e.g. / 255)",
    }
}

fn convert(s: &TensorSpec, f: &Found<'_>) -> Result<Column, IoError> {
    let mismatch = || IoError::DtypeMismatch {
        path: f.file.clone(),
        name: s.name.clone(),
        found: f.elem.name().to_string(),
        expected: expected_dtype(s).into(),
        hint: dtype_hint(s).into(),
    };
    match s.dtype {
        DType::I32 => {
            if f.elem == ElemType::Bool {
                return Err(mismatch());
            }
            let len = s.sample_len().max(1);
            let mut out = Vec::with_capacity(f.bytes.len() / f.elem.size());
            for (i, w) in decode_wide(f.elem, &f.bytes).into_iter().enumerate() {
                let v = match w {
                    Wide::Int(v) => v,
                    Wide::Float(x) => {
                        if !x.is_finite() || x.fract() != 0.0 {
                            return Err(IoError::NonIntegralLabel {
                                path: f.file.clone(),
                                name: s.name.clone(),
                                index: i / len,
                                value: x,
                            });
                        }
                        if x.abs() > 1e30 {
                            i128::MAX
                        } else {
                            x as i128
                        }
                    }
                };
                if v < 0 || v > i32::MAX as i128 {
                    return Err(IoError::LabelOutOfRange {
                        path: f.file.clone(),
                        name: s.name.clone(),
                        index: i / len,
                        value: match w {
                            Wide::Int(v) => v.to_string(),
                            Wide::Float(x) => x.to_string(),
                        },
                        reason: if v < 0 {
                            "is negative".into()
                        } else {
                            "does not fit in i32".into()
                        },
                    });
                }
                out.push(v as i32);
            }
            Ok(Column::I32(out))
        }
        _ => {
            let v = decode_f32(f.elem, &f.bytes).ok_or_else(mismatch)?;
            if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(IoError::NonFinite {
                    path: f.file.clone(),
                    name: s.name.clone(),
                    index: i,
                    value: *x,
                    hint: "clean the data (replace or drop NaN/Inf; f64 values beyond the f32 range become Inf)",
                });
            }
            Ok(Column::F32(v))
        }
    }
}
