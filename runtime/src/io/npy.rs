//! NumPy's `.npy` format through the `npyz` crate: the header (versions 1.0, 2.0 and 3.0, any
//! dtype string numpy writes) is parsed by `npyz`; this module maps its dtype to an [`ElemType`],
//! checks the data length, and writes f32/i32 arrays with `npyz`'s writer (version 1.0, header
//! padded to 64 bytes as numpy pads it, little-endian, C order).
//!
//! Reading accepts bool, u8/i8, u16/i16, u32/i32, u64/i64, f16, f32 and f64 in either byte order
//! and either memory order. `NpyLayout` describes the data in place (for a memory-mapped file:
//! no copy); [`parse_npy`]/[`read_npy`] return an owned copy in little-endian C order (Fortran-order
//! arrays transposed, big-endian data swapped).

use std::path::Path;

use npyz::{Endianness, Order, TypeChar};

use super::{atomic_write, read_file, ElemType, IoError};

/// A decoded `.npy` array: little-endian, C-order element bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub dtype: ElemType,
    pub data: Vec<u8>,
}

impl NpyArray {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32 if the array holds floats.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        super::decode_f32(self.dtype, &self.data)
    }

    /// The values as i32 if the array holds i32.
    pub fn to_i32(&self) -> Option<Vec<i32>> {
        (self.dtype == ElemType::I32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }
}

/// Where and how the data of a `.npy` file lies in its bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NpyLayout {
    pub shape: Vec<usize>,
    pub dtype: ElemType,
    /// Offset of the first data byte (after the header).
    pub data_start: usize,
    /// Big-endian multi-byte elements.
    pub swap: bool,
    /// Fortran (column-major) order with more than one dimension.
    pub fortran: bool,
}

impl NpyLayout {
    /// Whether the data bytes are already little-endian C order (usable in place).
    pub fn in_place(&self) -> bool {
        !self.swap && !self.fortran
    }
}

/// Reads a `.npy` file (an owned copy; see `NpyLayout` for the in-place view).
pub fn read_npy(path: &Path) -> Result<NpyArray, IoError> {
    let bytes = read_file(path, "npy file")?;
    parse_npy(&bytes).map_err(|reason| IoError::Npy {
        path: path.to_path_buf(),
        reason,
    })
}

fn elem_type(t: &npyz::TypeStr) -> Result<(ElemType, bool), String> {
    let size = t.size_field();
    let ty = match (t.type_char(), size) {
        (TypeChar::Bool, 1) => ElemType::Bool,
        (TypeChar::Uint, 1) => ElemType::U8,
        (TypeChar::Int, 1) => ElemType::I8,
        (TypeChar::Uint, 2) => ElemType::U16,
        (TypeChar::Int, 2) => ElemType::I16,
        (TypeChar::Uint, 4) => ElemType::U32,
        (TypeChar::Int, 4) => ElemType::I32,
        (TypeChar::Uint, 8) => ElemType::U64,
        (TypeChar::Int, 8) => ElemType::I64,
        (TypeChar::Float, 2) => ElemType::F16,
        (TypeChar::Float, 4) => ElemType::F32,
        (TypeChar::Float, 8) => ElemType::F64,
        _ => {
            return Err(format!(
                "unsupported dtype '{t}' (supported: bool, integers, float16/32/64)"
            ))
        }
    };
    Ok((ty, t.endianness() == Endianness::Big && ty.size() > 1))
}

/// The header text of `.npy` bytes: `(start, end)` offsets, when its length field fits the bytes.
fn header_span(bytes: &[u8]) -> Option<(usize, usize)> {
    let (hlen, hstart): (usize, usize) = match bytes.get(6)? {
        1 => (
            u16::from_le_bytes([*bytes.get(8)?, *bytes.get(9)?]) as usize,
            10,
        ),
        _ => (
            u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize,
            12,
        ),
    };
    let end = hstart.checked_add(hlen).filter(|&e| e <= bytes.len())?;
    Some((hstart, end))
}

/// The byte range of the shape tuple's contents in the header (between its parentheses).
fn shape_span(bytes: &[u8], (hstart, end): (usize, usize)) -> Option<(usize, usize)> {
    let text = std::str::from_utf8(&bytes[hstart..end]).ok()?;
    let key = text.find("'shape'").or_else(|| text.find("\"shape\""))?;
    let open = key + text[key..].find('(')?;
    let close = open + text[open..].find(')')?;
    Some((hstart + open + 1, hstart + close))
}

/// Whether the dimensions of the shape tuple multiply past `u64` (npyz multiplies them unchecked,
/// which panics in a debug build): refused before npyz sees them.
fn shape_overflows(bytes: &[u8]) -> bool {
    let Some((a, b)) = header_span(bytes).and_then(|h| shape_span(bytes, h)) else {
        return false;
    };
    let text = String::from_utf8_lossy(&bytes[a..b]);
    let mut product: u64 = 1;
    for part in text.split(',') {
        let digits = part.trim().trim_end_matches('L').trim();
        if digits.is_empty() {
            continue;
        }
        match digits.parse::<u64>() {
            // npyz's strides multiply every dimension but one, zeros last or not: nonzero ones
            // must fit together.
            Ok(0) => {}
            Ok(d) => match product.checked_mul(d) {
                Some(p) => product = p,
                None => return true,
            },
            // Larger than u64, or not a number: npyz refuses it with a message.
            Err(_) => return false,
        }
    }
    false
}

/// Files written by Python 2's numpy give dimensions as longs, `(2L, 3L)`, which `npyz` does not
/// parse: a copy of the magic and header with those `L`s blanked (same length, so the data offset
/// is unchanged), or `None` when there are none.
fn py2_shape(bytes: &[u8]) -> Option<Vec<u8>> {
    let span = header_span(bytes)?;
    let (a, b) = shape_span(bytes, span)?;
    let mut head = bytes[..span.1].to_vec();
    let mut changed = false;
    for i in a.max(1)..b {
        if head[i] == b'L' && head[i - 1].is_ascii_digit() {
            head[i] = b' ';
            changed = true;
        }
    }
    changed.then_some(head)
}

/// Parses the header of `.npy` bytes and checks that the data that follows has exactly the size
/// the header says. The error is a reason (the caller adds the path).
pub(crate) fn layout(bytes: &[u8]) -> Result<NpyLayout, String> {
    if bytes.len() < 10 {
        return Err(format!("file is only {} bytes (truncated?)", bytes.len()));
    }
    if &bytes[..6] != b"\x93NUMPY" {
        return Err("missing the \\x93NUMPY magic (not an .npy file?)".into());
    }
    if shape_overflows(bytes) {
        return Err("shape overflows".into());
    }
    let prefix = py2_shape(bytes);
    let mut rest: &[u8] = prefix.as_deref().unwrap_or(bytes);
    let header = npyz::NpyHeader::from_reader(&mut rest).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "the header is truncated".to_string()
        } else {
            format!("malformed header: {e}")
        }
    })?;
    let data_start = prefix.as_ref().map_or(bytes.len(), Vec::len) - rest.len();
    let rest = &bytes[data_start..];
    let (dtype, swap) =
        match header.dtype() {
            npyz::DType::Plain(t) => elem_type(&t)?,
            npyz::DType::Array(..) | npyz::DType::Record(_) => return Err(
                "unsupported dtype: structured arrays are not supported (descr is not a string)"
                    .into(),
            ),
        };
    let shape = header
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| "shape overflows".to_string()))
        .collect::<Result<Vec<usize>, String>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("shape overflows")?;
    let need = count.checked_mul(dtype.size()).ok_or("shape overflows")?;
    let have = rest.len();
    if have != need {
        return Err(format!(
            "shape {:?} of {} needs {need} data bytes but the file has {have} ({})",
            shape,
            dtype.name(),
            if have < need {
                "truncated"
            } else {
                "trailing garbage"
            }
        ));
    }
    let fortran = header.order() == Order::Fortran && shape.len() > 1;
    Ok(NpyLayout {
        shape,
        dtype,
        data_start,
        swap,
        fortran,
    })
}

/// The data of `bytes` (laid out as `l` says) as little-endian C-order bytes: borrowed when it
/// already is, else a converted copy.
pub(crate) fn data_le_c<'a>(bytes: &'a [u8], l: &NpyLayout) -> std::borrow::Cow<'a, [u8]> {
    let raw = &bytes[l.data_start..];
    if l.in_place() {
        return std::borrow::Cow::Borrowed(raw);
    }
    let size = l.dtype.size();
    let mut data = raw.to_vec();
    if l.swap {
        for c in data.chunks_exact_mut(size) {
            c.reverse();
        }
    }
    if l.fortran {
        data = fortran_to_c(&data, &l.shape, size);
    }
    std::borrow::Cow::Owned(data)
}

/// Parses the bytes of a `.npy` file into an owned array. The error is a reason (the caller adds
/// the path).
pub fn parse_npy(bytes: &[u8]) -> Result<NpyArray, String> {
    let l = layout(bytes)?;
    let data = data_le_c(bytes, &l).into_owned();
    Ok(NpyArray {
        shape: l.shape,
        dtype: l.dtype,
        data,
    })
}

/// Reorders Fortran-order element bytes into C order (npyz reads elements in file order and
/// leaves the axes to the caller).
fn fortran_to_c(data: &[u8], shape: &[usize], size: usize) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(data.len());
    let mut fstride = vec![1usize; shape.len()];
    for k in 1..shape.len() {
        fstride[k] = fstride[k - 1] * shape[k - 1];
    }
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        let off: usize = idx.iter().zip(&fstride).map(|(i, s)| i * s).sum();
        out.extend_from_slice(&data[off * size..(off + 1) * size]);
        // Increment the C-order index (last dimension fastest).
        for k in (0..shape.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    out
}

fn check_len(name: &str, shape: &[usize], len: usize) -> Result<(), IoError> {
    if shape.iter().product::<usize>() != len {
        return Err(IoError::LengthMismatch {
            name: name.to_string(),
            shape: shape.to_vec(),
            len,
        });
    }
    Ok(())
}

/// Writes `values` as a `.npy` file of `shape` with npyz's writer, atomically.
fn write_values<T: npyz::AutoSerialize + Copy>(
    path: &Path,
    shape: &[usize],
    values: &[T],
) -> Result<(), IoError> {
    check_len(&path.display().to_string(), shape, values.len())?;
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    atomic_write(path, |w| {
        use npyz::WriterBuilder;
        let mut out = npyz::WriteOptions::<T>::new()
            .default_dtype()
            .shape(&shape)
            .writer(&mut *w)
            .begin_nd()?;
        out.extend(values.iter().copied())?;
        out.finish()
    })
}

/// Writes an f32 array as `.npy` (atomically: temp file, fsync, rename).
pub fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), IoError> {
    write_values(path, shape, data)
}

/// Writes an i32 array as `.npy` (atomically: temp file, fsync, rename).
pub fn write_npy_i32(path: &Path, shape: &[usize], data: &[i32]) -> Result<(), IoError> {
    write_values(path, shape, data)
}
