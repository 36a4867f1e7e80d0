//! A small, careful reader/writer of NumPy's `.npy` format (versions 1.0, 2.0 and 3.0).
//!
//! Reading accepts bool, u8/i8, u16/i16, u32/i32, u64/i64, f16, f32 and f64 in either byte order and
//! either memory order (Fortran-order arrays are transposed to C order, big-endian data is swapped);
//! the result is always little-endian, C-order bytes. Writing produces version 1.0 (2.0 when the
//! header needs it), little-endian, C order, f32 or i32.

use std::io::Write;
use std::path::Path;

use super::{atomic_write, read_file, ElemType, IoError};

const MAGIC: &[u8] = b"\x93NUMPY";

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

/// Reads a `.npy` file.
pub fn read_npy(path: &Path) -> Result<NpyArray, IoError> {
    let bytes = read_file(path, "npy file")?;
    parse_npy(&bytes).map_err(|reason| IoError::Npy {
        path: path.to_path_buf(),
        reason,
    })
}

fn descr_type(descr: &str) -> Result<(ElemType, bool), String> {
    let (order, code) = match descr.as_bytes().first() {
        Some(b'<') | Some(b'=') => (false, &descr[1..]),
        Some(b'|') => (false, &descr[1..]),
        Some(b'>') => (true, &descr[1..]),
        _ => (false, descr),
    };
    let ty = match code {
        "b1" | "?" => ElemType::Bool,
        "u1" => ElemType::U8,
        "i1" => ElemType::I8,
        "u2" => ElemType::U16,
        "i2" => ElemType::I16,
        "u4" => ElemType::U32,
        "i4" => ElemType::I32,
        "u8" => ElemType::U64,
        "i8" => ElemType::I64,
        "f2" => ElemType::F16,
        "f4" => ElemType::F32,
        "f8" => ElemType::F64,
        _ => {
            return Err(format!(
                "unsupported dtype '{descr}' (supported: bool, integers, float16/32/64)"
            ))
        }
    };
    Ok((ty, order && ty.size() > 1))
}

/// Finds `'key':` in a Python dict literal and returns the text after the colon.
fn after_key<'a>(header: &'a str, key: &str) -> Result<&'a str, String> {
    for q in ['\'', '"'] {
        let pat = format!("{q}{key}{q}");
        if let Some(i) = header.find(&pat) {
            let rest = header[i + pat.len()..].trim_start();
            return rest
                .strip_prefix(':')
                .map(str::trim_start)
                .ok_or_else(|| format!("malformed header: no ':' after '{key}'"));
        }
    }
    Err(format!("malformed header: no '{key}' key"))
}

fn parse_header(header: &str) -> Result<(ElemType, bool, bool, Vec<usize>), String> {
    let header = header.trim();
    if !header.starts_with('{') || !header.ends_with('}') {
        return Err("malformed header: not a dictionary".into());
    }
    // descr
    let rest = after_key(header, "descr")?;
    let q = rest
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or("unsupported dtype: structured arrays are not supported (descr is not a string)")?;
    let end = rest[1..]
        .find(q)
        .ok_or("malformed header: unterminated descr")?;
    let (ty, swap) = descr_type(&rest[1..1 + end])?;
    // fortran_order
    let rest = after_key(header, "fortran_order")?;
    let fortran = if rest.starts_with("True") {
        true
    } else if rest.starts_with("False") {
        false
    } else {
        return Err("malformed header: fortran_order is not True/False".into());
    };
    // shape
    let rest = after_key(header, "shape")?;
    let rest = rest
        .strip_prefix('(')
        .ok_or("malformed header: shape is not a tuple")?;
    let end = rest
        .find(')')
        .ok_or("malformed header: unterminated shape")?;
    let mut shape = Vec::new();
    for part in rest[..end].split(',') {
        let part = part.trim().trim_end_matches('L');
        if part.is_empty() {
            continue;
        }
        shape.push(
            part.parse::<usize>()
                .map_err(|_| format!("malformed header: bad dimension '{part}' in shape"))?,
        );
    }
    Ok((ty, swap, fortran, shape))
}

/// Parses the bytes of a `.npy` file. The error is a reason (the caller adds the path).
pub fn parse_npy(bytes: &[u8]) -> Result<NpyArray, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(if bytes.len() < 10 {
            format!("file is only {} bytes (truncated?)", bytes.len())
        } else {
            "missing the \\x93NUMPY magic (not an .npy file?)".into()
        });
    }
    let major = bytes[6];
    let (hlen, hstart): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated header".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("unsupported format version {v}")),
    };
    let hend = hstart
        .checked_add(hlen)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| {
            format!(
                "header says it is {hlen} bytes but the file has only {} (truncated?)",
                bytes.len()
            )
        })?;
    let header = std::str::from_utf8(&bytes[hstart..hend])
        .map_err(|_| "header is not text (corrupt?)".to_string())?;
    let (dtype, swap, fortran, shape) = parse_header(header)?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("shape overflows")?;
    let need = count.checked_mul(dtype.size()).ok_or("shape overflows")?;
    let have = bytes.len() - hend;
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
    let mut data = bytes[hend..].to_vec();
    let size = dtype.size();
    if swap {
        for c in data.chunks_exact_mut(size) {
            c.reverse();
        }
    }
    if fortran && shape.len() > 1 {
        data = fortran_to_c(&data, &shape, size);
    }
    Ok(NpyArray { shape, dtype, data })
}

/// Reorders Fortran-order element bytes into C order.
fn fortran_to_c(data: &[u8], shape: &[usize], size: usize) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(data.len());
    // Fortran strides (in elements).
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

/// Encodes a little-endian C-order `.npy` file.
pub fn encode_npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let shape_txt = match shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Pad so that magic + version + length + header (ending in '\n') is a multiple of 64.
    let v1 = header.len() + 1 + 10 <= u16::MAX as usize;
    let prefix = if v1 { 10 } else { 12 };
    let total = (prefix + header.len() + 1).div_ceil(64) * 64;
    while prefix + header.len() + 1 < total {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(total + data.len());
    out.extend_from_slice(MAGIC);
    if v1 {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
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

pub(crate) fn write_npy_bytes(
    path: &Path,
    descr: &str,
    shape: &[usize],
    data: &[u8],
) -> Result<(), IoError> {
    let bytes = encode_npy(descr, shape, data);
    atomic_write(path, |w| w.write_all(&bytes))
}

/// Writes an f32 array as `.npy` (atomically: temp file, fsync, rename).
pub fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), IoError> {
    check_len(&path.display().to_string(), shape, data.len())?;
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy_bytes(path, "<f4", shape, &bytes)
}

/// Writes an i32 array as `.npy` (atomically: temp file, fsync, rename).
pub fn write_npy_i32(path: &Path, shape: &[usize], data: &[i32]) -> Result<(), IoError> {
    check_len(&path.display().to_string(), shape, data.len())?;
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy_bytes(path, "<i4", shape, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_parses() {
        for shape in [vec![], vec![3], vec![2, 3], vec![4, 1, 2, 2]] {
            let n: usize = shape.iter().product();
            let data: Vec<u8> = (0..n as i32).flat_map(|v| v.to_le_bytes()).collect();
            let bytes = encode_npy("<i4", &shape, &data);
            let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + hlen) % 64, 0);
            let arr = parse_npy(&bytes).unwrap();
            assert_eq!(arr.shape, shape);
            assert_eq!(arr.to_i32().unwrap(), (0..n as i32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn numpy_written_header_variants() {
        // As numpy writes it, with big-endian f4 and Fortran order.
        let h = "{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3), }";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
        bytes.extend_from_slice(h.as_bytes());
        // Fortran order of [[0,1,2],[3,4,5]]: 0,3,1,4,2,5
        for v in [0f32, 3., 1., 4., 2., 5.] {
            bytes.extend_from_slice(&v.to_be_bytes());
        }
        let arr = parse_npy(&bytes).unwrap();
        assert_eq!(arr.shape, vec![2, 3]);
        assert_eq!(arr.to_f32().unwrap(), vec![0., 1., 2., 3., 4., 5.]);
    }

    #[test]
    fn bad_inputs() {
        assert!(parse_npy(b"garbage").is_err());
        assert!(parse_npy(b"not an npy file at all")
            .unwrap_err()
            .contains("magic"));
        let h = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(h.len() as u16).to_le_bytes());
        bytes.extend_from_slice(h.as_bytes());
        assert!(parse_npy(&bytes).unwrap_err().contains("structured"));
    }
}
