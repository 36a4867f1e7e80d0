//! Convolutions: the forward, the data gradient and the weight gradient (alone or fused with the
//! optimizer update), each an implicit GEMM (no im2col buffer on the GPU).

use tera::Context;

use dmc_plan::op::{bias_chunks, ConvGeom, Epilogue, EpilogueSide, Role, BIAS_CHUNK_ROWS};
use dmc_plan::update::UpdateRule;

use super::common::{numel, Site, Spec};
use super::epilogue::epilogue_ctx;
use super::gemm::{gemm, GemmNeeds};
use super::optim::{bias_ctx, rule_ctx};
use crate::error::CodegenError;
use dmc_plan::op::ConvOp;

fn conv_ctx(kind: &str, g: &ConvGeom, x: &[usize], y: &[usize], bias: bool) -> Context {
    let mut ctx = Context::new();
    ctx.insert("kind", kind);
    ctx.insert("nb", &x[0]);
    ctx.insert("h", &x[1]);
    ctx.insert("w", &x[2]);
    ctx.insert("ci", &x[3]);
    ctx.insert("ho", &y[1]);
    ctx.insert("wo", &y[2]);
    ctx.insert("co", &y[3]);
    ctx.insert("kh", &g.kh);
    ctx.insert("kw", &g.kw);
    ctx.insert("stride_h", &g.stride_h);
    ctx.insert("stride_w", &g.stride_w);
    ctx.insert("dil_h", &g.dil_h);
    ctx.insert("dil_w", &g.dil_w);
    ctx.insert("pad_top", &g.pad_top);
    ctx.insert("pad_left", &g.pad_left);
    let groups = g.groups.max(1);
    ctx.insert("groups", &groups);
    ctx.insert("cig", &(x[3] / groups));
    ctx.insert("cog", &(y[3] / groups));
    ctx.insert("bias", &bias);
    ctx.insert("fused_epi", &false);
    ctx
}

/// `Conv2d`: x, w, (b), (r), y, cols.
pub(crate) fn forward(
    s: &Site,
    geom: &ConvGeom,
    bias: bool,
    epi: &Epilogue,
) -> Result<Spec, CodegenError> {
    let yi = ConvOp::y_slot(bias, epi);
    let (x, y) = (s.shape(0)?, s.shape(yi)?);
    s.rank(x, 4, "x")?;
    s.rank(y, 4, "y")?;
    let mut ctx = conv_ctx(s.kind(), geom, x, y, bias);
    epilogue_ctx(&mut ctx, epi, EpilogueSide::Forward);
    let gr = groups(s, geom, x[3], y[3])?;
    let gk = geom.kh * geom.kw * x[3] / gr;
    let (gm, gn) = (y[0] * y[1] * y[2], y[3] / gr);
    // the workspace `cols` (the CPU's im2col rows, or a GPU split-K's partial sums if more)
    let needs = GemmNeeds {
        groups: gr,
        implicit: true,
        b_implicit: false,
        vec_a: vec4(x[3], x[3] / gr),
        vec_b: vec4(y[3], y[3] / gr),
        update: false,
        partial_elems: numel(s.shape(yi + 1)?),
        k_unit: 0,
        wide_copies: false, // set by `gemm` from the layouts
        b_k_fastest: false,
    };
    grouped(
        gemm(
            s,
            "conv2d_fwd.cu.tera",
            ctx,
            (gm, gn, gk),
            (true, false),
            (needs, "cols"),
        )?,
        gr,
    )
}

/// Whether an operand's rows of `channels` (a group's `per_group` of them) load as float4: both
/// multiples of 4, so 4 consecutive channels of a group are contiguous and 16-byte aligned.
fn vec4(channels: usize, per_group: usize) -> bool {
    channels.is_multiple_of(4) && per_group.is_multiple_of(4)
}

/// The groups of a convolution, checked against its channels (`ci` in, `co` out).
fn groups(s: &Site, geom: &ConvGeom, ci: usize, co: usize) -> Result<usize, CodegenError> {
    let g = geom.groups;
    if g == 0 || !ci.is_multiple_of(g) || !co.is_multiple_of(g) || g > 65535 {
        return Err(CodegenError::Grid {
            kernel: s.name().into(),
            message: format!("{g} groups over {ci} input and {co} output channels"),
        });
    }
    Ok(g)
}

/// A grouped convolution's GEMM: one GEMM per group, the group being the block's grid z (never
/// split along k: grid z is the group).
fn grouped(mut sp: Spec, groups: usize) -> Result<Spec, CodegenError> {
    if groups > 1 {
        debug_assert_eq!(sp.split, 1);
        sp.grid[2] = groups as u32;
        sp.outputs *= groups;
        if let Some(g) = &mut sp.gemm {
            g.groups = groups;
        }
    }
    Ok(sp)
}

/// `Conv2dBwdData`: dy, w, (g), (saved), dx; in place, dx is written over saved.
pub(crate) fn backward_data(
    s: &Site,
    geom: &ConvGeom,
    epi: &Epilogue,
    in_place: bool,
) -> Result<Spec, CodegenError> {
    let dxi = ConvOp::dx_slot(epi, in_place);
    let (dy, dx) = (s.shape(0)?, s.shape(dxi)?);
    s.rank(dy, 4, "dy")?;
    s.rank(dx, 4, "dx")?;
    let mut ctx = conv_ctx(s.kind(), geom, dx, dy, false);
    epilogue_ctx(&mut ctx, epi, EpilogueSide::DataGradient);
    ctx.insert("dx", if in_place { "saved" } else { "dx" });
    ctx.insert("src", "dy");
    let gr = groups(s, geom, dx[3], dy[3])?;
    let gk = geom.kh * geom.kw * dy[3] / gr;
    // the workspace `partial` (after dx) holds a split-K's partial sums
    let needs = GemmNeeds {
        groups: gr,
        implicit: true,
        b_implicit: true,
        vec_a: vec4(dy[3], dy[3] / gr),
        vec_b: vec4(dy[3], dy[3] / gr),
        update: false,
        partial_elems: s.shape(dxi + 1).map_or(0, numel),
        k_unit: 0,
        wide_copies: false, // set by `gemm` from the layouts
        b_k_fastest: false,
    };
    grouped(
        gemm(
            s,
            "conv2d_bwd_data.cu.tera",
            ctx,
            (dx[0] * dx[1] * dx[2], dx[3] / gr, gk),
            (true, true),
            (needs, "partial"),
        )?,
        gr,
    )
}

/// `ConvTranspose2d`: x, w, (b), y: the data-gradient GEMM of the convolution from y to x, x read
/// as its dy, y written as its dx (plus the bias).
pub(crate) fn transpose(s: &Site, geom: &ConvGeom, bias: bool) -> Result<Spec, CodegenError> {
    let (x, y) = (s.shape(0)?, s.shape(2 + bias as usize)?);
    s.rank(x, 4, "x")?;
    s.rank(y, 4, "y")?;
    let mut ctx = conv_ctx(s.kind(), geom, y, x, bias);
    epilogue_ctx(&mut ctx, &Epilogue::NONE, EpilogueSide::DataGradient);
    ctx.insert("dx", "y");
    ctx.insert("src", "x");
    let gr = groups(s, geom, y[3], x[3])?;
    let gk = geom.kh * geom.kw * x[3] / gr;
    let needs = GemmNeeds {
        groups: gr,
        implicit: true,
        b_implicit: true,
        vec_a: vec4(x[3], x[3] / gr),
        vec_b: vec4(x[3], x[3] / gr),
        update: false,
        partial_elems: 0, // no workspace in its signature
        k_unit: 0,
        wide_copies: false, // set by `gemm` from the layouts
        b_k_fastest: false,
    };
    grouped(
        gemm(
            s,
            "conv2d_bwd_data.cu.tera",
            ctx,
            (y[0] * y[1] * y[2], y[3] / gr, gk),
            (true, true),
            (needs, ""),
        )?,
        gr,
    )
}

/// `Conv2dBwdWeight` (`rule` none) or `Conv2dBwdWeightUpdate`: x, dy, then dw (or the updated w):
/// the same GEMM; the fused kernel applies the update where the unfused one stores the gradient
/// (its workspaces stay unused). With `bias`, the fused kernel also sums dy's columns and updates
/// the bias.
pub(crate) fn backward_weight(
    s: &Site,
    geom: &ConvGeom,
    rule: Option<&UpdateRule>,
    (bias, keep_old): (bool, bool),
) -> Result<Spec, CodegenError> {
    let (x, dy) = (s.shape(0)?, s.shape(1)?);
    s.rank(x, 4, "x")?;
    s.rank(dy, 4, "dy")?;
    let ctx = conv_ctx(s.kind(), geom, x, dy, false);
    let gr = groups(s, geom, x[3], dy[3])?;
    let (gm, gn) = (geom.kh * geom.kw * x[3] / gr, dy[3] / gr);
    let gk = dy[0] * dy[1] * dy[2];
    // the workspace `cols` (the CPU's im2col rows, or a GPU split-K's partial sums if more; the
    // same slot in the unfused and the fused op, so fusing never changes a sum's order)
    let (ws_slot, ws) =
        s.k.op
            .signature()
            .params
            .iter()
            .enumerate()
            .find(|(_, p)| p.role == Role::Workspace && p.name == "cols")
            .map(|(i, p)| {
                (
                    p.name.clone(),
                    s.k.arg_shapes.get(i).map_or(0, |s| numel(s)),
                )
            })
            .unwrap_or_default();
    // A fused bias gradient splits only with its chunk sums' room in `db`, which a plan fitted to
    // a tight cap leaves out (with the split-K room): then the kernel runs unsplit.
    let db_room = !bias
        || rule.is_none()
        || s.k.arg_shapes.last().map_or(0, |d| numel(d)) >= bias_chunks(gk) * gn;
    let needs = GemmNeeds {
        groups: gr,
        implicit: true,
        b_implicit: false,
        vec_a: vec4(x[3], x[3] / gr),
        vec_b: vec4(dy[3], dy[3] / gr),
        update: rule.is_some(),
        partial_elems: if db_room { ws } else { 0 },
        // whole bias chunks per k range: the fused bias gradient's partial sums (and the unfused
        // gradient splits alike, so fusing never changes a sum's order)
        k_unit: BIAS_CHUNK_ROWS as u32,
        wide_copies: false, // set by `gemm` from the layouts
        b_k_fastest: false,
    };
    let mut sp = grouped(
        gemm(
            s,
            "conv2d_bwd_weight.cu.tera",
            ctx,
            (gm, gn, gk),
            (false, false),
            (needs, &ws_slot),
        )?,
        gr,
    )?;
    if let Some(rule) = rule {
        rule_ctx(&mut sp.ctx, rule, "w", true);
        if bias {
            // a split kernel's k ranges sum whole bias chunks (`k_unit`) into `db`, which the
            // plan sizes for them with the split-K room
            let db = s.k.arg_shapes.last().map_or(0, |d| numel(d));
            if let Some(g) = sp.gemm.filter(|g| {
                g.split > 1 && (g.ks() % BIAS_CHUNK_ROWS != 0 || db < bias_chunks(gk) * gn)
            }) {
                return Err(CodegenError::Shape {
                    kernel: s.name().into(),
                    message: format!(
                        "a split bias gradient needs k ranges of whole {BIAS_CHUNK_ROWS}-row \
                         chunks (has {}) and {} floats of `db` (has {db})",
                        g.ks(),
                        bias_chunks(gk) * gn
                    ),
                });
            }
            bias_ctx(&mut sp.ctx, rule);
        }
    }
    sp.ctx.insert("keep_old", &keep_old);
    Ok(sp)
}

/// The kernel of one op of the convolution family.
pub(crate) fn spec(s: &Site, op: &ConvOp) -> Result<Spec, CodegenError> {
    match op {
        ConvOp::Conv2d { geom, bias, epi } => forward(s, geom, *bias, epi),
        ConvOp::Conv2dBwdData {
            geom,
            epi,
            in_place,
        } => backward_data(s, geom, epi, *in_place),
        ConvOp::Conv2dBwdWeight { geom } => backward_weight(s, geom, None, (false, false)),
        ConvOp::Conv2dBwdWeightUpdate {
            geom,
            rule,
            bias,
            keep_old,
            ..
        } => backward_weight(s, geom, Some(rule), (*bias, *keep_old)),
        ConvOp::ConvTranspose2d { geom, bias, .. } => transpose(s, geom, *bias),
    }
}

/// The zoo's convolutions: strided and padded with bias, unpadded without, both gradients, the
/// fused update with SGD and Adam, and split-K shapes (a small grid over a long reduction).
pub(crate) fn zoo() -> Vec<super::cases::Case> {
    use super::cases::{adam, fused, fused_bias, sgd};
    use dmc_plan::op::{conv_workspace_elems, Op, UnaryKind};
    let g2 = ConvGeom::square(3, 2, 1);
    let g1 = ConvGeom::square(2, 1, 0);
    let g3 = ConvGeom::square(3, 1, 1);
    let (x2, w2, y2) = (vec![2, 7, 9, 3], vec![3, 3, 3, 5], vec![2, 4, 5, 5]);
    let ws2 = vec![conv_workspace_elems(&g2, &x2, &y2)];
    let (x1, w1, y1) = (vec![1, 5, 5, 2], vec![2, 2, 2, 3], vec![1, 4, 4, 3]);
    let ws1 = vec![conv_workspace_elems(&g1, &x1, &y1)];
    let (xs, wss, ys) = (vec![1, 4, 4, 130], vec![3, 3, 130, 7], vec![1, 4, 4, 7]);
    let wss_ = vec![conv_workspace_elems(&g3, &xs, &ys)];
    let (xw, yw, ww) = (vec![5, 15, 15, 3], vec![5, 15, 15, 5], vec![3, 3, 3, 5]);
    let wsw = vec![conv_workspace_elems(&g3, &xw, &yw)];
    let c = |op: ConvOp| Op::Conv(op);
    let mut v = vec![
        (
            c(ConvOp::Conv2d {
                geom: g2,
                bias: true,
                epi: Epilogue::NONE,
            }),
            vec![x2.clone(), w2.clone(), vec![5], y2.clone(), ws2.clone()],
        ),
        (
            c(ConvOp::Conv2d {
                geom: g1,
                bias: false,
                epi: Epilogue::NONE,
            }),
            vec![x1.clone(), w1.clone(), y1.clone(), ws1],
        ),
        (
            c(ConvOp::Conv2dBwdData {
                geom: g2,
                epi: Epilogue::NONE,
                in_place: false,
            }),
            vec![y2.clone(), w2.clone(), x2.clone()],
        ),
        (
            c(ConvOp::Conv2dBwdWeight { geom: g2 }),
            vec![x2.clone(), y2.clone(), w2.clone(), ws2],
        ),
        fused(
            c(ConvOp::Conv2dBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                geom: g2,
                rule: sgd(0.9, true),
                chunk: 2,
                bias: false,
                keep_old: false,
            }),
            vec![x2.clone(), y2.clone()],
            w2.clone(),
        ),
        fused(
            c(ConvOp::Conv2dBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                geom: g1,
                rule: adam(false),
                chunk: 3,
                bias: false,
                keep_old: false,
            }),
            vec![x1.clone(), y1.clone()],
            w1.clone(),
        ),
        (
            c(ConvOp::Conv2d {
                geom: g3,
                bias: true,
                epi: Epilogue::NONE,
            }),
            vec![xs.clone(), wss.clone(), vec![7], ys.clone(), wss_.clone()],
        ),
        (
            c(ConvOp::Conv2dBwdWeight { geom: g3 }),
            vec![xw.clone(), yw.clone(), ww.clone(), wsw],
        ),
    ];
    for rule in [sgd(0.9, false), adam(true)] {
        v.push(fused(
            c(ConvOp::Conv2dBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                geom: g3,
                rule,
                chunk: 5,
                bias: false,
                keep_old: false,
            }),
            vec![xw.clone(), yw.clone()],
            ww.clone(),
        ));
    }
    // Fused epilogues (`fuse_epilogues`): residual + activation, an activation alone over a
    // split-K forward (the epilogue in the reduction entry), the data gradient's accumulation +
    // activation backward and its activation backward alone; the bias gradient in the weight
    // gradient (one of them split-K).
    let epi = |add: bool, act: UnaryKind| Epilogue {
        add,
        act: Some(act),
    };
    let (xs, wss, ys) = (vec![1, 4, 4, 130], vec![3, 3, 130, 7], vec![1, 4, 4, 7]);
    let wss_ = vec![conv_workspace_elems(&g3, &xs, &ys)];
    let ws2 = vec![conv_workspace_elems(&g2, &x2, &y2)];
    v.push((
        c(ConvOp::Conv2d {
            geom: g2,
            bias: true,
            epi: epi(true, UnaryKind::Relu),
        }),
        vec![x2.clone(), w2.clone(), vec![5], y2.clone(), y2.clone(), ws2],
    ));
    v.push((
        c(ConvOp::Conv2d {
            geom: g3,
            bias: true,
            epi: epi(false, UnaryKind::Gelu),
        }),
        vec![xs, wss, vec![7], ys, wss_],
    ));
    v.push((
        c(ConvOp::Conv2dBwdData {
            geom: g2,
            epi: epi(true, UnaryKind::Relu),
            in_place: false,
        }),
        vec![y2.clone(), w2.clone(), x2.clone(), x2.clone(), x2.clone()],
    ));
    v.push((
        c(ConvOp::Conv2dBwdData {
            geom: g1,
            epi: epi(false, UnaryKind::Tanh),
            in_place: false,
        }),
        vec![y1.clone(), w1.clone(), x1.clone(), x1.clone()],
    ));
    // the data gradient written over its saved value (after the update that kept the old weights)
    v.push((
        c(ConvOp::Conv2dBwdData {
            geom: g2,
            epi: epi(true, UnaryKind::Sigmoid),
            in_place: true,
        }),
        vec![y2.clone(), w2.clone(), x2.clone(), x2.clone()],
    ));
    v.push(fused_bias(
        c(ConvOp::Conv2dBwdWeightUpdate {
            shards: 1,
            keep_rows: false,
            geom: g2,
            rule: sgd(0.9, true),
            chunk: 2,
            bias: true,
            keep_old: true,
        }),
        vec![x2.clone(), y2.clone()],
        w2.clone(),
        vec![5],
    ));
    v.push(fused_bias(
        c(ConvOp::Conv2dBwdWeightUpdate {
            shards: 1,
            keep_rows: false,
            geom: g3,
            rule: adam(true),
            chunk: 5,
            bias: true,
            keep_old: false,
        }),
        vec![xw, yw],
        ww,
        vec![5],
    ));
    // a split-K weight gradient with its bias over 2304 pixels: k ranges of whole 512-row bias
    // chunks (the last partial), each chunk's sum into `db`, added in order by the reduction
    v.push(fused_bias(
        c(ConvOp::Conv2dBwdWeightUpdate {
            shards: 1,
            keep_rows: false,
            geom: g3,
            rule: sgd(0.9, false),
            chunk: 6,
            bias: true,
            keep_old: false,
        }),
        vec![vec![4, 24, 24, 4], vec![4, 24, 24, 6]],
        vec![3, 3, 4, 6],
        vec![6],
    ));
    // a split-K data gradient (16 pixels x 7 channels over 1170 taps), plain and with its
    // activation's backward written over the saved value
    let (dyl, wl, dxl) = (vec![1, 4, 4, 130], vec![3, 3, 7, 130], vec![1, 4, 4, 7]);
    v.push((
        c(ConvOp::Conv2dBwdData {
            geom: g3,
            epi: Epilogue::NONE,
            in_place: false,
        }),
        vec![dyl.clone(), wl.clone(), dxl.clone()],
    ));
    v.push((
        c(ConvOp::Conv2dBwdData {
            geom: g3,
            epi: epi(false, UnaryKind::Relu),
            in_place: true,
        }),
        vec![dyl, wl, dxl],
    ));
    // channels in fours (128-bit loads of x, dy and w): the forward with bias, both gradients,
    // the fused update with its bias, and two groups of four input channels
    let (x4, w4, y4) = (vec![2, 5, 6, 8], vec![3, 3, 8, 12], vec![2, 5, 6, 12]);
    v.push((
        c(ConvOp::Conv2d {
            geom: g3,
            bias: true,
            epi: Epilogue::NONE,
        }),
        vec![x4.clone(), w4.clone(), vec![12], y4.clone()],
    ));
    v.push((
        c(ConvOp::Conv2dBwdData {
            geom: g3,
            epi: epi(false, UnaryKind::Relu),
            in_place: true,
        }),
        vec![y4.clone(), w4.clone(), x4.clone()],
    ));
    v.push((
        c(ConvOp::Conv2dBwdWeight { geom: g3 }),
        vec![x4.clone(), y4.clone(), w4.clone()],
    ));
    v.push(fused_bias(
        c(ConvOp::Conv2dBwdWeightUpdate {
            shards: 1,
            keep_rows: false,
            geom: g3,
            rule: sgd(0.9, true),
            chunk: 4,
            bias: true,
            keep_old: false,
        }),
        vec![x4.clone(), y4.clone()],
        w4,
        vec![12],
    ));
    let two4 = ConvGeom { groups: 2, ..g3 };
    v.push((
        c(ConvOp::Conv2d {
            geom: two4,
            bias: false,
            epi: Epilogue::NONE,
        }),
        vec![x4, vec![3, 3, 4, 12], y4],
    ));
    v.extend(zoo_geometries());
    v
}

/// The zoo's other geometries, each with its forward (bias), data gradient, weight gradient and
/// fused update (bias, Adam): a non-square kernel with a stride per axis, padding on each side and
/// dilation; a depthwise convolution (groups = input channels, two outputs per channel); two
/// groups of three channels.
fn zoo_geometries() -> Vec<super::cases::Case> {
    use super::cases::{adam, fused_bias};
    use dmc_plan::op::{conv_workspace_elems, Op};
    let odd = ConvGeom {
        kh: 3,
        kw: 2,
        stride_h: 2,
        stride_w: 1,
        pad_top: 2,
        pad_bottom: 1,
        pad_left: 0,
        pad_right: 1,
        dil_h: 2,
        dil_w: 1,
        groups: 1,
    };
    let depthwise = ConvGeom {
        groups: 4,
        ..ConvGeom::square(3, 2, 1)
    };
    let two = ConvGeom {
        groups: 2,
        ..ConvGeom::square(3, 1, 1)
    };
    let mut v = vec![];
    for (g, x, co) in [
        (odd, [2, 9, 6, 3], 5),
        (depthwise, [2, 7, 8, 4], 8),
        (two, [1, 5, 6, 6], 4),
    ] {
        let (ho, wo) = g.out_hw(x[1], x[2]).unwrap_or((1, 1));
        let (x, y) = (x.to_vec(), vec![x[0], ho, wo, co]);
        let w = vec![g.kh, g.kw, x[3] / g.groups, co];
        let ws = vec![conv_workspace_elems(&g, &x, &y)];
        v.push((
            Op::Conv(ConvOp::Conv2d {
                geom: g,
                bias: true,
                epi: Epilogue::NONE,
            }),
            vec![x.clone(), w.clone(), vec![co], y.clone(), ws.clone()],
        ));
        v.push((
            Op::Conv(ConvOp::Conv2dBwdData {
                geom: g,
                epi: Epilogue::NONE,
                in_place: false,
            }),
            vec![y.clone(), w.clone(), x.clone()],
        ));
        v.push((
            Op::Conv(ConvOp::Conv2dBwdWeight { geom: g }),
            vec![x.clone(), y.clone(), w.clone(), ws],
        ));
        v.push(fused_bias(
            Op::Conv(ConvOp::Conv2dBwdWeightUpdate {
                shards: 1,
                keep_rows: false,
                geom: g,
                rule: adam(true),
                chunk: 3,
                bias: true,
                keep_old: false,
            }),
            vec![x, y],
            w,
            vec![co],
        ));
    }
    // transposed convolutions: the odd geometry with an output padding (bias), and two groups with
    // a stride of 2 and output padding on both axes (no bias)
    let two_s2 = ConvGeom {
        groups: 2,
        ..ConvGeom::square(3, 2, 1)
    };
    for (g, out_pad, x, co, bias) in [
        (odd, (1, 0), [2, 4, 5, 5], 3, true),
        (two_s2, (1, 1), [1, 3, 4, 4], 6, false),
    ] {
        let (ho, wo) = g.transposed_out_hw((x[1], x[2]), out_pad).unwrap_or((1, 1));
        let w = vec![g.kh, g.kw, co / g.groups, x[3]];
        let mut shapes = vec![x.to_vec(), w];
        if bias {
            shapes.push(vec![co]);
        }
        shapes.push(vec![x[0], ho, wo, co]);
        v.push((
            Op::Conv(ConvOp::ConvTranspose2d {
                geom: g,
                out_pad,
                bias,
            }),
            shapes,
        ));
    }
    v
}
