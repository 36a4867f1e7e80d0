//! File input/output of the runtime: training data (`.safetensors`, `.npz` or `.npy`), weights
//! (`.safetensors`, written atomically), predictions, and the errors of all of them.
//!
//! Every error is an [`IoError`] whose message says what went wrong, where (the file and, where it
//! applies, the tensor) and what to do about it.
//!
//! `.npy` headers are read and written by the `npyz` crate ([`npy`] maps its dtypes and checks
//! sizes); `.npz` archives are opened with `zip` (stored and deflated members, as numpy writes
//! them). Data files are memory-mapped and, where the layout allows, read in place.
//!
//! A training loop uses it like this (the batch buffers are allocated once):
//!
//! ```
//! use dmc_plan::op::DType;
//! use dmc_runtime::io::{check_writable, load_weights, save_weights, Dataset, Task, TensorSpec};
//!
//! let specs = [TensorSpec::input("x", &[4]), TensorSpec::target("y", &[], DType::I32)];
//! // Real data: Dataset::load(Path::new("train.safetensors"), &specs)?
//! let data = Dataset::synthetic(&specs, 100, 0, Task::Classification { classes: 3 })?;
//! data.check_classes("y", 3)?;
//! let (train, _val) = data.split(0.2, 0)?;
//! let dir = tempfile::tempdir().unwrap();
//! let out = dir.path().join("weights.safetensors");
//! check_writable(&out)?; // before training starts
//! let (mut xb, mut yb) = (vec![0f32; 16 * 4], vec![0i32; 16]);
//! for epoch in 0..2 {
//!     for batch in train.epoch(16, 0, epoch)?.batches() {
//!         train.fill_f32("x", batch, &mut xb)?;
//!         train.fill_i32("y", batch, &mut yb)?;
//!         // ... run the step ...
//!     }
//! }
//! let w = vec![0.5f32; 12];
//! save_weights(&out, &[("fc.weight".to_string(), vec![4, 3], &w[..])])?;
//! let loaded = load_weights(&out, &[("fc.weight".to_string(), vec![4, 3])])?;
//! assert_eq!(loaded[0].1, w);
//! # Ok::<(), dmc_runtime::io::IoError>(())
//! ```

pub mod checkpoint;
pub mod data;
pub mod files;
pub mod interop;
pub mod npy;
pub mod predict;
pub mod weights;

use std::fmt;
use std::path::PathBuf;

pub use checkpoint::{load_checkpoint, save_checkpoint, state_path, Checkpoint, TrainState};
pub use data::{
    epoch_order, parse_scale, BatchData, DataMemory, Dataset, Epoch, LoadOptions, Task, TensorRole,
    TensorSpec,
};
pub use files::{
    check_writable, remove_temp_files_in_flight, write_file_atomic, write_file_atomic_with,
};
pub use interop::Conversion;
pub use npy::{read_npy, write_npy_f32, write_npy_i32, NpyArray};
pub use predict::{write_tensor, write_tensor_i32};
pub use weights::{
    load_weights, read_tensors, save_tensors, save_tensors_and_counters, save_weights, NamedArray,
    TensorFile,
};

pub(crate) use files::{atomic_write, read_file};

/// Formats a list of names as `a, b, c` (or `(none)`).
pub(crate) struct NameList<'a>(pub &'a [String]);

impl fmt::Display for NameList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(none)");
        }
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "`{n}`")?;
        }
        Ok(())
    }
}

fn fmt_names(v: &[String]) -> NameList<'_> {
    NameList(v)
}

/// At most the first eight names, then how many more.
fn fmt_names_short(v: &[String]) -> String {
    const SHOWN: usize = 8;
    if v.len() <= SHOWN {
        return fmt_names(v).to_string();
    }
    format!("{}, ... ({} more)", NameList(&v[..SHOWN]), v.len() - SHOWN)
}

/// The command that converts a PyTorch/Keras file for a program (`dmc weights import`).
pub fn import_command(
    path: &std::path::Path,
    program: Option<&std::path::Path>,
    framework: Option<&str>,
) -> String {
    let cmd = format!(
        "`dmc weights import {} {} --from {} -o converted.safetensors`",
        program.map_or("NET.dm".into(), |p| p.display().to_string()),
        path.display(),
        framework.unwrap_or("torch|keras")
    );
    match program {
        Some(_) => cmd,
        None => format!("{cmd} (NET.dm: the program)"),
    }
}

/// Whether `a` holds the same dimensions as `b` in another order.
fn is_permutation(a: &[usize], b: &[usize]) -> bool {
    let (mut x, mut y) = (a.to_vec(), b.to_vec());
    x.sort_unstable();
    y.sort_unstable();
    a != b && x == y
}

/// What to do about a parameter of the wrong shape: a transposed or permuted one is another
/// framework's layout (PyTorch's OIHW convolutions, `[out, in]` Linear weights), which `dmc
/// weights import` converts; anything else is another program's.
fn shape_hint(
    path: &std::path::Path,
    program: Option<&std::path::Path>,
    found: &[usize],
    expected: &[usize],
) -> String {
    if is_permutation(found, expected) {
        let what = if found.len() == 2 {
            "transposed, as PyTorch stores a Linear weight ([out, in]; dmc's dense weight is [in, out])"
        } else if found.len() == 4 {
            "permuted, as PyTorch stores a convolution weight (OIHW; dmc's is HWIO)"
        } else {
            "permuted"
        };
        format!(
            "the same dimensions {what}: the file is in another framework's layout; convert it with {}",
            import_command(path, program, Some("torch"))
        )
    } else {
        "the weights were saved from a different program: pass the right --init file".to_string()
    }
}

/// What to do about data samples of the wrong shape: the same dimensions in another order need a
/// transpose (a reshape would keep the bytes in place and scramble the samples); channels first
/// (NCHW) for a channels-last (NHWC) program is the common case, said in numpy's words.
fn sample_shape_hint(found: &[usize], expected: &[usize]) -> String {
    let sample = found.get(1..).unwrap_or(&[]);
    let dims = |s: &[usize]| s.iter().map(|d| format!(",{d}")).collect::<String>();
    if is_permutation(sample, expected) {
        if sample.len() == 3 && sample[0] == expected[2] && sample[1..] == expected[..2] {
            return format!(
                "the data looks channels-first (NCHW: [samples{}]) and the program takes channels last (NHWC: [samples{}]): transpose it, e.g. numpy x.transpose(0, 2, 3, 1) or torch x.permute(0, 2, 3, 1); a reshape would scramble the pixels",
                dims(sample),
                dims(expected)
            );
        }
        // The axis of each expected dimension in the data's sample (sizes may repeat: the first
        // unused match).
        let mut used = vec![false; sample.len()];
        let mut axes = vec!["0".to_string()];
        for d in expected {
            if let Some(k) = (0..sample.len()).find(|&k| !used[k] && sample[k] == *d) {
                used[k] = true;
                axes.push((k + 1).to_string());
            }
        }
        return format!(
            "the same dimensions in another order: transpose the data to [samples{}], e.g. numpy x.transpose({}); a reshape would scramble the samples",
            dims(expected),
            axes.join(", ")
        );
    }
    format!("reshape the data to [samples{}]", dims(expected))
}

fn fmt_suggestions(v: &[(String, String)]) -> String {
    if v.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = v
        .iter()
        .map(|(want, have)| format!("for `{want}` did you mean `{have}`?"))
        .collect();
    format!(" ({})", parts.join("; "))
}

fn fmt_shape(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// Every error of the IO layer. Messages name the file (and tensor) and say what to do.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{what} not found: {path}; check the path (it is resolved relative to the current directory)")]
    NotFound { path: PathBuf, what: &'static str },

    #[error("cannot read {path}: {source}; check that it is a readable file")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot write {path}: {source}; check free disk space and permissions, or choose another path")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path} is a {kind}, not a regular file; dmc reads {what}s from regular files only (a FIFO or device may never end): copy the contents to a file first")]
    NotRegularFile {
        path: PathBuf,
        kind: &'static str,
        what: &'static str,
    },

    #[error("{what} {path} is {bytes} bytes, more than this machine's memory ({limit} bytes); use a smaller file or a machine with more memory")]
    TooLarge {
        path: PathBuf,
        what: &'static str,
        bytes: u64,
        limit: u64,
    },

    #[error("the weights hold a non-finite value ({value}) in `{name}` at flat index {index}, so they were not written and {path} is untouched; lower the learning rate (--lr) or check the data, and resume from the last good weights")]
    NonFiniteWeights {
        path: PathBuf,
        name: String,
        index: usize,
        value: f32,
    },

    #[error("cannot save to {path}: {reason}; {hint}")]
    NotWritable {
        path: PathBuf,
        reason: String,
        hint: String,
    },

    #[error("{path} is not a valid safetensors file (truncated or corrupt): {source}; {hint}")]
    Safetensors {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
        hint: &'static str,
    },

    #[error("{path} is not a valid .npy file: {reason}; re-save it with numpy.save(path, array)")]
    Npy { path: PathBuf, reason: String },

    #[error("{path} is not a usable .npz archive: {reason}; re-save it with numpy.savez(path, x=inputs, y=labels) (or savez_compressed)")]
    Npz { path: PathBuf, reason: String },

    #[error("{path}: input `{name}` holds {found} values (integers, e.g. image pixels), which the program reads as f32 only with an explicit scale; pass --scale {name}=1/255 (each value is multiplied by the factor: 1/255 maps bytes 0..255 to [0, 1]), or store floats, e.g. (x / 255).astype(np.float32)")]
    NeedsScale {
        path: PathBuf,
        name: String,
        found: String,
    },

    #[error("--scale `{arg}`: {reason}; write it as NAME=FACTOR with NAME an input of the program, e.g. --scale image=1/255")]
    BadScale { arg: String, reason: String },

    #[error("{path}: unsupported file type; {expected}")]
    UnsupportedFormat {
        path: PathBuf,
        expected: &'static str,
    },

    #[error("cannot parse the data argument `{arg}`: {reason}; pass a .safetensors file, a directory of <name>.npy files, or a list like `x=a.npy,y=b.npy`")]
    BadDataArg { arg: String, reason: String },

    #[error("{source_desc} has no tensor `{name}`: the program expects {}, the data has {}{}; rename the tensor in the data or the input/target in the program", fmt_names(.expected), fmt_names(.found), fmt_suggestions(.suggestion))]
    MissingTensor {
        source_desc: String,
        name: String,
        expected: Vec<String>,
        found: Vec<String>,
        suggestion: Vec<(String, String)>,
    },

    #[error("tensor `{name}` is given twice ({first} and {second}); give each input/target once")]
    DuplicateTensor {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },

    #[error("{path}: tensor `{name}` has shape {} (samples first), so each sample is {}, but the program expects each sample to be {}; {}", fmt_shape(.found), fmt_shape(&.found[1.min(.found.len())..]), fmt_shape(.expected), sample_shape_hint(.found, .expected))]
    SampleShapeMismatch {
        path: PathBuf,
        name: String,
        /// The whole shape in the file (samples first).
        found: Vec<usize>,
        /// The program's per-sample shape.
        expected: Vec<usize>,
    },

    #[error("{path}: the tensors disagree on the number of samples ({}); every input and target needs one entry per sample", .counts.iter().map(|(n, c)| format!("`{n}` has {c}")).collect::<Vec<_>>().join(", "))]
    SampleCountMismatch {
        path: PathBuf,
        counts: Vec<(String, usize)>,
    },

    #[error("{path}: the data has no samples; pass a non-empty dataset")]
    NoSamples { path: PathBuf },

    #[error(
        "{path}: tensor `{name}` has dtype {found}, but the program expects {expected}; {hint}"
    )]
    DtypeMismatch {
        path: PathBuf,
        name: String,
        found: String,
        expected: String,
        hint: String,
    },

    #[error("tensor `{name}`: the program declares dtype {dtype}, which data files cannot provide (inputs are f32, labels i32)")]
    UnsupportedSpecDtype { name: String, dtype: String },

    #[error("{path}: tensor `{name}`, sample {index}: value {value} {reason}")]
    LabelOutOfRange {
        path: PathBuf,
        name: String,
        index: usize,
        value: String,
        reason: String,
    },

    #[error("{path}: label tensor `{name}`, sample {index}: value {value} is not an integer; labels are class indices (convert with y.astype(np.int32))")]
    NonIntegralLabel {
        path: PathBuf,
        name: String,
        index: usize,
        value: f64,
    },

    #[error(
        "{path}: tensor `{name}` holds a non-finite value ({value}) at flat index {index}; {hint}"
    )]
    NonFinite {
        path: PathBuf,
        name: String,
        index: usize,
        value: f32,
        hint: &'static str,
    },

    #[error("{path}: missing parameter(s) {}{}{}; the weights were saved from a different program: pass the right --init file or rename the layers", fmt_names(.missing), fmt_suggestions(.suggestions), if .extra.is_empty() { String::new() } else { format!(" (the file instead has {})", fmt_names(.extra)) })]
    MissingParams {
        path: PathBuf,
        missing: Vec<String>,
        /// `(missing name, closest name in the file)`.
        suggestions: Vec<(String, String)>,
        /// Names in the file the program does not have.
        extra: Vec<String>,
    },

    #[error("{path}: none of the file's {} tensor names ({}) is a parameter of the program (it expects {}); if the file was saved by PyTorch or Keras, convert it: {}", .found.len(), fmt_names_short(.found), fmt_names_short(.expected), import_command(.path, .program.as_deref(), None))]
    ForeignNames {
        path: PathBuf,
        /// The program the weights were loaded for, when the caller knows it ([`IoError::for_program`]).
        program: Option<PathBuf>,
        /// Every name in the file.
        found: Vec<String>,
        /// Every parameter the program expects.
        expected: Vec<String>,
    },

    #[error("{path} is not a usable training checkpoint: {reason}; resume from the checkpoint of the same program and settings, or start from its weights with --init instead of --resume")]
    BadCheckpoint { path: PathBuf, reason: String },

    #[error("{path}: the file has parameter(s) the program does not have: {}; the weights were saved from a different program: pass the right --init file", fmt_names(.extra))]
    UnexpectedParams { path: PathBuf, extra: Vec<String> },

    #[error("{path}: `{name}`: file has {}, program expects {}; {}", fmt_shape(.found), fmt_shape(.expected), shape_hint(.path, .program.as_deref(), .found, .expected))]
    ShapeMismatch {
        path: PathBuf,
        /// As for [`IoError::ForeignNames`].
        program: Option<PathBuf>,
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },

    #[error("tensor `{name}`: shape {} has {} elements but {len} values were given (internal error: a bug in the caller)", fmt_shape(.shape), .shape.iter().product::<usize>())]
    LengthMismatch {
        name: String,
        shape: Vec<usize>,
        len: usize,
    },

    #[error("the dataset ({source_desc}) has {samples} samples, fewer than one batch of {batch}; lower the batch size or add data")]
    BatchTooLarge {
        source_desc: String,
        samples: usize,
        batch: usize,
    },

    #[error("cannot split {samples} samples with validation fraction {fraction}: {reason}; pass a fraction in (0, 1) that leaves both parts non-empty")]
    InvalidSplit {
        samples: usize,
        fraction: f64,
        reason: String,
    },

    #[error("synthetic data: {reason}")]
    Synthetic { reason: String },

    #[error("text corpus {}: {reason}", .path.display())]
    Text { path: PathBuf, reason: String },

    #[error("the dataset has no tensor `{name}` (it has {}); internal error: a bug in the caller", fmt_names(.available))]
    NoSuchTensor {
        name: String,
        available: Vec<String>,
    },

    #[error("batch buffer for `{name}`: {reason} (internal error: a bug in the caller)")]
    BatchBuffer { name: String, reason: String },
}

impl IoError {
    /// Names `program` (the `.dm` file) in the import command an error suggests, where it
    /// suggests one.
    pub fn for_program(mut self, program: &std::path::Path) -> IoError {
        if let IoError::ForeignNames { program: p, .. }
        | IoError::ShapeMismatch { program: p, .. } = &mut self
        {
            *p = Some(program.to_path_buf());
        }
        self
    }
}

/// The element types the readers understand (safetensors and npy share them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    BF16,
    F32,
    F64,
}

impl ElemType {
    pub fn size(self) -> usize {
        use ElemType::*;
        match self {
            Bool | U8 | I8 => 1,
            U16 | I16 | F16 | BF16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        use ElemType::*;
        match self {
            Bool => "bool",
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            U64 => "u64",
            I64 => "i64",
            F16 => "f16",
            BF16 => "bf16",
            F32 => "f32",
            F64 => "f64",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            ElemType::F16 | ElemType::BF16 | ElemType::F32 | ElemType::F64
        )
    }

    pub(crate) fn from_safetensors(d: safetensors::Dtype) -> Option<ElemType> {
        use safetensors::Dtype as D;
        Some(match d {
            D::BOOL => ElemType::Bool,
            D::U8 => ElemType::U8,
            D::I8 => ElemType::I8,
            D::U16 => ElemType::U16,
            D::I16 => ElemType::I16,
            D::U32 => ElemType::U32,
            D::I32 => ElemType::I32,
            D::U64 => ElemType::U64,
            D::I64 => ElemType::I64,
            D::F16 => ElemType::F16,
            D::BF16 => ElemType::BF16,
            D::F32 => ElemType::F32,
            D::F64 => ElemType::F64,
            _ => return None,
        })
    }
}

/// IEEE half to f32.
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: value = man * 2^-24.
            let v = man as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Decodes little-endian floats of a float element type to f32 (`None` for non-float types).
pub(crate) fn decode_f32(ty: ElemType, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match ty {
        ElemType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        ElemType::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        ElemType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        ElemType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        _ => return None,
    })
}

/// One element, widened for range checks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wide {
    Int(i128),
    Float(f64),
}

/// Decodes any element type to `Wide` values.
pub(crate) fn decode_wide(ty: ElemType, bytes: &[u8]) -> Vec<Wide> {
    let n = ty.size();
    bytes
        .chunks_exact(n)
        .map(|c| match ty {
            ElemType::Bool => Wide::Int((c[0] != 0) as i128),
            ElemType::U8 => Wide::Int(c[0] as i128),
            ElemType::I8 => Wide::Int(c[0] as i8 as i128),
            ElemType::U16 => Wide::Int(u16::from_le_bytes([c[0], c[1]]) as i128),
            ElemType::I16 => Wide::Int(i16::from_le_bytes([c[0], c[1]]) as i128),
            ElemType::U32 => Wide::Int(u32::from_le_bytes(c.try_into().unwrap()) as i128),
            ElemType::I32 => Wide::Int(i32::from_le_bytes(c.try_into().unwrap()) as i128),
            ElemType::U64 => Wide::Int(u64::from_le_bytes(c.try_into().unwrap()) as i128),
            ElemType::I64 => Wide::Int(i64::from_le_bytes(c.try_into().unwrap()) as i128),
            ElemType::F16 => Wide::Float(f16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64),
            ElemType::BF16 => Wide::Float(bf16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64),
            ElemType::F32 => Wide::Float(f32::from_le_bytes(c.try_into().unwrap()) as f64),
            ElemType::F64 => Wide::Float(f64::from_le_bytes(c.try_into().unwrap())),
        })
        .collect()
}

/// The closest candidate to `name`, if reasonably close (at most about half its length away).
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let limit = (name.chars().count() / 2).max(2);
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, c)| (*d, c.to_string()))
        .map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn closest_names() {
        assert_eq!(
            closest("conv3.weight", ["conv3.weights", "fc.bias"]),
            Some("conv3.weights".to_string())
        );
        assert_eq!(closest("x", ["completely_different"]), None);
    }
}
