//! Writing predictions (or any single tensor): `.safetensors` or `.npy` chosen by the extension,
//! atomically (temp file in the same directory, fsync, rename).

use std::borrow::Cow;
use std::path::Path;

use safetensors::Dtype;

use super::weights::{f32_bytes, write_safetensors, RawView};
use super::{npy, IoError};

pub(crate) enum Format {
    Safetensors,
    Npy,
}

pub(crate) fn format_of(path: &Path) -> Result<Format, IoError> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("safetensors") => Ok(Format::Safetensors),
        Some("npy") => Ok(Format::Npy),
        _ => Err(IoError::UnsupportedFormat {
            path: path.to_path_buf(),
            expected: "name the output file *.safetensors or *.npy",
        }),
    }
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

/// Writes one f32 tensor to `path`: a `.safetensors` file holding one tensor named `name`, or a
/// `.npy` file (which has no names), chosen by the extension.
pub fn write_tensor(path: &Path, name: &str, shape: &[usize], data: &[f32]) -> Result<(), IoError> {
    check_len(name, shape, data.len())?;
    if let Format::Npy = format_of(path)? {
        return npy::write_npy_f32(path, shape, data);
    }
    write_safetensors_one(path, name, shape, Dtype::F32, f32_bytes(data))
}

/// Writes one i32 tensor (e.g. predicted class indices), like [`write_tensor`].
pub fn write_tensor_i32(
    path: &Path,
    name: &str,
    shape: &[usize],
    data: &[i32],
) -> Result<(), IoError> {
    check_len(name, shape, data.len())?;
    if let Format::Npy = format_of(path)? {
        return npy::write_npy_i32(path, shape, data);
    }
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_safetensors_one(path, name, shape, Dtype::I32, bytes)
}

fn write_safetensors_one(
    path: &Path,
    name: &str,
    shape: &[usize],
    dtype: Dtype,
    bytes: Vec<u8>,
) -> Result<(), IoError> {
    write_safetensors(
        path,
        &[(
            name.to_string(),
            RawView {
                dtype,
                shape: shape.to_vec(),
                bytes: Cow::Owned(bytes),
            },
        )],
    )
}
