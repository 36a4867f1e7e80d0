//! `.npy` and `.npz` bytes as numpy writes them, built here independently of the reader under
//! test: magic, version 1.0, a header dict padded with spaces to 64 bytes and ending in '\n',
//! then the raw data; an `.npz` is a zip archive of `<name>.npy` members.

#![allow(dead_code)] // each test file uses a part

use std::io::Write;

/// A `.npy` file of dtype `descr` (e.g. `<f4`, `|u1`, `>f4`), C order.
pub fn encode_npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    encode_npy_order(descr, false, shape, data)
}

/// A `.npy` file; `fortran` says the data is in column-major order.
pub fn encode_npy_order(descr: &str, fortran: bool, shape: &[usize], data: &[u8]) -> Vec<u8> {
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
    let order = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape_txt}, }}");
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    while 10 + header.len() + 1 < total {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// A `.npz` archive of `(array name, .npy bytes)`: stored (`numpy.savez`) or deflated
/// (`numpy.savez_compressed`).
pub fn encode_npz(members: &[(&str, Vec<u8>)], compressed: bool) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let method = if compressed {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in members {
        zip.start_file(format!("{name}.npy"), opts)
            .expect("zip member");
        zip.write_all(bytes).expect("zip write");
    }
    zip.finish().expect("zip finish").into_inner()
}

pub fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn i32b(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The names in `dir`, sorted (to see which files a write left behind).
pub fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
