//! Kernel tests of the transposed convolution (`conv_transpose2d`, PyTorch's `ConvTranspose2d`):
//! the forward against its definition written here as plain scatter loops in f64 (every input
//! pixel adds `x * w` to the output pixels its kernel taps reach), the shape rule against
//! PyTorch's output-size formula, and the kernels of its VJP (a convolution forward for dx, the
//! convolution weight gradient with the roles swapped for dw, the column sum for db) against
//! central finite differences of the forward.

use crate::common;

use common::*;
use dmc_plan::op::{conv_workspace_elems, ConvGeom, ConvOp, Op, TensorType};
use dmc_runtime::cpu::conv::{conv2d_bwd_weight, conv2d_fwd, conv_transpose2d, ConvDims};
use dmc_runtime::cpu::optim::bias_grad;

/// One transposed convolution: x [n, h, w, ci], `co` outputs, the geometry of the convolution it
/// transposes and PyTorch's `output_padding`.
#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    h: usize,
    w: usize,
    ci: usize,
    co: usize,
    g: ConvGeom,
    op: (usize, usize),
}

impl Case {
    /// PyTorch's formula: (in - 1)*stride - pad_before - pad_after + dil*(k - 1) + output_padding + 1.
    fn out(&self) -> (usize, usize) {
        let g = &self.g;
        let ho = (self.h - 1) * g.stride_h + g.dil_h * (g.kh - 1) + self.op.0 + 1
            - g.pad_top
            - g.pad_bottom;
        let wo = (self.w - 1) * g.stride_w + g.dil_w * (g.kw - 1) + self.op.1 + 1
            - g.pad_left
            - g.pad_right;
        (ho, wo)
    }
    fn x_shape(&self) -> Vec<usize> {
        vec![self.n, self.h, self.w, self.ci]
    }
    fn y_shape(&self) -> Vec<usize> {
        let (ho, wo) = self.out();
        vec![self.n, ho, wo, self.co]
    }
    fn w_shape(&self) -> Vec<usize> {
        vec![self.g.kh, self.g.kw, self.co / self.g.groups, self.ci]
    }
    fn len(s: &[usize]) -> usize {
        s.iter().product()
    }
}

/// The definition, f64: x[n, iy, ix, ci] (group ci / (ci/groups)) times w[ky, kx, c, ci] added to
/// y[n, iy*sh - pt + ky*dh, ix*sw - pl + kx*dw, group*(co/groups) + c] where that is inside y.
fn transpose_direct(c: &Case, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
    let g = &c.g;
    let (ho, wo) = c.out();
    let (cig, cog) = (c.ci / g.groups, c.co / g.groups);
    let mut y = vec![0f64; Case::len(&c.y_shape())];
    for n in 0..c.n {
        for iy in 0..c.h {
            for ix in 0..c.w {
                for ci in 0..c.ci {
                    let grp = ci / cig;
                    let xv = x[((n * c.h + iy) * c.w + ix) * c.ci + ci] as f64;
                    for ky in 0..g.kh {
                        for kx in 0..g.kw {
                            let oy = (iy * g.stride_h + ky * g.dil_h) as i64 - g.pad_top as i64;
                            let ox = (ix * g.stride_w + kx * g.dil_w) as i64 - g.pad_left as i64;
                            if oy < 0 || ox < 0 || oy >= ho as i64 || ox >= wo as i64 {
                                continue;
                            }
                            for cl in 0..cog {
                                let co = grp * cog + cl;
                                let wv = w[((ky * g.kw + kx) * cog + cl) * c.ci + ci] as f64;
                                y[((n * ho + oy as usize) * wo + ox as usize) * c.co + co] +=
                                    xv * wv;
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(b) = b {
        for px in y.chunks_exact_mut(c.co) {
            for (o, bv) in px.iter_mut().zip(b) {
                *o += *bv as f64;
            }
        }
    }
    y
}

fn run(c: &Case, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![f32::NAN; Case::len(&c.y_shape())];
    conv_transpose2d(&c.g, &c.x_shape(), &c.y_shape(), (x, w, b), &mut y);
    y
}

fn geom(k: (usize, usize), s: (usize, usize), pads: [usize; 4], d: (usize, usize)) -> ConvGeom {
    ConvGeom {
        kh: k.0,
        kw: k.1,
        stride_h: s.0,
        stride_w: s.1,
        pad_top: pads[0],
        pad_bottom: pads[1],
        pad_left: pads[2],
        pad_right: pads[3],
        dil_h: d.0,
        dil_w: d.1,
        groups: 1,
    }
}

fn cases() -> Vec<Case> {
    let c = |n, h, w, ci, co, g, op| Case {
        n,
        h,
        w,
        ci,
        co,
        g,
        op,
    };
    vec![
        // the UNet / DCGAN upsampler: 2x2 stride 2 (exact doubling), and 4x4/2 padding 1
        c(2, 3, 4, 3, 5, geom((2, 2), (2, 2), [0; 4], (1, 1)), (0, 0)),
        c(1, 4, 3, 4, 2, geom((4, 4), (2, 2), [1; 4], (1, 1)), (0, 0)),
        // 3x3/2 padding 1 with output padding 1 (the exact inverse of a ResNet downsampling)
        c(2, 4, 5, 3, 4, geom((3, 3), (2, 2), [1; 4], (1, 1)), (1, 1)),
        // Keras' `padding="same"` for 3x5/2: (0, 1) rows and (1, 2) columns off (output 2h x 2w)
        c(
            1,
            3,
            4,
            2,
            3,
            geom((3, 5), (2, 2), [0, 1, 1, 2], (1, 1)),
            (0, 0),
        ),
        // stride 1 padding 1 (a plain "same" convolution transposed), output padding per axis
        c(1, 5, 4, 2, 3, geom((3, 3), (1, 1), [1; 4], (1, 1)), (0, 0)),
        c(
            2,
            3,
            4,
            2,
            3,
            geom((3, 2), (3, 2), [1, 1, 0, 0], (1, 1)),
            (2, 1),
        ),
        // non-square kernel and stride, padding per side, dilation
        c(
            1,
            4,
            5,
            3,
            2,
            geom((3, 2), (2, 1), [2, 1, 0, 1], (2, 1)),
            (1, 0),
        ),
        // groups: two, and depthwise (one group per input channel, two outputs each)
        c(
            2,
            4,
            3,
            4,
            6,
            ConvGeom {
                groups: 2,
                ..geom((3, 3), (2, 2), [1; 4], (1, 1))
            },
            (1, 0),
        ),
        c(
            1,
            3,
            3,
            3,
            6,
            ConvGeom {
                groups: 3,
                ..geom((2, 2), (2, 2), [0; 4], (1, 1))
            },
            (1, 1),
        ),
    ]
}

#[test]
fn the_shape_rule_is_pytorchs_output_size() {
    for c in cases() {
        let op = Op::Conv(ConvOp::ConvTranspose2d {
            geom: c.g,
            out_pad: c.op,
            bias: true,
        });
        let ins = [
            TensorType::f32(c.x_shape()),
            TensorType::f32(c.w_shape()),
            TensorType::f32(vec![c.co]),
        ];
        let out = op.infer_outputs(&ins, None).expect("shape rule");
        assert_eq!(out[0].shape, c.y_shape(), "{c:?}");
    }
    // an output padding not below its stride, and padding that leaves no output, are errors
    let bad = |g: ConvGeom, op: (usize, usize), x: Vec<usize>, w: Vec<usize>| {
        Op::Conv(ConvOp::ConvTranspose2d {
            geom: g,
            out_pad: op,
            bias: false,
        })
        .infer_outputs(&[TensorType::f32(x), TensorType::f32(w)], None)
        .is_err()
    };
    let g = geom((3, 3), (2, 2), [1; 4], (1, 1));
    assert!(bad(g, (2, 0), vec![1, 4, 4, 2], vec![3, 3, 5, 2]));
    assert!(!bad(g, (1, 0), vec![1, 4, 4, 2], vec![3, 3, 5, 2]));
    let g = geom((1, 1), (1, 1), [1; 4], (1, 1));
    assert!(bad(g, (0, 0), vec![1, 1, 1, 2], vec![1, 1, 5, 2]));
    // a weight of the wrong layout (PyTorch's [in, out, kh, kw] unconverted)
    let g = geom((3, 3), (2, 2), [1; 4], (1, 1));
    assert!(bad(g, (0, 0), vec![1, 4, 4, 2], vec![2, 5, 3, 3]));
}

#[test]
fn forward_matches_the_definition() {
    let mut r = rng(31);
    for (i, c) in cases().into_iter().enumerate() {
        let x = randv(&mut r, Case::len(&c.x_shape()));
        let w = randv(&mut r, Case::len(&c.w_shape()));
        let b = randv(&mut r, c.co);
        let want = transpose_direct(&c, &x, &w, Some(&b));
        assert_close(
            &format!("y case {i} {c:?}"),
            &run(&c, &x, &w, Some(&b)),
            &want,
            1e-5,
            1e-5,
        );
        let want = transpose_direct(&c, &x, &w, None);
        assert_close(
            &format!("y no bias case {i}"),
            &run(&c, &x, &w, None),
            &want,
            1e-5,
            1e-5,
        );
    }
}

#[test]
fn the_vjp_kernels_match_finite_differences() {
    let mut r = rng(32);
    for (i, c) in cases().into_iter().enumerate() {
        let (xs, ys) = (c.x_shape(), c.y_shape());
        let x = randv(&mut r, Case::len(&xs));
        let w = randv(&mut r, Case::len(&c.w_shape()));
        let b = randv(&mut r, c.co);
        // L = <r, y>: dy = r
        let dy = randv(&mut r, Case::len(&ys));
        // the convolution the op transposes: from y's shape to x's
        let d = ConvDims::from_shapes(&ys, &xs);
        let mut cols = vec![f32::NAN; conv_workspace_elems(&c.g, &ys, &xs)];
        let mut dx = vec![f32::NAN; x.len()];
        conv2d_fwd(&c.g, &d, &dy, &w, None, &mut dx, &mut cols);
        let mut dw = vec![f32::NAN; w.len()];
        conv2d_bwd_weight(&c.g, &d, &dy, &x, &mut dw, &mut cols);
        let mut db = vec![f32::NAN; c.co];
        bias_grad(&dy, &mut db);
        fd_check(&format!("dx case {i} {c:?}"), &x, &dx, 80, |x| {
            dot(&run(&c, x, &w, Some(&b)), &dy)
        });
        fd_check(&format!("dw case {i} {c:?}"), &w, &dw, 80, |w| {
            dot(&run(&c, &x, w, Some(&b)), &dy)
        });
        fd_check(&format!("db case {i}"), &b, &db, 80, |b| {
            dot(&run(&c, &x, &w, Some(b)), &dy)
        });
    }
}

#[test]
fn the_transpose_test_can_fail() {
    // the same check catches a weight read as the forward convolution's (in and out swapped)
    let c = cases()[2];
    let mut r = rng(33);
    let x = randv(&mut r, Case::len(&c.x_shape()));
    let w = randv(&mut r, Case::len(&c.w_shape()));
    let want = transpose_direct(&c, &x, &w, None);
    let got = run(&c, &x, &w, None);
    let mut flipped = w.clone();
    flipped.reverse();
    let wrong = run(&c, &x, &flipped, None);
    let err = |v: &[f32]| {
        v.iter()
            .zip(&want)
            .map(|(&a, &b)| (a as f64 - b).abs())
            .fold(0.0, f64::max)
    };
    assert!(err(&got) < 1e-5, "{}", err(&got));
    assert!(err(&wrong) > 1e-2, "{}", err(&wrong));
}
