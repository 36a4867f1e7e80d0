//! Reading a dataset from files: a `.safetensors` file, a `.npz` archive, a directory of
//! `<name>.npy` files, or a list of `.npy` files; every tensor checked against its [`TensorSpec`]
//! (names, shapes, sample counts, dtypes, values) and converted to f32 inputs / i32 labels.
//!
//! Files are memory-mapped ([`MappedFile`]): an input stored as little-endian f32 (or uint8 with
//! a `--scale`) in C order is read in place batch by batch, so the file is held once; anything
//! else (f64/f16 inputs, labels, big-endian or Fortran-order arrays, compressed `.npz` members)
//! is converted into memory at load, and the mapping is released when no column uses it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dmc_plan::op::DType;
use safetensors::SafeTensors;

use super::mapped::{Mapped, MappedFile, Stored};
use super::{Column, Dataset, TensorRole, TensorSpec};
use crate::io::{closest, decode_f32, decode_wide, npy, ElemType, IoError, Wide};

const DATA_HINT: &str = "re-export the dataset";

/// How to read a data set beyond its specs: the `--scale` of integer inputs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadOptions {
    /// `(input name, factor)`: the input's values are multiplied by the factor as they are read
    /// (needed for integer inputs, e.g. uint8 pixels with `1/255`).
    pub scales: Vec<(String, f32)>,
}

/// Parses a `--scale` argument, `NAME=FACTOR`, where the factor is a number (`0.5`, `3.9e-3`) or
/// a fraction (`1/255`); it must be finite and not zero.
pub fn parse_scale(arg: &str) -> Result<(String, f32), IoError> {
    let bad = |reason: String| IoError::BadScale {
        arg: arg.to_string(),
        reason,
    };
    let (name, factor) = arg
        .split_once('=')
        .ok_or_else(|| bad("it has no `=`".into()))?;
    let (name, factor) = (name.trim(), factor.trim());
    if name.is_empty() {
        return Err(bad("the input name before `=` is empty".into()));
    }
    let num = |t: &str| {
        t.trim()
            .parse::<f64>()
            .map_err(|_| bad(format!("`{}` is not a number", t.trim())))
    };
    let value = match factor.split_once('/') {
        Some((a, b)) => {
            let d = num(b)?;
            if d == 0.0 {
                return Err(bad("the fraction divides by zero".into()));
            }
            num(a)? / d
        }
        None => num(factor)?,
    };
    let v = value as f32;
    if !v.is_finite() || v == 0.0 {
        return Err(bad(format!(
            "the factor {value} is {} as an f32",
            if v == 0.0 { "zero" } else { "not finite" }
        )));
    }
    Ok((name.to_string(), v))
}

/// Where a found tensor's bytes are.
enum Bytes {
    /// In a mapped file, from `offset`, `len` bytes, little-endian C order.
    InPlace {
        file: Arc<MappedFile>,
        offset: usize,
        len: usize,
    },
    /// Converted or decompressed into memory.
    Owned(Vec<u8>),
}

/// A tensor found in the data, before conversion.
struct Found {
    file: PathBuf,
    shape: Vec<usize>,
    elem: ElemType,
    bytes: Bytes,
}

impl Found {
    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::InPlace { file, offset, len } => &file.bytes()[*offset..*offset + *len],
            Bytes::Owned(v) => v,
        }
    }
}

impl Dataset {
    /// [`Dataset::load_with`] without options (no `--scale`).
    pub fn load(path: &Path, specs: &[TensorSpec]) -> Result<Dataset, IoError> {
        Self::load_with(path, specs, &LoadOptions::default())
    }

    /// Loads data for `specs` from:
    /// - a `.safetensors` file whose tensors are named after the inputs/targets, samples first;
    /// - a `.npz` archive (`numpy.savez`/`savez_compressed`) whose arrays are named so;
    /// - a directory holding `<name>.npy` for each spec;
    /// - one `.npy` file or a comma-separated list of them, `x=a.npy,y=b.npy` (explicit names) or
    ///   `x.npy,y.npy` (named by file stem).
    ///
    /// Extra tensors are ignored (see [`Dataset::ignored`]). Inputs accept f32/f64/f16/bf16
    /// (converted to f32, must be finite), and integer types (uint8 pixels) with a scale in
    /// `opts` (each value times the factor); labels accept any integer type or integral floats
    /// (converted to i32, must be `>= 0`). A per-sample shape may differ from the program's only
    /// by size-1 dimensions (e.g. labels `[N, 1]` for `[]`).
    pub fn load_with(
        path: &Path,
        specs: &[TensorSpec],
        opts: &LoadOptions,
    ) -> Result<Dataset, IoError> {
        for (name, _) in &opts.scales {
            if !specs
                .iter()
                .any(|s| &s.name == name && s.role == TensorRole::Input)
            {
                let inputs: Vec<String> = specs
                    .iter()
                    .filter(|s| s.role == TensorRole::Input)
                    .map(|s| s.name.clone())
                    .collect();
                return Err(IoError::BadScale {
                    arg: name.clone(),
                    reason: format!(
                        "`{name}` is not an input of the program (its inputs: {})",
                        crate::io::NameList(&inputs)
                    ),
                });
            }
        }
        let scale_of = |s: &TensorSpec| {
            opts.scales
                .iter()
                .rev()
                .find(|(n, _)| *n == s.name)
                .map(|&(_, f)| f)
        };
        let scales: Vec<Option<f32>> = specs.iter().map(scale_of).collect();
        let specs_scales = (specs, scales.as_slice());
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
            return Self::load_npy_dir(path, specs_scales);
        }
        if path.is_file() {
            return match ext.as_deref() {
                Some("safetensors") => Self::load_safetensors(path, specs_scales),
                Some("npz") => Self::load_npz(path, specs_scales),
                Some("npy") => Self::load_npy_list(&text, specs_scales),
                Some("txt") => Self::from_text(path, specs),
                _ => Err(IoError::UnsupportedFormat {
                    path: path.to_path_buf(),
                    expected: "pass a .safetensors file, a .npz archive, a directory of <name>.npy files, a list like x=a.npy,y=b.npy, or a .txt corpus (next-token windows of its bytes, for a program with an input int[T])",
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
            return Self::load_npy_list(&text, specs_scales);
        }
        Err(IoError::NotFound {
            path: path.to_path_buf(),
            what: "data file",
        })
    }

    fn load_safetensors(path: &Path, ss: SpecsScales<'_>) -> Result<Dataset, IoError> {
        let specs = ss.0;
        let map = MappedFile::open(path, "data file")?;
        let bytes = map.bytes();
        let st_err = |e| IoError::Safetensors {
            path: path.to_path_buf(),
            source: e,
            hint: DATA_HINT,
        };
        let st = SafeTensors::deserialize(bytes).map_err(st_err)?;
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
            // The view borrows the map: its offset in the file.
            let offset = v.data().as_ptr() as usize - bytes.as_ptr() as usize;
            found.push(Found {
                file: path.to_path_buf(),
                shape: v.shape().to_vec(),
                elem,
                bytes: Bytes::InPlace {
                    file: map.clone(),
                    offset,
                    len: v.data().len(),
                },
            });
        }
        let ignored = names
            .into_iter()
            .filter(|n| !specs.iter().any(|s| &s.name == n))
            .collect();
        Self::assemble(path.display().to_string(), path, ss, found, ignored)
    }

    fn load_npz(path: &Path, ss: SpecsScales<'_>) -> Result<Dataset, IoError> {
        let specs = ss.0;
        let map = MappedFile::open(path, "data file")?;
        let npz_err = |reason: String| IoError::Npz {
            path: path.to_path_buf(),
            reason,
        };
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(map.bytes()))
            .map_err(|e| npz_err(format!("not a zip archive ({e})")))?;
        let mut names: Vec<String> = zip
            .file_names()
            .filter_map(|n| n.strip_suffix(".npy"))
            .map(str::to_string)
            .collect();
        names.sort();
        let mut found = Vec::new();
        for s in specs {
            if !names.contains(&s.name) {
                return Err(missing(path.display().to_string(), s, specs, &names));
            }
            let member = format!("{}.npy", s.name);
            let mut f = zip
                .by_name(&member)
                .map_err(|e| npz_err(format!("cannot read `{member}`: {e}")))?;
            let member_err = |reason: String| npz_err(format!("`{member}`: {reason}"));
            let stored = f.compression() == zip::CompressionMethod::Stored;
            let found_here = if stored {
                // `numpy.savez`: the member's bytes lie in the archive as they are: map them.
                let start =
                    usize::try_from(f.data_start()).map_err(|_| member_err("too large".into()))?;
                let size = usize::try_from(f.size()).map_err(|_| member_err("too large".into()))?;
                let end = start
                    .checked_add(size)
                    .filter(|&e| e <= map.bytes().len())
                    .ok_or_else(|| member_err("truncated archive".into()))?;
                let l = npy::layout(&map.bytes()[start..end]).map_err(member_err)?;
                let bytes = if l.in_place() {
                    Bytes::InPlace {
                        file: map.clone(),
                        offset: start + l.data_start,
                        len: size - l.data_start,
                    }
                } else {
                    Bytes::Owned(npy::data_le_c(&map.bytes()[start..end], &l).into_owned())
                };
                Found {
                    file: path.to_path_buf(),
                    shape: l.shape,
                    elem: l.dtype,
                    bytes,
                }
            } else {
                // `numpy.savez_compressed`: decompressed into memory.
                let mut raw = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut raw)
                    .map_err(|e| member_err(format!("cannot decompress it ({e})")))?;
                let l = npy::layout(&raw).map_err(member_err)?;
                let bytes = npy::data_le_c(&raw, &l).into_owned();
                Found {
                    file: path.to_path_buf(),
                    shape: l.shape,
                    elem: l.dtype,
                    bytes: Bytes::Owned(bytes),
                }
            };
            found.push(found_here);
        }
        let ignored = names
            .into_iter()
            .filter(|n| !specs.iter().any(|s| &s.name == n))
            .collect();
        Self::assemble(path.display().to_string(), path, ss, found, ignored)
    }

    fn load_npy_dir(dir: &Path, ss: SpecsScales<'_>) -> Result<Dataset, IoError> {
        let specs = ss.0;
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
        Self::assemble(dir.display().to_string(), dir, ss, found, ignored)
    }

    fn load_npy_list(arg: &str, ss: SpecsScales<'_>) -> Result<Dataset, IoError> {
        let specs = ss.0;
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
        Self::assemble(arg.to_string(), Path::new(arg), ss, found, ignored)
    }

    /// Checks shapes, sample counts, dtypes and values, and converts.
    fn assemble(
        source: String,
        where_: &Path,
        (specs, scales): SpecsScales<'_>,
        found: Vec<Found>,
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
        for ((s, f), scale) in specs.iter().zip(found).zip(scales) {
            columns.push(convert(s, f, *scale)?);
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

/// The specs and the `--scale` of each.
type SpecsScales<'a> = (&'a [TensorSpec], &'a [Option<f32>]);

/// A `.npy` file, mapped: its data in place when little-endian C order, else converted.
fn read_npy_found(file: &Path) -> Result<Found, IoError> {
    let map = MappedFile::open(file, "npy file")?;
    let l = npy::layout(map.bytes()).map_err(|reason| IoError::Npy {
        path: file.to_path_buf(),
        reason,
    })?;
    let bytes = if l.in_place() {
        Bytes::InPlace {
            file: map.clone(),
            offset: l.data_start,
            len: map.bytes().len() - l.data_start,
        }
    } else {
        Bytes::Owned(npy::data_le_c(map.bytes(), &l).into_owned())
    };
    Ok(Found {
        file: file.to_path_buf(),
        shape: l.shape,
        elem: l.dtype,
        bytes,
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

fn convert(s: &TensorSpec, f: Found, scale: Option<f32>) -> Result<Column, IoError> {
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
            let mut out = Vec::with_capacity(f.bytes().len() / f.elem.size());
            for (i, w) in decode_wide(f.elem, f.bytes()).into_iter().enumerate() {
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
                            "is negative; labels and tokens are indices 0..n-1".into()
                        } else {
                            "does not fit in i32; labels and tokens are indices 0..n-1".into()
                        },
                    });
                }
                out.push(v as i32);
            }
            Ok(Column::I32(out))
        }
        _ => {
            let non_finite = |index: usize, value: f32| {
                IoError::NonFinite {
                path: f.file.clone(),
                name: s.name.clone(),
                index,
                value,
                hint: "clean the data (replace or drop NaN/Inf; f64 values beyond the f32 range become Inf)",
            }
            };
            let input = s.role == TensorRole::Input;
            let is_int = !f.elem.is_float() && f.elem != ElemType::Bool;
            if input && is_int && scale.is_none() {
                return Err(IoError::NeedsScale {
                    path: f.file.clone(),
                    name: s.name.clone(),
                    found: f.elem.name().to_string(),
                });
            }
            // In place: little-endian f32, or uint8 (times the scale), in a mapped file.
            let stored = match f.elem {
                ElemType::F32 => Some(Stored::F32),
                ElemType::U8 => Some(Stored::U8),
                _ => None,
            };
            if let (true, Some(stored), Bytes::InPlace { file, offset, .. }) =
                (input, stored, &f.bytes)
            {
                let m = Mapped {
                    file: file.clone(),
                    offset: *offset,
                    stored,
                    scale: scale.unwrap_or(1.0),
                    sample_len: s.sample_len(),
                    stored_samples: f.shape[0],
                    rows: None,
                };
                if let Some((i, x)) = m.first_non_finite() {
                    return Err(non_finite(i, x));
                }
                return Ok(Column::Mapped(m));
            }
            let mut v = if input && is_int {
                decode_wide(f.elem, f.bytes())
                    .into_iter()
                    .map(|w| match w {
                        Wide::Int(i) => i as f32,
                        Wide::Float(x) => x as f32,
                    })
                    .collect()
            } else {
                decode_f32(f.elem, f.bytes()).ok_or_else(mismatch)?
            };
            if let Some(k) = scale {
                v.iter_mut().for_each(|x| *x *= k);
            }
            if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(non_finite(i, *x));
            }
            Ok(Column::F32(v))
        }
    }
}
