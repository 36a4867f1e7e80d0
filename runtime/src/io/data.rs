//! Training data: loading (`.safetensors`, a directory of `<name>.npy`, or a list of `.npy` files),
//! a seeded synthetic learnable dataset, splitting, seeded epoch shuffles and batch filling into
//! caller-provided buffers (no allocation per step).
//!
//! Layout: every tensor is stored samples-first, C order; a sample of tensor `t` is the contiguous
//! run of `t.sample_len()` values. Inputs are stored as f32, class labels as i32.
//!
//! Batching: the plan has a fixed batch size, so a training epoch runs `samples / batch` full
//! batches of a seeded permutation and **drops the last partial batch** (its samples land in other
//! batches in other epochs, since every epoch reshuffles). For evaluation/prediction over every
//! sample, [`Dataset::in_order_padded`] pads the last batch by repeating samples and says how many
//! entries of each batch are real.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use dmc_plan::op::DType;
use dmc_plan::plan::{IoBinding, Plan};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

use super::predict::{format_of, Format};
use super::weights::{f32_bytes, write_safetensors, RawView};
use super::{closest, decode_f32, decode_wide, npy, read_file, ElemType, IoError, Wide};

const DATA_HINT: &str = "re-export the dataset";

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
}

#[derive(Debug, Clone, PartialEq)]
enum Column {
    F32(Vec<f32>),
    I32(Vec<i32>),
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

/// A tensor found in the data, before conversion.
struct Found<'a> {
    file: PathBuf,
    shape: Vec<usize>,
    elem: ElemType,
    bytes: std::borrow::Cow<'a, [u8]>,
}

fn rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(stream);
    r
}

/// A seeded permutation of `0..samples` for `epoch` (Fisher-Yates on ChaCha8): the same for the
/// same `(samples, seed, epoch)` on every platform, different across epochs and seeds.
pub fn epoch_order(samples: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut r = rng(seed ^ 0x5348_5546_464c_4521, epoch);
    permutation(samples, &mut r)
}

fn permutation(n: usize, r: &mut ChaCha8Rng) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // Multiply-shift: unbiased enough for any realistic n, and stable across rand versions.
        let j = ((r.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize;
        v.swap(i, j);
    }
    v
}

/// The batches of one epoch: a sample order cut into fixed-size batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    order: Vec<usize>,
    batch_size: usize,
    samples: usize,
}

impl Epoch {
    /// A shuffled epoch of `samples / batch_size` full batches; the remainder is dropped.
    /// Panics if `batch_size` is 0.
    pub fn shuffled(samples: usize, batch_size: usize, seed: u64, epoch: u64) -> Epoch {
        assert!(batch_size > 0, "batch size must be positive");
        let mut order = epoch_order(samples, seed, epoch);
        order.truncate(samples / batch_size * batch_size);
        Epoch {
            order,
            batch_size,
            samples,
        }
    }

    /// Every sample in order; the last batch is padded by repeating samples from the start, see
    /// [`Epoch::valid`]. Panics if `batch_size` is 0.
    pub fn in_order_padded(samples: usize, batch_size: usize) -> Epoch {
        assert!(batch_size > 0, "batch size must be positive");
        let total = samples.div_ceil(batch_size) * batch_size;
        let order = (0..total)
            .map(|i| if samples == 0 { 0 } else { i % samples })
            .collect();
        Epoch {
            order,
            batch_size,
            samples,
        }
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub fn num_batches(&self) -> usize {
        self.order.len() / self.batch_size
    }

    /// The sample indices of batch `i`.
    pub fn batch(&self, i: usize) -> &[usize] {
        &self.order[i * self.batch_size..(i + 1) * self.batch_size]
    }

    /// Every batch, in order.
    pub fn batches(&self) -> std::slice::ChunksExact<'_, usize> {
        self.order.chunks_exact(self.batch_size)
    }

    /// How many leading entries of batch `i` are real samples (the rest is padding).
    pub fn valid(&self, i: usize) -> usize {
        self.samples
            .saturating_sub(i * self.batch_size)
            .min(self.batch_size)
    }

    /// Samples left out of this epoch (the dropped partial batch of a shuffled epoch).
    pub fn dropped(&self) -> usize {
        self.samples.saturating_sub(self.order.len())
    }
}

/// The bytes [`Dataset::synthetic`] allocates (inputs, targets and the teachers' weights), without
/// overflow.
fn synthetic_bytes(specs: &[TensorSpec], samples: usize, task: Task) -> u128 {
    let samples = samples as u128;
    let len = |s: &TensorSpec| {
        s.per_sample_shape
            .iter()
            .fold(1u128, |a, &d| a.saturating_mul(d as u128))
    };
    let features: u128 = specs
        .iter()
        .filter(|s| s.role == TensorRole::Input)
        .map(len)
        .fold(0, u128::saturating_add);
    let mut total = samples.saturating_mul(features);
    for s in specs.iter().filter(|s| s.role == TensorRole::Target) {
        let l = len(s);
        let (teacher, data) = match task {
            Task::Regression => (l.saturating_mul(features), samples.saturating_mul(l)),
            Task::Classification { classes } => {
                let c = classes as u128;
                (
                    l.saturating_mul(c).saturating_mul(features),
                    samples.saturating_mul(l.saturating_add(c)),
                )
            }
        };
        total = total.saturating_add(teacher).saturating_add(data);
    }
    total.saturating_mul(4)
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
                kind: super::files::kind_of(&m),
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

    /// A seeded, learnable synthetic dataset: inputs ~ U[0,1); targets from a fixed random linear
    /// "teacher" of the (centred, concatenated) inputs: standardised values for
    /// [`Task::Regression`], the argmax over `classes` for [`Task::Classification`] (i32 labels, or
    /// one-hot f32 targets of `classes` values). The same `seed` gives the same data.
    pub fn synthetic(
        specs: &[TensorSpec],
        samples: usize,
        seed: u64,
        task: Task,
    ) -> Result<Dataset, IoError> {
        let fail = |reason: String| Err(IoError::Synthetic { reason });
        if samples == 0 {
            return fail("the sample count must be positive".into());
        }
        if !specs.iter().any(|s| s.role == TensorRole::Input) {
            return fail("the program has no inputs".into());
        }
        if let Task::Classification { classes } = task {
            if classes < 2 {
                return fail(format!(
                    "classification needs at least 2 classes, got {classes}"
                ));
            }
            if classes > i32::MAX as usize {
                return fail(format!("{classes} classes do not fit in i32 labels"));
            }
        }
        let need = synthetic_bytes(specs, samples, task);
        let limit = crate::alloc::physical_memory().map_or(1u128 << 32, |m| m as u128 / 2);
        if need > limit {
            return fail(format!(
                "{samples} samples of this program's inputs and targets (with the teacher's weights) need {need} bytes, more than half this machine's memory ({limit} bytes); pass fewer samples (--synthetic-samples; --samples for `dmc data`), or real data with --data"
            ));
        }
        let mut columns = Vec::with_capacity(specs.len());
        // Inputs first (stream 1), so that the teachers can read them.
        let mut r = rng(seed, 1);
        let mut inputs: Vec<(usize, Vec<f32>)> = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            if s.role != TensorRole::Input {
                continue;
            }
            if s.dtype != DType::F32 {
                return fail(format!("input `{}` must be f32", s.name));
            }
            let v: Vec<f32> = (0..samples * s.sample_len())
                .map(|_| r.random::<f32>())
                .collect();
            inputs.push((i, v));
        }
        let features: usize = inputs.iter().map(|(i, _)| specs[*i].sample_len()).sum();
        let x_of = |n: usize, buf: &mut Vec<f32>| {
            buf.clear();
            for (i, v) in &inputs {
                let l = specs[*i].sample_len();
                buf.extend(v[n * l..(n + 1) * l].iter().map(|x| x - 0.5));
            }
        };
        let mut targets: HashMap<usize, Column> = HashMap::new();
        for (t, s) in specs.iter().enumerate() {
            if s.role != TensorRole::Target {
                continue;
            }
            let mut tr = rng(seed, 2 + t as u64);
            let len = s.sample_len();
            let col = match (task, s.dtype) {
                (Task::Regression, DType::F32) => {
                    let w: Vec<f32> = (0..len * features)
                        .map(|_| tr.random::<f32>() * 2.0 - 1.0)
                        .collect();
                    let mut y = vec![0f32; samples * len];
                    if len > 0 {
                        y.par_chunks_mut(len).enumerate().for_each_init(
                            || Vec::with_capacity(features),
                            |x, (n, out)| {
                                x_of(n, x);
                                for (o, v) in out.iter_mut().enumerate() {
                                    *v = dot(&w[o * features..(o + 1) * features], x);
                                }
                            },
                        );
                    }
                    for o in 0..len {
                        let mean = (0..samples).map(|n| y[n * len + o] as f64).sum::<f64>()
                            / samples as f64;
                        let var = (0..samples)
                            .map(|n| (y[n * len + o] as f64 - mean).powi(2))
                            .sum::<f64>()
                            / samples as f64;
                        let sd = if var > 1e-20 { var.sqrt() } else { 1.0 };
                        for n in 0..samples {
                            y[n * len + o] = ((y[n * len + o] as f64 - mean) / sd) as f32;
                        }
                    }
                    Column::F32(y)
                }
                (Task::Classification { classes }, dtype) => {
                    // i32: one label per element; f32: a one-hot vector of `classes` values.
                    let labels_per_sample = match dtype {
                        DType::I32 => len,
                        DType::F32 if len == classes => 1,
                        _ => {
                            return fail(format!(
                                "target `{}` ({:?}, {} values per sample) is neither i32 labels nor a one-hot f32 vector of {classes} classes",
                                s.name, dtype, len
                            ))
                        }
                    };
                    let w: Vec<f32> = (0..labels_per_sample * classes * features)
                        .map(|_| tr.random::<f32>() * 2.0 - 1.0)
                        .collect();
                    let mut labels = vec![0i32; samples * labels_per_sample];
                    if labels_per_sample > 0 {
                        labels
                            .par_chunks_mut(labels_per_sample)
                            .enumerate()
                            .for_each_init(
                                || Vec::with_capacity(features),
                                |x, (n, out)| {
                                    x_of(n, x);
                                    for (e, label) in out.iter_mut().enumerate() {
                                        let mut best = (f32::NEG_INFINITY, 0usize);
                                        for c in 0..classes {
                                            let row = (e * classes + c) * features;
                                            let v = dot(&w[row..row + features], x);
                                            if v > best.0 {
                                                best = (v, c);
                                            }
                                        }
                                        *label = best.1 as i32;
                                    }
                                },
                            );
                    }
                    if dtype == DType::I32 {
                        Column::I32(labels)
                    } else {
                        let mut y = vec![0f32; samples * classes];
                        for (n, &l) in labels.iter().enumerate() {
                            y[n * classes + l as usize] = 1.0;
                        }
                        Column::F32(y)
                    }
                }
                (Task::Regression, dtype) => {
                    return fail(format!(
                        "target `{}` is {:?}: class labels need Task::Classification",
                        s.name, dtype
                    ))
                }
            };
            targets.insert(t, col);
        }
        // Make classes separable: pull every input halfway towards a seeded per-class centre
        // (inputs stay in [0, 1)). The teacher alone gives labels that a small net learns slowly.
        if let Task::Classification { classes } = task {
            let first_labels = specs
                .iter()
                .enumerate()
                .find_map(|(t, s)| match targets.get(&t) {
                    Some(Column::I32(l)) if s.sample_len() == 1 => Some(l.clone()),
                    _ => None,
                });
            if let Some(labels) = first_labels {
                let mut cr = rng(seed, 0x5eed_c1a5);
                for (i, v) in inputs.iter_mut() {
                    let l = specs[*i].sample_len();
                    // Images ([h, w, c]) get one colour per class (a centre per channel, the same at
                    // every pixel), so that nets with global pooling can see it too.
                    let shape = &specs[*i].per_sample_shape;
                    let period = if shape.len() == 3 {
                        shape[2].max(1)
                    } else {
                        l.max(1)
                    };
                    let centres: Vec<f32> =
                        (0..classes * period).map(|_| cr.random::<f32>()).collect();
                    for (n, &label) in labels.iter().enumerate() {
                        let c = &centres[label as usize * period..(label as usize + 1) * period];
                        for (k, x) in v[n * l..(n + 1) * l].iter_mut().enumerate() {
                            *x = 0.5 * *x + 0.5 * c[k % period];
                        }
                    }
                }
            }
        }
        let mut inputs = inputs.into_iter();
        for (i, s) in specs.iter().enumerate() {
            if s.role == TensorRole::Input {
                columns.push(Column::F32(inputs.next().unwrap().1));
            } else {
                columns.push(targets.remove(&i).unwrap());
            }
        }
        Ok(Dataset {
            source: format!("synthetic data (seed {seed})"),
            samples,
            specs: specs.to_vec(),
            columns,
            ignored: Vec::new(),
        })
    }

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
                    let descr = if v.dtype == Dtype::I32 { "<i4" } else { "<f4" };
                    npy::write_npy_bytes(path, descr, &v.shape, &v.bytes)
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

    /// All values of an f32 tensor (samples first).
    pub fn tensor_f32(&self, name: &str) -> Option<&[f32]> {
        match self.column(name).ok()?.1 {
            Column::F32(v) => Some(v),
            Column::I32(_) => None,
        }
    }

    /// All values of an i32 tensor (samples first).
    pub fn tensor_i32(&self, name: &str) -> Option<&[i32]> {
        match self.column(name).ok()?.1 {
            Column::I32(v) => Some(v),
            Column::F32(_) => None,
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
                reason: format!("is not below the program's class count {classes}"),
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
        let Column::F32(v) = col else {
            return Err(IoError::BatchBuffer {
                name: name.to_string(),
                reason: "the tensor holds i32 values, not f32".into(),
            });
        };
        for (dst, &i) in out.chunks_exact_mut(len.max(1)).zip(indices) {
            dst.copy_from_slice(&v[i * len..(i + 1) * len]);
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
        let mut dst = out.chunks_exact_mut(4);
        for &i in indices {
            for k in i * len..(i + 1) * len {
                let b = match col {
                    Column::F32(v) => v[k].to_ne_bytes(),
                    Column::I32(v) => v[k].to_ne_bytes(),
                };
                dst.next().unwrap().copy_from_slice(&b);
            }
        }
        Ok(())
    }

    /// The samples `indices` of tensor `name`, freshly allocated.
    pub fn fill_batch(&self, indices: &[usize], name: &str) -> Result<BatchData, IoError> {
        let (s, col) = self.column(name)?;
        let n = indices.len() * s.sample_len();
        match col {
            Column::F32(_) => {
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

    /// The samples `indices` (in that order) as a new dataset.
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

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
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
