//! Data read in place from a memory-mapped file: a data file is held once (its pages, shared
//! with the page cache), not read into a buffer and then converted into another. An input column
//! stored as little-endian f32, or as uint8 with a scale, stays in the file and each batch is
//! decoded from it ([`Mapped::fill`]); other dtypes are converted into memory at load.
//!
//! The file must not change while it is mapped: a file truncated under a running `dmc` makes the
//! next read of a missing page fail with SIGBUS, and a file rewritten in place changes the data
//! under the run. That is the same contract as `numpy.load(mmap_mode="r")`, and the user's to keep
//! (docs/INTEROP.md says so); replacing the file atomically (a new file renamed over it, as `dmc`
//! itself writes files) is safe, since the mapping keeps the old file's pages.

use std::path::Path;
use std::sync::Arc;

use crate::io::files::kind_of;
use crate::io::IoError;

/// The bytes of a data file: mapped, or (an empty file, which cannot be mapped) an empty buffer.
#[derive(Debug)]
pub(crate) struct MappedFile {
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    /// Maps `path` read-only. A missing file is [`IoError::NotFound`], a FIFO/device/socket
    /// [`IoError::NotRegularFile`] (nothing is read from it).
    pub fn open(path: &Path, what: &'static str) -> Result<Arc<MappedFile>, IoError> {
        let read_err = crate::io::files::read_error(path, what);
        let meta = std::fs::metadata(path).map_err(read_err)?;
        if !meta.is_file() {
            return Err(IoError::NotRegularFile {
                path: path.to_path_buf(),
                kind: kind_of(&meta),
                what,
            });
        }
        let file = std::fs::File::open(path).map_err(read_err)?;
        let map = if meta.len() == 0 {
            None
        } else {
            // SAFETY: a read-only, private mapping of a regular file. Rust's aliasing rules hold
            // as long as nobody else changes the file while it is mapped; if someone truncates or
            // rewrites it in place during a run, reads see the change or fault (SIGBUS). dmc
            // never writes a file in place (it writes a new one and renames it over), and the
            // docs tell users not to modify a data file during a run (as with numpy's mmap_mode).
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(read_err)?)
        };
        Ok(Arc::new(MappedFile { map }))
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// How the values of a mapped column are stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Little-endian f32.
    F32,
    /// Unsigned bytes (image pixels), multiplied by the column's scale.
    U8,
}

impl Stored {
    fn size(self) -> usize {
        match self {
            Stored::F32 => 4,
            Stored::U8 => 1,
        }
    }
}

/// An f32 input column whose values lie in a mapped file.
#[derive(Debug, Clone)]
pub(crate) struct Mapped {
    pub file: Arc<MappedFile>,
    /// Byte offset of stored sample 0.
    pub offset: usize,
    pub stored: Stored,
    /// Each value is multiplied by it (1 unless `--scale` says otherwise).
    pub scale: f32,
    pub sample_len: usize,
    /// Stored samples in the file.
    pub stored_samples: usize,
    /// Sample `i` of the column is stored sample `rows[i]` (a subset or split); `None`: the file's.
    pub rows: Option<Arc<[usize]>>,
}

impl PartialEq for Mapped {
    fn eq(&self, o: &Mapped) -> bool {
        Arc::ptr_eq(&self.file, &o.file)
            && (
                self.offset,
                self.stored,
                self.sample_len,
                self.stored_samples,
            ) == (o.offset, o.stored, o.sample_len, o.stored_samples)
            && self.scale.to_bits() == o.scale.to_bits()
            && self.rows == o.rows
    }
}

impl Mapped {
    /// The stored bytes of sample `i` of the column.
    fn sample_bytes(&self, i: usize) -> &[u8] {
        let row = self.rows.as_ref().map_or(i, |r| r[i]);
        let n = self.sample_len * self.stored.size();
        let start = self.offset + row * n;
        &self.file.bytes()[start..start + n]
    }

    /// Decodes sample `i` into `out` (`sample_len` values).
    fn decode(&self, i: usize, out: &mut [f32]) {
        let b = self.sample_bytes(i);
        match self.stored {
            Stored::F32 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * self.scale;
                }
            }
            Stored::U8 => {
                for (o, &v) in out.iter_mut().zip(b) {
                    *o = f32::from(v) * self.scale;
                }
            }
        }
    }

    /// Samples in the column.
    pub fn len(&self) -> usize {
        self.rows.as_ref().map_or(self.stored_samples, |r| r.len())
    }

    /// Decodes the samples `indices` into `out` (`indices.len() * sample_len`, checked by the
    /// caller, as the indices are).
    pub fn fill(&self, indices: &[usize], out: &mut [f32]) {
        for (dst, &i) in out.chunks_exact_mut(self.sample_len.max(1)).zip(indices) {
            self.decode(i, dst);
        }
    }

    /// Every value, decoded (a copy).
    pub fn to_vec(&self) -> Vec<f32> {
        let mut v = vec![0f32; self.len() * self.sample_len];
        for (i, dst) in v.chunks_exact_mut(self.sample_len.max(1)).enumerate() {
            self.decode(i, dst);
        }
        v
    }

    /// The samples `indices` of this column, still in the file (only the index is new).
    pub fn subset(&self, indices: &[usize]) -> Mapped {
        let rows: Vec<usize> = indices
            .iter()
            .map(|&i| self.rows.as_ref().map_or(i, |r| r[i]))
            .collect();
        Mapped {
            rows: Some(rows.into()),
            ..self.clone()
        }
    }

    /// The first value that is not finite once decoded: `(flat index, value)`.
    pub fn first_non_finite(&self) -> Option<(usize, f32)> {
        let mut buf = vec![0f32; self.sample_len];
        for i in 0..self.len() {
            self.decode(i, &mut buf);
            if let Some((k, x)) = buf.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Some((i * self.sample_len + k, *x));
            }
        }
        None
    }

    /// Bytes of host memory this column holds besides the mapped file (its row index).
    pub fn index_bytes(&self) -> usize {
        self.rows
            .as_ref()
            .map_or(0, |r| r.len() * std::mem::size_of::<usize>())
    }
}
