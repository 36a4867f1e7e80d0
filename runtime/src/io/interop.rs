//! Tensor layouts of other frameworks and their conversion to and from dmc's: the one place that
//! knows that PyTorch stores a convolution's weight OIHW and a `Linear`'s `[out, in]`, and flattens
//! an image channel-first, where dmc (like Keras) uses HWIO, `[in, out]` and height-width-channel.
//! `dmc weights import|export` pick a [`Conversion`] per tensor; the mapping is written up in
//! docs/INTEROP.md.

use std::fmt;

/// How one parameter's layout differs between dmc and the other framework.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// The same layout (biases; every Keras tensor).
    Same,
    /// A convolution weight: PyTorch `[out, in, kh, kw]` (OIHW) <-> dmc `[kh, kw, in, out]` (HWIO).
    ConvOihw,
    /// A dense weight: PyTorch `Linear` `[out, in]` <-> dmc `[in, out]`.
    LinearTranspose,
    /// The dense weight right after a `flatten` of an `[h, w, c]` image: transposed as
    /// [`Conversion::LinearTranspose`], and its input rows reordered from PyTorch's flatten order
    /// (c, h, w) to dmc's (h, w, c).
    LinearFlattenChw { h: usize, w: usize, c: usize },
}

impl fmt::Display for Conversion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conversion::Same => f.write_str("as is"),
            Conversion::ConvOihw => f.write_str("OIHW <-> HWIO"),
            Conversion::LinearTranspose => f.write_str("[out,in] <-> [in,out]"),
            Conversion::LinearFlattenChw { h, w, c } => write!(
                f,
                "[out,in] <-> [in,out], rows C,H,W -> H,W,C (flatten of [{h},{w},{c}])"
            ),
        }
    }
}

/// Why a tensor cannot be converted: its shape does not fit the conversion.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shape {found:?} does not fit the conversion {conversion}")]
pub struct LayoutError {
    pub found: Vec<usize>,
    pub conversion: String,
}

impl Conversion {
    /// The other framework's shape of a dmc tensor of shape `dmc`.
    pub fn foreign_shape(&self, dmc: &[usize]) -> Vec<usize> {
        match (self, dmc) {
            (Conversion::ConvOihw, [kh, kw, i, o]) => vec![*o, *i, *kh, *kw],
            (Conversion::LinearTranspose | Conversion::LinearFlattenChw { .. }, [i, o]) => {
                vec![*o, *i]
            }
            _ => dmc.to_vec(),
        }
    }

    /// A tensor of the other framework (shape `shape`) in dmc's layout: (dmc shape, values).
    pub fn to_dmc(
        &self,
        shape: &[usize],
        data: &[f32],
    ) -> Result<(Vec<usize>, Vec<f32>), LayoutError> {
        let bad = || LayoutError {
            found: shape.to_vec(),
            conversion: self.to_string(),
        };
        if shape.iter().product::<usize>() != data.len() {
            return Err(bad());
        }
        Ok(match (*self, shape) {
            (Conversion::Same, _) => (shape.to_vec(), data.to_vec()),
            (Conversion::ConvOihw, &[o, i, kh, kw]) => (
                vec![kh, kw, i, o],
                permute(&[o, i, kh, kw], &[2, 3, 1, 0], data),
            ),
            (Conversion::LinearTranspose, &[o, i]) => (vec![i, o], permute(&[o, i], &[1, 0], data)),
            (Conversion::LinearFlattenChw { h, w, c }, &[o, i]) if i == h * w * c => {
                // [out, c, h, w] -> [h, w, c, out]
                (vec![i, o], permute(&[o, c, h, w], &[2, 3, 1, 0], data))
            }
            _ => return Err(bad()),
        })
    }

    /// A dmc tensor (shape `shape`) in the other framework's layout: (its shape, values).
    pub fn from_dmc(
        &self,
        shape: &[usize],
        data: &[f32],
    ) -> Result<(Vec<usize>, Vec<f32>), LayoutError> {
        let bad = || LayoutError {
            found: shape.to_vec(),
            conversion: self.to_string(),
        };
        if shape.iter().product::<usize>() != data.len() {
            return Err(bad());
        }
        Ok(match (*self, shape) {
            (Conversion::Same, _) => (shape.to_vec(), data.to_vec()),
            (Conversion::ConvOihw, &[kh, kw, i, o]) => (
                vec![o, i, kh, kw],
                permute(&[kh, kw, i, o], &[3, 2, 0, 1], data),
            ),
            (Conversion::LinearTranspose, &[i, o]) => (vec![o, i], permute(&[i, o], &[1, 0], data)),
            (Conversion::LinearFlattenChw { h, w, c }, &[i, o]) if i == h * w * c => {
                // [h, w, c, out] -> [out, c, h, w]
                (vec![o, i], permute(&[h, w, c, o], &[3, 2, 0, 1], data))
            }
            _ => return Err(bad()),
        })
    }
}

/// Permutes the axes of a row-major tensor of shape `shape`: output axis `k` is input axis
/// `axes[k]` (numpy's `transpose(axes)`).
pub fn permute(shape: &[usize], axes: &[usize], data: &[f32]) -> Vec<f32> {
    let rank = shape.len();
    debug_assert_eq!(axes.len(), rank);
    // Row-major strides of the input, taken in output-axis order.
    let mut in_strides = vec![1usize; rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        in_strides[k] = in_strides[k + 1] * shape[k + 1];
    }
    let out_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let strides: Vec<usize> = axes.iter().map(|&a| in_strides[a]).collect();
    let mut out = Vec::with_capacity(data.len());
    let mut index = vec![0usize; rank];
    for _ in 0..data.len() {
        let src: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out.push(data[src]);
        // Advance the output index, last axis fastest.
        for k in (0..rank).rev() {
            index[k] += 1;
            if index[k] < out_shape[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}
