//! Kernel tests of the general convolution and pooling geometries: non-square kernels, a stride
//! per axis, padding per side, dilation and groups (depthwise included) for the convolutions;
//! padding for max / average pooling; global max pooling. Forwards against naive references
//! written here from the definitions (plain nested loops in f64), backwards against central finite
//! differences of the forward kernels (`common::fd_check`).

use crate::common;

use common::*;
use dmc_plan::op::{conv_workspace_elems, ConvGeom, PoolGeom};
use dmc_runtime::cpu::conv::{
    conv2d_bwd_data, conv2d_bwd_weight, conv2d_bwd_weight_chunked, conv2d_fwd, ConvDims,
};
use dmc_runtime::cpu::pool::{
    avgpool_bwd, avgpool_fwd, global_maxpool_bwd, global_maxpool_fwd, maxpool_bwd, maxpool_fwd,
    PoolDims,
};
use rand::Rng;

/// One convolution: x [n, h, w, ci], `co` outputs, and its geometry.
#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    h: usize,
    w: usize,
    ci: usize,
    co: usize,
    g: ConvGeom,
}

impl Case {
    /// The output extents from the definition: (in + pads - dil*(k-1) - 1) / stride + 1.
    fn out(&self) -> (usize, usize) {
        let g = &self.g;
        let ho = (self.h + g.pad_top + g.pad_bottom - g.dil_h * (g.kh - 1) - 1) / g.stride_h + 1;
        let wo = (self.w + g.pad_left + g.pad_right - g.dil_w * (g.kw - 1) - 1) / g.stride_w + 1;
        (ho, wo)
    }
    fn dims(&self) -> ConvDims {
        let (ho, wo) = self.out();
        ConvDims {
            n: self.n,
            h: self.h,
            w: self.w,
            ci: self.ci,
            ho,
            wo,
            co: self.co,
        }
    }
    fn x_shape(&self) -> Vec<usize> {
        vec![self.n, self.h, self.w, self.ci]
    }
    fn y_shape(&self) -> Vec<usize> {
        let (ho, wo) = self.out();
        vec![self.n, ho, wo, self.co]
    }
    fn xlen(&self) -> usize {
        self.x_shape().iter().product()
    }
    fn ylen(&self) -> usize {
        self.y_shape().iter().product()
    }
    fn wlen(&self) -> usize {
        self.g.kh * self.g.kw * (self.ci / self.g.groups) * self.co
    }
    fn ws(&self) -> usize {
        conv_workspace_elems(&self.g, &self.x_shape(), &self.y_shape())
    }
}

/// The direct convolution, f64: for every output (n, oy, ox, co) of group co / (co/groups), the
/// sum over the taps (ky, kx) and the group's input channels of x at
/// (oy*sh + ky*dh - pt, ox*sw + kx*dw - pl) (zero outside the image) times w[ky, kx, ci, co].
fn conv_direct(c: &Case, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
    let g = &c.g;
    let (ho, wo) = c.out();
    let (cig, cog) = (c.ci / g.groups, c.co / g.groups);
    let mut y = vec![0f64; c.ylen()];
    for n in 0..c.n {
        for oy in 0..ho {
            for ox in 0..wo {
                for co in 0..c.co {
                    let grp = co / cog;
                    let mut acc = b.map_or(0.0, |b| b[co] as f64);
                    for ky in 0..g.kh {
                        for kx in 0..g.kw {
                            let iy = (oy * g.stride_h + ky * g.dil_h) as i64 - g.pad_top as i64;
                            let ix = (ox * g.stride_w + kx * g.dil_w) as i64 - g.pad_left as i64;
                            if iy < 0 || ix < 0 || iy >= c.h as i64 || ix >= c.w as i64 {
                                continue;
                            }
                            for cl in 0..cig {
                                let ci = grp * cig + cl;
                                let xv =
                                    x[((n * c.h + iy as usize) * c.w + ix as usize) * c.ci + ci];
                                let wv = w[((ky * g.kw + kx) * cig + cl) * c.co + co];
                                acc += xv as f64 * wv as f64;
                            }
                        }
                    }
                    y[((n * ho + oy) * wo + ox) * c.co + co] = acc;
                }
            }
        }
    }
    y
}

fn run(c: &Case, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![f32::NAN; c.ylen()];
    let mut cols = vec![f32::NAN; c.ws()];
    conv2d_fwd(&c.g, &c.dims(), x, w, b, &mut y, &mut cols);
    y
}

fn geom(kh: usize, kw: usize, (sh, sw): (usize, usize), pads: [usize; 4]) -> ConvGeom {
    ConvGeom {
        kh,
        kw,
        stride_h: sh,
        stride_w: sw,
        pad_top: pads[0],
        pad_bottom: pads[1],
        pad_left: pads[2],
        pad_right: pads[3],
        ..ConvGeom::square(1, 1, 0)
    }
}

fn cases() -> Vec<Case> {
    let c = |n, h, w, ci, co, g| Case { n, h, w, ci, co, g };
    vec![
        // a 1x7 and a 7x1 kernel (Inception), PyTorch-style symmetric padding
        c(2, 6, 11, 3, 4, geom(1, 7, (1, 1), [0, 0, 3, 3])),
        c(1, 9, 5, 2, 3, geom(7, 1, (1, 1), [3, 3, 0, 0])),
        // a stride per axis, padding on one side only
        c(2, 9, 8, 3, 5, geom(3, 2, (2, 1), [0, 1, 1, 0])),
        // ResNet's 3x3/2 with padding 1 (symmetric: unlike `same` on an even input)
        c(2, 8, 8, 3, 4, geom(3, 3, (2, 2), [1, 1, 1, 1])),
        // more padding than the kernel needs, and a stride larger than the kernel
        c(1, 5, 6, 2, 2, geom(2, 2, (3, 2), [2, 3, 1, 2])),
        // dilation 2 and (2, 3)
        c(
            2,
            9,
            10,
            2,
            3,
            ConvGeom {
                dil_h: 2,
                dil_w: 2,
                ..geom(3, 3, (1, 1), [2, 2, 2, 2])
            },
        ),
        c(
            1,
            11,
            12,
            3,
            2,
            ConvGeom {
                dil_h: 2,
                dil_w: 3,
                ..geom(3, 2, (2, 1), [1, 0, 2, 1])
            },
        ),
        // depthwise (groups = channels), with a channel multiplier of 2, strided
        c(
            2,
            7,
            8,
            4,
            8,
            ConvGeom {
                groups: 4,
                ..ConvGeom::square(3, 2, 1)
            },
        ),
        // depthwise, one output per channel
        c(
            1,
            6,
            6,
            5,
            5,
            ConvGeom {
                groups: 5,
                ..ConvGeom::square(3, 1, 1)
            },
        ),
        // two groups, non-square, dilated
        c(
            2,
            8,
            9,
            6,
            4,
            ConvGeom {
                groups: 2,
                dil_w: 2,
                ..geom(2, 3, (1, 2), [0, 1, 2, 2])
            },
        ),
        // depthwise over more than one chunk of im2col rows (2*17*18 = 612 > 256)
        c(
            2,
            17,
            18,
            3,
            6,
            ConvGeom {
                groups: 3,
                ..ConvGeom::square(3, 1, 1)
            },
        ),
        // depthwise at the widths summed in registers (16, 32, 8) and past them (36: a block of
        // 32 and one of 4), over several blocks of lines of the weight gradient (40 pixels a
        // line: 12 lines a block, 80 lines), strided, dilated, padded unevenly
        c(
            2,
            40,
            40,
            16,
            16,
            ConvGeom {
                groups: 16,
                ..ConvGeom::square(3, 1, 1)
            },
        ),
        c(
            2,
            23,
            29,
            32,
            32,
            ConvGeom {
                groups: 32,
                dil_h: 2,
                ..geom(3, 3, (2, 1), [2, 1, 0, 3])
            },
        ),
        c(
            3,
            9,
            30,
            24,
            24,
            ConvGeom {
                groups: 24,
                dil_w: 3,
                ..geom(2, 5, (1, 3), [0, 1, 4, 2])
            },
        ),
        c(
            1,
            30,
            26,
            36,
            36,
            ConvGeom {
                groups: 36,
                ..geom(3, 3, (1, 2), [1, 1, 1, 1])
            },
        ),
    ]
}

#[test]
fn general_conv_forward_matches_direct_convolution() {
    let mut r = rng(31);
    for (i, c) in cases().into_iter().enumerate() {
        let x = randv(&mut r, c.xlen());
        let w = randv(&mut r, c.wlen());
        let b = randv(&mut r, c.co);
        for bias in [false, true] {
            let bb = bias.then_some(b.as_slice());
            assert_close(
                &format!("case {i} {c:?} bias {bias}"),
                &run(&c, &x, &w, bb),
                &conv_direct(&c, &x, &w, bb),
                1e-5,
                1e-5,
            );
        }
    }
}

#[test]
fn general_conv_backward_matches_finite_differences() {
    let mut r = rng(32);
    for (i, c) in cases().into_iter().enumerate() {
        let (g, d) = (c.g, c.dims());
        let x = randv(&mut r, c.xlen());
        let w = randv(&mut r, c.wlen());
        let rr = randv(&mut r, c.ylen());
        let mut dx = vec![f32::NAN; c.xlen()];
        conv2d_bwd_data(&g, &d, &rr, &w, &mut dx);
        fd_check(&format!("dx case {i} {c:?}"), &x, &dx, 60, |x| {
            dot(&run(&c, x, &w, None), &rr)
        });
        let mut dw = vec![f32::NAN; c.wlen()];
        let mut cols = vec![f32::NAN; c.ws()];
        conv2d_bwd_weight(&g, &d, &x, &rr, &mut dw, &mut cols);
        fd_check(&format!("dw case {i} {c:?}"), &w, &dw, 60, |w| {
            dot(&run(&c, &x, w, None), &rr)
        });
        // by blocks of output channels (the fused update's path): blocks end at group
        // boundaries (a depthwise conv's, run directly, are `chunk` channels of as many groups),
        // and together they are the whole gradient, bit for bit
        for chunk in [1, 2, 3, 8, 16, c.co] {
            let k = c.wlen() / c.co;
            let mut gw = vec![f32::NAN; k * chunk];
            let mut got = vec![f32::NAN; c.wlen()];
            let mut blocks = vec![];
            conv2d_bwd_weight_chunked(
                &g,
                &d,
                &x,
                &rr,
                chunk,
                (&mut gw, None),
                &mut cols,
                |c0, nc, blk| {
                    blocks.push((c0, nc));
                    for row in 0..k {
                        got[row * c.co + c0..row * c.co + c0 + nc]
                            .copy_from_slice(&blk[row * nc..(row + 1) * nc]);
                    }
                },
            );
            let cog = c.co / g.groups;
            let depthwise = c.ci == g.groups && c.co == g.groups;
            for &(c0, nc) in &blocks {
                if depthwise {
                    assert_eq!(nc, chunk.min(c.co - c0), "depthwise block {c0}+{nc}");
                    continue;
                }
                assert_eq!(
                    c0 / cog,
                    (c0 + nc - 1) / cog,
                    "block {c0}+{nc} straddles groups"
                );
            }
            assert_eq!(got, dw, "chunk {chunk}, case {i}");
        }
    }
}

/// Random geometries (kernel, strides, dilation, padding per side, groups), forward against the
/// direct convolution and both gradients against finite differences.
#[test]
fn general_conv_random_geometries() {
    let mut r = rng(33);
    for t in 0..30 {
        let groups = [1, 1, 2, 3][r.random_range(0..4)];
        let (kh, kw) = (r.random_range(1..4), r.random_range(1..4));
        let (dh, dw) = (r.random_range(1..3), r.random_range(1..3));
        let g = ConvGeom {
            dil_h: dh,
            dil_w: dw,
            groups,
            ..geom(
                kh,
                kw,
                (r.random_range(1..4), r.random_range(1..4)),
                [0; 4].map(|_| r.random_range(0..3)),
            )
        };
        let (h, w) = (
            dh * (kh - 1) + 1 + r.random_range(0..6),
            dw * (kw - 1) + 1 + r.random_range(0..6),
        );
        let c = Case {
            n: r.random_range(1..3),
            h,
            w,
            ci: groups * r.random_range(1..3),
            co: groups * r.random_range(1..3),
            g,
        };
        let x = randv(&mut r, c.xlen());
        let wt = randv(&mut r, c.wlen());
        let b = randv(&mut r, c.co);
        let what = format!("random {t} {c:?}");
        assert_close(
            &what,
            &run(&c, &x, &wt, Some(&b)),
            &conv_direct(&c, &x, &wt, Some(&b)),
            1e-5,
            1e-5,
        );
        let rr = randv(&mut r, c.ylen());
        let mut dx = vec![f32::NAN; c.xlen()];
        conv2d_bwd_data(&g, &c.dims(), &rr, &wt, &mut dx);
        fd_check(&format!("dx {what}"), &x, &dx, 40, |x| {
            dot(&run(&c, x, &wt, None), &rr)
        });
        let mut dwt = vec![f32::NAN; c.wlen()];
        let mut cols = vec![f32::NAN; c.ws()];
        conv2d_bwd_weight(&g, &c.dims(), &x, &rr, &mut dwt, &mut cols);
        fd_check(&format!("dw {what}"), &wt, &dwt, 40, |w| {
            dot(&run(&c, &x, w, None), &rr)
        });
    }
}

/// One pooling: x [n, h, w, c], a `kh x kw` window moved by `(sh, sw)`, padded by
/// `(top, bottom, left, right)`, floor or ceil windows.
#[derive(Clone, Copy, Debug)]
struct Pool {
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    k: (usize, usize),
    s: (usize, usize),
    pad: (usize, usize, usize, usize),
    ceil: bool,
}

/// PyTorch's `pooling_output_shape` (dilation 1), written with the padding per side:
/// `(n + before + after - k + (ceil ? s - 1 : 0)) / s + 1`, minus one in ceil mode when the last
/// window would start at or past `n + before` (in the right padding).
fn torch_extent(n: usize, k: usize, s: usize, before: usize, after: usize, ceil: bool) -> usize {
    let mut o = (n + before + after - k + if ceil { s - 1 } else { 0 }) / s + 1;
    if ceil && (o - 1) * s >= n + before {
        o -= 1;
    }
    o
}

impl Pool {
    fn out(&self) -> (usize, usize) {
        let (t, b, l, r) = self.pad;
        (
            torch_extent(self.h, self.k.0, self.s.0, t, b, self.ceil),
            torch_extent(self.w, self.k.1, self.s.1, l, r, self.ceil),
        )
    }
    fn geom(&self) -> PoolGeom {
        PoolGeom {
            kh: self.k.0,
            kw: self.k.1,
            stride_h: self.s.0,
            stride_w: self.s.1,
            pad_top: self.pad.0,
            pad_bottom: self.pad.1,
            pad_left: self.pad.2,
            pad_right: self.pad.3,
            ceil_mode: self.ceil,
        }
    }
    fn dims(&self) -> PoolDims {
        let (ho, wo) = self.out();
        PoolDims {
            n: self.n,
            h: self.h,
            w: self.w,
            c: self.c,
            ho,
            wo,
        }
    }
    fn xlen(&self) -> usize {
        self.n * self.h * self.w * self.c
    }
    fn ylen(&self) -> usize {
        let (ho, wo) = self.out();
        self.n * ho * wo * self.c
    }
}

/// Max and mean (padded cells as zeros) of each window, f64; the max's argmax is the first
/// maximum's window index among the cells inside the image. The mean's divisor is PyTorch's
/// (`count_include_pad=True`): the window clipped to the padded input, `min(start + k, n + after)
/// - start` per axis with `start = o*s - before`.
fn pool_ref(p: &Pool, x: &[f32]) -> (Vec<f64>, Vec<u8>, Vec<f64>) {
    let (ho, wo) = p.out();
    let (pt, pb, pl, pr) = p.pad;
    let (mut mx, mut am, mut avg) = (vec![], vec![], vec![]);
    for n in 0..p.n {
        for oy in 0..ho {
            for ox in 0..wo {
                let hs = (oy * p.s.0) as i64 - pt as i64;
                let ws = (ox * p.s.1) as i64 - pl as i64;
                let he = (hs + p.k.0 as i64).min((p.h + pb) as i64);
                let we = (ws + p.k.1 as i64).min((p.w + pr) as i64);
                let div = ((he - hs) * (we - ws)) as f64;
                for ch in 0..p.c {
                    let (mut best, mut bi, mut sum) = (f64::NEG_INFINITY, 0u8, 0f64);
                    for wy in 0..p.k.0 {
                        for wx in 0..p.k.1 {
                            let iy = hs + wy as i64;
                            let ix = ws + wx as i64;
                            if iy < 0 || ix < 0 || iy >= p.h as i64 || ix >= p.w as i64 {
                                continue;
                            }
                            let v = x[((n * p.h + iy as usize) * p.w + ix as usize) * p.c + ch];
                            sum += v as f64;
                            if (v as f64) > best {
                                best = v as f64;
                                bi = (wy * p.k.1 + wx) as u8;
                            }
                        }
                    }
                    mx.push(best);
                    am.push(bi);
                    avg.push(sum / div);
                }
            }
        }
    }
    (mx, am, avg)
}

fn sq(n: usize, h: usize, w: usize, c: usize, size: usize, s: usize, pad: usize) -> Pool {
    Pool {
        n,
        h,
        w,
        c,
        k: (size, size),
        s: (s, s),
        pad: (pad, pad, pad, pad),
        ceil: false,
    }
}

fn pools() -> Vec<Pool> {
    let odd = |h, w, k, s, pad, ceil| Pool {
        n: 1,
        h,
        w,
        c: 2,
        k,
        s,
        pad,
        ceil,
    };
    vec![
        sq(2, 8, 8, 3, 3, 2, 1), // ResNet's stem pool: 8 -> 4
        sq(1, 7, 9, 2, 3, 2, 1), // odd sizes
        sq(2, 5, 6, 2, 2, 2, 1), // padding 1 on a 2x2 window
        sq(1, 6, 5, 3, 5, 1, 2), // padding 2 on a 5x5 window, stride 1
        sq(1, 4, 4, 1, 3, 3, 1), // stride equal to the window
        // non-square windows and strides, per-side padding
        odd(7, 6, (2, 3), (2, 1), (0, 1, 1, 0), false),
        odd(5, 9, (3, 2), (1, 3), (1, 0, 0, 1), false),
        // ceil mode: the last windows hang over the padded input (a smaller divisor)
        odd(5, 7, (2, 2), (2, 2), (0, 0, 0, 0), true),
        odd(8, 6, (3, 2), (2, 1), (1, 1, 0, 1), true),
        // ceil mode dropping the window that would start in the right padding: 3 -> 2
        odd(3, 7, (2, 3), (2, 2), (1, 1, 1, 0), true),
    ]
}

/// A random permutation of distinct values 0.05 apart (> 2h, so no tie is crossed by the FD step).
fn distinct(r: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|i| i as f32 * 0.05 - 1.0).collect();
    for i in (1..x.len()).rev() {
        let j = r.random_range(0..=i);
        x.swap(i, j);
    }
    x
}

#[test]
fn padded_pools_match_reference_and_finite_differences() {
    let mut r = rng(34);
    for p in pools() {
        let (g, d) = (p.geom(), p.dims());
        let x = distinct(&mut r, p.xlen());
        let (mx, am, avg) = pool_ref(&p, &x);
        let mut y = vec![f32::NAN; p.ylen()];
        let mut a = vec![255u8; p.ylen()];
        maxpool_fwd(&g, &d, &x, &mut y, &mut a);
        assert_close(&format!("maxpool {p:?}"), &y, &mx, 0.0, 0.0);
        assert_eq!(a, am, "argmax {p:?}");
        let mut ya = vec![f32::NAN; p.ylen()];
        avgpool_fwd(&g, &d, &x, &mut ya);
        assert_close(&format!("avgpool {p:?}"), &ya, &avg, 1e-6, 1e-6);
        // all-negative inputs: a padded cell (zero) must never be the maximum
        let neg: Vec<f32> = x.iter().map(|v| v - 100.0).collect();
        maxpool_fwd(&g, &d, &neg, &mut y, &mut a);
        assert!(y.iter().all(|v| *v < -50.0), "padding won a max {p:?}");

        let rr = randv(&mut r, p.ylen());
        maxpool_fwd(&g, &d, &x, &mut y, &mut a);
        let mut dx = vec![f32::NAN; p.xlen()];
        maxpool_bwd(&g, &d, &rr, &a, &mut dx);
        fd_check(&format!("maxpool bwd {p:?}"), &x, &dx, 200, |x| {
            let (mut y, mut a) = (vec![0.0; p.ylen()], vec![0u8; p.ylen()]);
            maxpool_fwd(&g, &d, x, &mut y, &mut a);
            dot(&y, &rr)
        });
        let mut dx = vec![f32::NAN; p.xlen()];
        avgpool_bwd(&g, &d, &rr, &mut dx);
        fd_check(&format!("avgpool bwd {p:?}"), &x, &dx, 200, |x| {
            let mut y = vec![0.0; p.ylen()];
            avgpool_fwd(&g, &d, x, &mut y);
            dot(&y, &rr)
        });
    }
}

/// The output extents of PyTorch's pools, as `nn.MaxPool2d` gives them (hand-checked).
#[test]
fn ceil_mode_extents_are_pytorchs() {
    // MaxPool2d(2, 2, ceil_mode=True) on 5: windows at 0, 2, 4 (the last hangs over)
    assert_eq!(torch_extent(5, 2, 2, 0, 0, true), 3);
    assert_eq!(torch_extent(5, 2, 2, 0, 0, false), 2);
    // MaxPool2d(3, 2, padding=1, ceil_mode=True) on 8: 5 (floor: 4)
    assert_eq!(torch_extent(8, 3, 2, 1, 1, true), 5);
    assert_eq!(torch_extent(8, 3, 2, 1, 1, false), 4);
    // MaxPool2d(2, 2, padding=1, ceil_mode=True) on 3: the third window would start at padded
    // 4 = 3 + 1, in the right padding: dropped
    assert_eq!(torch_extent(3, 2, 2, 1, 1, true), 2);
    for (n, k, s, b, a, c) in [
        (5, 2, 2, 0, 0, true),
        (8, 3, 2, 1, 1, true),
        (3, 2, 2, 1, 1, true),
        (7, 3, 2, 1, 0, true),
        (9, 2, 3, 0, 1, false),
    ] {
        assert_eq!(
            PoolGeom::extent(n, k, s, b, a, c),
            Ok(torch_extent(n, k, s, b, a, c)),
            "{n} {k} {s} {b} {a} {c}"
        );
    }
}

#[test]
fn padded_maxpool_bwd_poisons_a_corrupt_argmax() {
    // an argmax pointing into the padding is corrupt: its window's first input cell gets NaN
    let p = sq(1, 4, 4, 1, 3, 2, 1);
    let (g, d) = (p.geom(), p.dims());
    let mut a = vec![4u8; p.ylen()]; // the centre: always inside the image
    a[0] = 0; // window (0, 0)'s corner (-1, -1): padding
    let dy = vec![1.0; p.ylen()];
    let mut dx = vec![0.0; p.xlen()];
    maxpool_bwd(&g, &d, &dy, &a, &mut dx);
    assert!(dx[0].is_nan(), "{dx:?}");
    assert_eq!(dx.iter().filter(|v| v.is_nan()).count(), 1);
}

#[test]
fn global_maxpool_matches_reference_and_finite_differences() {
    let mut r = rng(35);
    let (n, h, w, c) = (3, 4, 5, 6);
    let x = distinct(&mut r, n * h * w * c);
    let mut y = vec![f32::NAN; n * c];
    let mut a = vec![-1i32; n * c];
    global_maxpool_fwd((n, h * w, c), &x, &mut y, &mut a);
    for i in 0..n {
        for ch in 0..c {
            let (best, at) = (0..h * w)
                .map(|p| (x[(i * h * w + p) * c + ch], p))
                .fold((f32::NEG_INFINITY, 0), |b, v| if v.0 > b.0 { v } else { b });
            assert_eq!(y[i * c + ch], best);
            assert_eq!(a[i * c + ch], at as i32);
        }
    }
    // ties: the first maximum wins; a NaN wins and stays
    let mut t = vec![1.0f32; h * w];
    t[7] = f32::NAN;
    let (mut y1, mut a1) = (vec![0.0], vec![0]);
    global_maxpool_fwd((1, h * w, 1), &t, &mut y1, &mut a1);
    assert!(y1[0].is_nan() && a1[0] == 7);
    global_maxpool_fwd((1, h * w, 1), &vec![2.0; h * w], &mut y1, &mut a1);
    assert_eq!((y1[0], a1[0]), (2.0, 0));

    let rr = randv(&mut r, n * c);
    let mut dx = vec![f32::NAN; x.len()];
    global_maxpool_bwd((n, h * w, c), &rr, &a, &mut dx);
    fd_check("global_maxpool", &x, &dx, 300, |x| {
        let (mut y, mut a) = (vec![0.0; n * c], vec![0; n * c]);
        global_maxpool_fwd((n, h * w, c), x, &mut y, &mut a);
        dot(&y, &rr)
    });
    // a corrupt argmax poisons the channel's first pixel
    let mut bad = a.clone();
    bad[0] = (h * w) as i32;
    global_maxpool_bwd((n, h * w, c), &rr, &bad, &mut dx);
    assert!(dx[0].is_nan());
}
