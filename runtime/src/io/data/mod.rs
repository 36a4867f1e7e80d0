//! Training data: loading (`.safetensors`, a directory of `<name>.npy`, or a list of `.npy` files),
//! a seeded synthetic learnable dataset, splitting, seeded epoch shuffles and batch filling into
//! caller-provided buffers (no allocation per step).
//!
//! Layout: every tensor is stored samples-first, C order; a sample of tensor `t` is the contiguous
//! run of `t.sample_len()` values. Inputs are stored as f32, class labels as i32.
//!
//! Batching: the plan has a fixed batch size, so a training epoch runs `samples / batch` full
//! batches of a seeded permutation and **drops the last partial batch** (its samples land in other
//! batches in other epochs, since every epoch reshuffles); [`Dataset::epoch_in_order`] is the
//! unshuffled epoch (file order, the same every epoch: `--no-shuffle`). For evaluation/prediction over every
//! sample, [`Dataset::in_order_padded`] pads the last batch by repeating samples and says how many
//! entries of each batch are real.
//!
//! This module holds the dataset and its batching; [`load`](Dataset::load) (the file formats) is in
//! `load`, [`synthetic`](Dataset::synthetic) in `synthetic`, the seeded sample orders in `epoch`.

mod epoch;
mod load;
mod mapped;
mod synthetic;
mod text;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use dmc_plan::op::DType;
use dmc_plan::plan::{IoBinding, Plan};
use safetensors::Dtype;

pub use epoch::{epoch_order, Epoch};
pub use load::{parse_scale, LoadOptions};

use mapped::Mapped;

use epoch::{permutation, rng};

use super::predict::{format_of, Format};
use super::weights::{f32_bytes, write_safetensors, RawView};
use super::{npy, IoError};

/// Whether a tensor is fed to the network or compared with its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorRole {
    Input,
    Target,
}

/// What the program expects of one data tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    /// The shape of one sample (the full tensor is `[samples, ..per_sample_shape]`).
    /// Class labels have `[]`.
    pub per_sample_shape: Vec<usize>,
    /// `F32` (inputs, regression targets) or `I32` (class labels).
    pub dtype: DType,
    pub role: TensorRole,
}

impl TensorSpec {
    /// An f32 input.
    pub fn input(name: &str, per_sample_shape: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            per_sample_shape: per_sample_shape.to_vec(),
            dtype: DType::F32,
            role: TensorRole::Input,
        }
    }

    /// A target: `DType::I32` class labels (shape `[]`) or `DType::F32` regression values.
    pub fn target(name: &str, per_sample_shape: &[usize], dtype: DType) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            per_sample_shape: per_sample_shape.to_vec(),
            dtype,
            role: TensorRole::Target,
        }
    }

    /// From a plan binding (whose shape includes the batch first).
    pub fn from_binding(b: &IoBinding, role: TensorRole) -> TensorSpec {
        TensorSpec {
            name: b.name.clone(),
            per_sample_shape: b.shape.get(1..).unwrap_or(&[]).to_vec(),
            dtype: b.dtype,
            role,
        }
    }

    /// The plan's inputs then targets.
    pub fn from_plan(plan: &Plan) -> Vec<TensorSpec> {
        let inputs = plan
            .inputs
            .iter()
            .map(|b| TensorSpec::from_binding(b, TensorRole::Input));
        let targets = plan
            .targets
            .iter()
            .map(|b| TensorSpec::from_binding(b, TensorRole::Target));
        inputs.chain(targets).collect()
    }

    /// Values per sample.
    pub fn sample_len(&self) -> usize {
        self.per_sample_shape.iter().product()
    }
}

/// What the synthetic dataset's targets encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// f32 targets: a fixed random linear function of the inputs, standardised per output.
    Regression,
    /// i32 labels (or f32 one-hot targets of `classes` values): the argmax of a fixed random
    /// linear function of the inputs over `classes`.
    Classification { classes: usize },
    /// Next-token windows of a seeded random token stream over `vocab` tokens (a program with one
    /// integer input `int[T]` and labels `int[T]`: a sequence model).
    NextToken { vocab: usize },
}

#[derive(Debug, Clone, PartialEq)]
enum Column {
    F32(Vec<f32>),
    I32(Vec<i32>),
    /// f32 inputs read from a memory-mapped file batch by batch (little-endian f32, or uint8
    /// times a scale).
    Mapped(Mapped),
}

/// The host memory a dataset holds (for `dmc run`'s report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataMemory {
    /// Bytes of the data files mapped in place (each file once): read from the file as the
    /// batches touch them, shared with the page cache, not copied.
    pub mapped: u64,
    /// Bytes held in memory: converted values (f32 inputs from other dtypes, i32 labels, the
    /// synthetic set) and the sample indices of a split.
    pub in_memory: u64,
}

impl DataMemory {
    pub fn total(&self) -> u64 {
        self.mapped + self.in_memory
    }
}

/// A freshly allocated batch (see [`Dataset::fill_f32`] / [`Dataset::fill_i32`] for the
/// allocation-free variants).
#[derive(Debug, Clone, PartialEq)]
pub enum BatchData {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// A dataset held in memory: one column per [`TensorSpec`], all with the same number of samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    source: String,
    samples: usize,
    specs: Vec<TensorSpec>,
    columns: Vec<Column>,
    ignored: Vec<String>,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples
    }

    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// Writes the tensors `names` (samples first, f32 inputs and i32 labels as held) to `path`,
    /// atomically, in the format its extension names: a `.safetensors` file holding every named
    /// tensor under its name, or a `.npy` file, which holds exactly one (`names` must have one
    /// entry). [`Dataset::load`] reads the result back unchanged.
    pub fn save(&self, path: &Path, names: &[&str]) -> Result<(), IoError> {
        let format = format_of(path)?;
        let mut views = Vec::with_capacity(names.len());
        for name in names {
            let (s, col) = self.column(name)?;
            let mut shape = Vec::with_capacity(1 + s.per_sample_shape.len());
            shape.push(self.samples);
            shape.extend_from_slice(&s.per_sample_shape);
            let (dtype, bytes) = match col {
                Column::F32(v) => (Dtype::F32, f32_bytes(v)),
                Column::Mapped(m) => (Dtype::F32, f32_bytes(&m.to_vec())),
                Column::I32(v) => (Dtype::I32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            };
            views.push((
                name.to_string(),
                RawView {
                    dtype,
                    shape,
                    bytes: Cow::Owned(bytes),
                },
            ));
        }
        match format {
            Format::Safetensors => write_safetensors(path, &views),
            Format::Npy => match views.as_slice() {
                [(_, v)] => {
                    let words = v.bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
                    if v.dtype == Dtype::I32 {
                        let data: Vec<i32> = words.map(i32::from_le_bytes).collect();
                        npy::write_npy_i32(path, &v.shape, &data)
                    } else {
                        let data: Vec<f32> = words.map(f32::from_le_bytes).collect();
                        npy::write_npy_f32(path, &v.shape, &data)
                    }
                }
                _ => Err(IoError::UnsupportedFormat {
                    path: path.to_path_buf(),
                    expected: "a .npy file holds one tensor: write one tensor per .npy file, or several to a .safetensors file",
                }),
            },
        }
    }

    /// Where the data came from (a path, or "synthetic data (seed N)").
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn specs(&self) -> &[TensorSpec] {
        &self.specs
    }

    /// Tensors in the data that the program does not use (to warn about).
    pub fn ignored(&self) -> &[String] {
        &self.ignored
    }

    fn column(&self, name: &str) -> Result<(&TensorSpec, &Column), IoError> {
        self.specs
            .iter()
            .zip(&self.columns)
            .find(|(s, _)| s.name == name)
            .ok_or_else(|| IoError::NoSuchTensor {
                name: name.to_string(),
                available: self.specs.iter().map(|s| s.name.clone()).collect(),
            })
    }

    /// All values of an f32 tensor (samples first): borrowed when held in memory, decoded (a copy)
    /// when the tensor is read in place from a mapped file.
    pub fn tensor_f32(&self, name: &str) -> Option<Cow<'_, [f32]>> {
        match self.column(name).ok()?.1 {
            Column::F32(v) => Some(Cow::Borrowed(v)),
            Column::Mapped(m) => Some(Cow::Owned(m.to_vec())),
            Column::I32(_) => None,
        }
    }

    /// Whether tensor `name` is read in place from a memory-mapped file (not copied into memory).
    pub fn is_mapped(&self, name: &str) -> bool {
        matches!(self.column(name), Ok((_, Column::Mapped(_))))
    }

    /// The host memory the data holds: mapped file bytes (each file once) and in-memory copies.
    pub fn memory(&self) -> DataMemory {
        let mut m = DataMemory::default();
        for c in &self.columns {
            match c {
                Column::F32(v) => m.in_memory += (v.len() * 4) as u64,
                Column::I32(v) => m.in_memory += (v.len() * 4) as u64,
                Column::Mapped(c) => m.in_memory += c.index_bytes() as u64,
            }
        }
        m.mapped = self
            .mapped_files()
            .iter()
            .map(|f| f.bytes().len() as u64)
            .sum();
        m
    }

    /// The distinct files the columns are mapped from.
    fn mapped_files(&self) -> Vec<&std::sync::Arc<mapped::MappedFile>> {
        let mut files: Vec<&std::sync::Arc<mapped::MappedFile>> = Vec::new();
        for c in &self.columns {
            if let Column::Mapped(c) = c {
                if !files.iter().any(|f| std::sync::Arc::ptr_eq(f, &c.file)) {
                    files.push(&c.file);
                }
            }
        }
        files
    }

    /// Whether `other` reads from a file this dataset maps too (the parts of a split do).
    pub fn shares_files_with(&self, other: &Dataset) -> bool {
        let mine = self.mapped_files();
        other
            .mapped_files()
            .iter()
            .any(|f| mine.iter().any(|m| std::sync::Arc::ptr_eq(f, m)))
    }

    /// All values of an i32 tensor (samples first).
    pub fn tensor_i32(&self, name: &str) -> Option<&[i32]> {
        match self.column(name).ok()?.1 {
            Column::I32(v) => Some(v),
            Column::F32(_) | Column::Mapped(_) => None,
        }
    }

    /// Checks that the labels of `name` are below `classes`.
    pub fn check_classes(&self, name: &str, classes: usize) -> Result<(), IoError> {
        let (s, col) = self.column(name)?;
        let Column::I32(v) = col else {
            return Ok(());
        };
        let len = s.sample_len().max(1);
        if let Some((i, l)) = v.iter().enumerate().find(|(_, &l)| l as usize >= classes) {
            return Err(IoError::LabelOutOfRange {
                path: PathBuf::from(&self.source),
                name: name.to_string(),
                index: i / len,
                value: l.to_string(),
                reason: match s.role {
                    TensorRole::Input => format!(
                        "is not a token of the program's embedding (vocab {classes}: tokens 0..{classes})"
                    ),
                    TensorRole::Target => {
                        format!("is not below the program's class count {classes}; labels are class indices 0..classes-1")
                    }
                },
            });
        }
        Ok(())
    }

    fn check_batch(
        &self,
        name: &str,
        indices: &[usize],
        out_len: usize,
        len: usize,
    ) -> Result<(), IoError> {
        if out_len != indices.len() * len {
            return Err(IoError::BatchBuffer {
                name: name.to_string(),
                reason: format!(
                    "buffer holds {out_len} values but {} samples of {len} need {}",
                    indices.len(),
                    indices.len() * len
                ),
            });
        }
        if let Some(&i) = indices.iter().find(|&&i| i >= self.samples) {
            return Err(IoError::BatchBuffer {
                name: name.to_string(),
                reason: format!(
                    "sample index {i} out of range (dataset has {})",
                    self.samples
                ),
            });
        }
        Ok(())
    }

    /// Copies the samples `indices` of f32 tensor `name` into `out` (`indices.len() * sample_len`).
    pub fn fill_f32(&self, name: &str, indices: &[usize], out: &mut [f32]) -> Result<(), IoError> {
        let (s, col) = self.column(name)?;
        let len = s.sample_len();
        self.check_batch(name, indices, out.len(), len)?;
        match col {
            Column::F32(v) => {
                for (dst, &i) in out.chunks_exact_mut(len.max(1)).zip(indices) {
                    dst.copy_from_slice(&v[i * len..(i + 1) * len]);
                }
            }
            Column::Mapped(m) => m.fill(indices, out),
            Column::I32(_) => {
                return Err(IoError::BatchBuffer {
                    name: name.to_string(),
                    reason: "the tensor holds i32 values, not f32".into(),
                })
            }
        }
        Ok(())
    }

    /// Copies the samples `indices` of i32 tensor `name` into `out` (`indices.len() * sample_len`).
    pub fn fill_i32(&self, name: &str, indices: &[usize], out: &mut [i32]) -> Result<(), IoError> {
        let (s, col) = self.column(name)?;
        let len = s.sample_len();
        self.check_batch(name, indices, out.len(), len)?;
        let Column::I32(v) = col else {
            return Err(IoError::BatchBuffer {
                name: name.to_string(),
                reason: "the tensor holds f32 values, not i32".into(),
            });
        };
        for (dst, &i) in out.chunks_exact_mut(len.max(1)).zip(indices) {
            dst.copy_from_slice(&v[i * len..(i + 1) * len]);
        }
        Ok(())
    }

    /// Copies the samples `indices` of tensor `name` into raw arena bytes (native-endian f32/i32,
    /// `indices.len() * sample_len * 4` bytes).
    pub fn fill_bytes(&self, name: &str, indices: &[usize], out: &mut [u8]) -> Result<(), IoError> {
        let (s, col) = self.column(name)?;
        let len = s.sample_len();
        if out.len() & 3 != 0 {
            return Err(IoError::BatchBuffer {
                name: name.to_string(),
                reason: format!("{} bytes is not a whole number of 4-byte values", out.len()),
            });
        }
        self.check_batch(name, indices, out.len() / 4, len)?;
        let mut sample = vec![0f32; if let Column::Mapped(_) = col { len } else { 0 }];
        for (dst, &i) in out.chunks_exact_mut((len * 4).max(1)).zip(indices) {
            if let Column::Mapped(m) = col {
                m.fill(&[i], &mut sample);
            }
            for (k, d) in dst.chunks_exact_mut(4).enumerate() {
                let b = match col {
                    Column::F32(v) => v[i * len + k].to_ne_bytes(),
                    Column::I32(v) => v[i * len + k].to_ne_bytes(),
                    Column::Mapped(_) => sample[k].to_ne_bytes(),
                };
                d.copy_from_slice(&b);
            }
        }
        Ok(())
    }

    /// The samples `indices` of tensor `name`, freshly allocated.
    pub fn fill_batch(&self, indices: &[usize], name: &str) -> Result<BatchData, IoError> {
        let (s, col) = self.column(name)?;
        let n = indices.len() * s.sample_len();
        match col {
            Column::F32(_) | Column::Mapped(_) => {
                let mut v = vec![0f32; n];
                self.fill_f32(name, indices, &mut v)?;
                Ok(BatchData::F32(v))
            }
            Column::I32(_) => {
                let mut v = vec![0i32; n];
                self.fill_i32(name, indices, &mut v)?;
                Ok(BatchData::I32(v))
            }
        }
    }

    /// The samples `indices` (in that order) as a new dataset (a tensor read in place from a mapped
    /// file stays there: only the sample indices are new).
    pub fn subset(&self, indices: &[usize]) -> Dataset {
        let columns = self
            .specs
            .iter()
            .zip(&self.columns)
            .map(|(s, c)| {
                let l = s.sample_len();
                match c {
                    Column::F32(v) => Column::F32(
                        indices
                            .iter()
                            .flat_map(|&i| v[i * l..(i + 1) * l].iter().copied())
                            .collect(),
                    ),
                    Column::I32(v) => Column::I32(
                        indices
                            .iter()
                            .flat_map(|&i| v[i * l..(i + 1) * l].iter().copied())
                            .collect(),
                    ),
                    Column::Mapped(m) => Column::Mapped(m.subset(indices)),
                }
            })
            .collect();
        Dataset {
            source: self.source.clone(),
            samples: indices.len(),
            specs: self.specs.clone(),
            columns,
            ignored: self.ignored.clone(),
        }
    }

    /// Splits into `(train, validation)`: `round(len * val_fraction)` samples chosen by a seeded
    /// permutation go to validation; both parts keep the original sample order.
    pub fn split(&self, val_fraction: f64, seed: u64) -> Result<(Dataset, Dataset), IoError> {
        let err = |reason: &str| IoError::InvalidSplit {
            samples: self.samples,
            fraction: val_fraction,
            reason: reason.to_string(),
        };
        if !(val_fraction > 0.0 && val_fraction < 1.0) {
            return Err(err("the fraction must be strictly between 0 and 1"));
        }
        let n_val = (self.samples as f64 * val_fraction).round() as usize;
        if n_val == 0 {
            return Err(err("the validation set would be empty"));
        }
        if n_val >= self.samples {
            return Err(err("the training set would be empty"));
        }
        let perm = permutation(self.samples, &mut rng(seed ^ 0x5350_4c49_5421, 0));
        let mut val = perm[..n_val].to_vec();
        let mut train = perm[n_val..].to_vec();
        val.sort_unstable();
        train.sort_unstable();
        Ok((self.subset(&train), self.subset(&val)))
    }

    /// A shuffled training epoch (the last partial batch is dropped).
    pub fn epoch(&self, batch_size: usize, seed: u64, epoch: u64) -> Result<Epoch, IoError> {
        self.check_batch_size(batch_size)?;
        Ok(Epoch::shuffled(self.samples, batch_size, seed, epoch))
    }

    /// A training epoch in file order (no shuffle; the last partial batch is dropped): every epoch
    /// is the same batches in the same order.
    pub fn epoch_in_order(&self, batch_size: usize) -> Result<Epoch, IoError> {
        self.check_batch_size(batch_size)?;
        Ok(Epoch::in_order(self.samples, batch_size))
    }

    /// Every sample in order, the last batch padded (for evaluation and prediction).
    pub fn in_order_padded(&self, batch_size: usize) -> Result<Epoch, IoError> {
        if batch_size == 0 {
            return Err(IoError::BatchTooLarge {
                source_desc: self.source.clone(),
                samples: self.samples,
                batch: batch_size,
            });
        }
        Ok(Epoch::in_order_padded(self.samples, batch_size))
    }

    fn check_batch_size(&self, batch_size: usize) -> Result<(), IoError> {
        if batch_size == 0 || self.samples < batch_size {
            return Err(IoError::BatchTooLarge {
                source_desc: self.source.clone(),
                samples: self.samples,
                batch: batch_size,
            });
        }
        Ok(())
    }
}
