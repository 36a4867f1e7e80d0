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
    let bytes = f32_bytes(data);
    write_bytes(path, name, shape, Dtype::F32, "<f4", bytes)
}

/// Writes one i32 tensor (e.g. predicted class indices), like [`write_tensor`].
pub fn write_tensor_i32(
    path: &Path,
    name: &str,
    shape: &[usize],
    data: &[i32],
) -> Result<(), IoError> {
    check_len(name, shape, data.len())?;
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_bytes(path, name, shape, Dtype::I32, "<i4", bytes)
}

fn write_bytes(
    path: &Path,
    name: &str,
    shape: &[usize],
    dtype: Dtype,
    descr: &str,
    bytes: Vec<u8>,
) -> Result<(), IoError> {
    match format_of(path)? {
        Format::Npy => npy::write_npy_bytes(path, descr, shape, &bytes),
        Format::Safetensors => write_safetensors(
            path,
            &[(
                name.to_string(),
                RawView {
                    dtype,
                    shape: shape.to_vec(),
                    bytes: Cow::Owned(bytes),
                },
            )],
        ),
    }
}
