//! Weights as `.safetensors`: atomic saving and a strict loader that checks names, shapes, dtypes
//! and values against the program.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use safetensors::{Dtype, SafeTensors, View};

use super::{atomic_write, closest, decode_f32, read_file, ElemType, IoError};

pub(crate) const WEIGHTS_HINT: &str = "re-save the file or pass the right --init";

/// A borrowed tensor serialised by safetensors.
pub(crate) struct RawView<'a> {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Cow<'a, [u8]>,
}

impl View for &RawView<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

pub(crate) fn f32_bytes(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Serialises tensors to a safetensors file atomically (temp file, fsync, rename).
pub(crate) fn write_safetensors(
    path: &Path,
    views: &[(String, RawView<'_>)],
) -> Result<(), IoError> {
    write_safetensors_with(path, views, None)
}

/// [`write_safetensors`] with `metadata` in the header.
pub(crate) fn write_safetensors_with(
    path: &Path,
    views: &[(String, RawView<'_>)],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), IoError> {
    let bytes = safetensors::serialize(views.iter().map(|(n, v)| (n.as_str(), v)), metadata)
        .map_err(|e| IoError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
    atomic_write(path, |w| std::io::Write::write_all(w, &bytes))
}

/// Saves parameters as a `.safetensors` file, atomically: the data goes to
/// `.<name>.tmp.<pid>.<random>` in the same directory, is fsynced and renamed over `path`; on error
/// the temp file is removed and an existing `path` is left untouched. Weights holding NaN or Inf
/// are refused ([`IoError::NonFiniteWeights`]): a diverged run never replaces a good file. A `path` that exists
/// and is not a regular file (a device, a FIFO) is never replaced; a symbolic link is written
/// through (see [`super::files`]).
pub fn save_weights(path: &Path, tensors: &[(String, Vec<usize>, &[f32])]) -> Result<(), IoError> {
    save_tensors(path, tensors, None)
}

/// [`save_weights`] with `metadata` (string pairs) in the file's header (`__metadata__`): the
/// same checks (shapes, unique names, finite values) and the same atomic write.
pub fn save_tensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, &[f32])],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), IoError> {
    save_tensors_and_counters(path, tensors, &[], metadata)
}

/// [`save_tensors`] plus integer scalars (i64, shape `[]`): PyTorch's batchnorm
/// `num_batches_tracked`, which its `load_state_dict(strict=True)` requires.
pub fn save_tensors_and_counters(
    path: &Path,
    tensors: &[(String, Vec<usize>, &[f32])],
    counters: &[(String, i64)],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), IoError> {
    let mut views = Vec::with_capacity(tensors.len() + counters.len());
    let mut seen = HashSet::new();
    for (name, shape, data) in tensors {
        if shape.iter().product::<usize>() != data.len() {
            return Err(IoError::LengthMismatch {
                name: name.clone(),
                shape: shape.clone(),
                len: data.len(),
            });
        }
        if !seen.insert(name.as_str()) {
            return Err(IoError::DuplicateTensor {
                name: name.clone(),
                first: path.to_path_buf(),
                second: path.to_path_buf(),
            });
        }
        if let Some((index, &value)) = data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(IoError::NonFiniteWeights {
                path: path.to_path_buf(),
                name: name.clone(),
                index,
                value,
            });
        }
        views.push((
            name.clone(),
            RawView {
                dtype: Dtype::F32,
                shape: shape.clone(),
                bytes: Cow::Owned(f32_bytes(data)),
            },
        ));
    }
    for (name, value) in counters {
        if !seen.insert(name.as_str()) {
            return Err(IoError::DuplicateTensor {
                name: name.clone(),
                first: path.to_path_buf(),
                second: path.to_path_buf(),
            });
        }
        views.push((
            name.clone(),
            RawView {
                dtype: Dtype::I64,
                shape: Vec::new(),
                bytes: Cow::Owned(value.to_le_bytes().to_vec()),
            },
        ));
    }
    write_safetensors_with(path, &views, metadata)
}

/// Loads parameters from a `.safetensors` file and checks them against the program:
/// every expected name present, no extra names, the same shapes, a float dtype (f32; f64, f16 and
/// bf16 are converted) and finite values. Returns the tensors in the order of `expected`.
pub fn load_weights(
    path: &Path,
    expected: &[(String, Vec<usize>)],
) -> Result<Vec<(String, Vec<f32>)>, IoError> {
    let bytes = read_file(path, "weights file")?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| IoError::Safetensors {
        path: path.to_path_buf(),
        source: e,
        hint: WEIGHTS_HINT,
    })?;
    let mut file_names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    file_names.sort();
    let expected_set: HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let file_set: HashSet<&str> = file_names.iter().map(String::as_str).collect();
    let missing: Vec<String> = expected
        .iter()
        .filter(|(n, _)| !file_set.contains(n.as_str()))
        .map(|(n, _)| n.clone())
        .collect();
    let extra: Vec<String> = file_names
        .iter()
        .filter(|n| !expected_set.contains(n.as_str()))
        .cloned()
        .collect();
    if !missing.is_empty() && missing.len() == expected_set.len() && !extra.is_empty() {
        // Not one name in common: not a renamed layer but another naming scheme (`0.weight`,
        // `conv2d/kernel`), so no "did you mean" but the converter.
        let mut expected_names: Vec<String> = Vec::new();
        for (n, _) in expected {
            if !expected_names.contains(n) {
                expected_names.push(n.clone());
            }
        }
        return Err(IoError::ForeignNames {
            path: path.to_path_buf(),
            program: None,
            found: extra,
            expected: expected_names,
        });
    }
    if !missing.is_empty() {
        let suggestions = missing
            .iter()
            .filter_map(|m| closest(m, extra.iter().map(String::as_str)).map(|c| (m.clone(), c)))
            .collect();
        return Err(IoError::MissingParams {
            path: path.to_path_buf(),
            missing,
            suggestions,
            extra,
        });
    }
    if !extra.is_empty() {
        return Err(IoError::UnexpectedParams {
            path: path.to_path_buf(),
            extra,
        });
    }
    let mut out = Vec::with_capacity(expected.len());
    let mut seen: HashMap<&str, ()> = HashMap::new();
    for (name, shape) in expected {
        if seen.insert(name.as_str(), ()).is_some() {
            continue;
        }
        let view = st.tensor(name).map_err(|e| IoError::Safetensors {
            path: path.to_path_buf(),
            source: e,
            hint: WEIGHTS_HINT,
        })?;
        if view.shape() != shape.as_slice() {
            return Err(IoError::ShapeMismatch {
                path: path.to_path_buf(),
                program: None,
                name: name.clone(),
                found: view.shape().to_vec(),
                expected: shape.clone(),
            });
        }
        let elem = ElemType::from_safetensors(view.dtype());
        let values = match elem.and_then(|t| decode_f32(t, view.data())) {
            Some(v) => v,
            None => {
                return Err(IoError::DtypeMismatch {
                    path: path.to_path_buf(),
                    name: name.clone(),
                    found: elem
                        .map(|t| t.name().to_string())
                        .unwrap_or_else(|| format!("{:?}", view.dtype())),
                    expected: "f32 (f64, f16 and bf16 are converted)".into(),
                    hint: "convert the weights to float32 and re-save the file".into(),
                })
            }
        };
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(IoError::NonFinite {
                path: path.to_path_buf(),
                name: name.clone(),
                index: i,
                value: *v,
                hint: "the weights diverged when they were saved: use an earlier checkpoint or re-initialise",
            });
        }
        out.push((name.clone(), values));
    }
    Ok(out)
}

/// A float tensor of a weights file, whatever its name: (name, shape, values as f32).
pub type NamedArray = (String, Vec<usize>, Vec<f32>);

/// A whole safetensors file: every tensor (float dtypes converted to f32; names sorted) and the
/// header's metadata (empty when there is none).
pub struct TensorFile {
    pub tensors: Vec<NamedArray>,
    pub metadata: HashMap<String, String>,
    /// Integer scalars named `*num_batches_tracked` (PyTorch's batchnorm step counter, which dmc
    /// has no use for: its momentum is never `None`), left out of `tensors`.
    pub counters: Vec<String>,
}

/// Reads every tensor of a `.safetensors` file, whatever the names (for `dmc weights import` and
/// checkpoints); `what` names the file in errors ("weights file"). Every tensor must be a float
/// type and finite.
pub fn read_tensors(path: &Path, what: &'static str) -> Result<TensorFile, IoError> {
    let bytes = read_file(path, what)?;
    let bad = |e| IoError::Safetensors {
        path: path.to_path_buf(),
        source: e,
        hint: WEIGHTS_HINT,
    };
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(bad)?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let st = SafeTensors::deserialize(&bytes).map_err(bad)?;
    let mut tensors = Vec::with_capacity(st.len());
    let mut counters = Vec::new();
    for (name, view) in st.iter() {
        let integer = matches!(view.dtype(), Dtype::I64 | Dtype::I32);
        if integer && view.shape().is_empty() && name.ends_with("num_batches_tracked") {
            counters.push(name.to_string());
            continue;
        }
        tensors.push((name.to_string(), decode_float_tensor(path, name, &view)?));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    counters.sort();
    Ok(TensorFile {
        counters,
        tensors: tensors
            .into_iter()
            .map(|(n, (shape, v))| (n, shape, v))
            .collect(),
        metadata,
    })
}

/// A tensor's shape and values as f32, refusing non-float dtypes and non-finite values.
fn decode_float_tensor(
    path: &Path,
    name: &str,
    view: &safetensors::tensor::TensorView<'_>,
) -> Result<(Vec<usize>, Vec<f32>), IoError> {
    let elem = ElemType::from_safetensors(view.dtype());
    let Some(values) = elem.and_then(|t| decode_f32(t, view.data())) else {
        return Err(IoError::DtypeMismatch {
            path: path.to_path_buf(),
            name: name.to_string(),
            found: elem
                .map(|t| t.name().to_string())
                .unwrap_or_else(|| format!("{:?}", view.dtype())),
            expected: "a float type (f32, f64, f16, bf16)".into(),
            hint: "weights are float tensors: convert it to float32 or leave it out of the file"
                .into(),
        });
    };
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(IoError::NonFinite {
            path: path.to_path_buf(),
            name: name.to_string(),
            index: i,
            value: *v,
            hint: "the weights diverged when they were saved: use an earlier checkpoint or re-initialise",
        });
    }
    Ok((view.shape().to_vec(), values))
}
