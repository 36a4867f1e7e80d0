//! The convolution family: the forward, both gradients, the weight gradient fused with its
//! update, and the transposed convolution. Weights are HWIO `[kh,kw,Ci,Co]`, images NHWC.

use serde::{Deserialize, Serialize};

use super::epilogue::{Epilogue, EpilogueSide};
use super::facts::{p, ConvGeom, DType, OpFacts, ParamKind, Role, ShapeError, TensorType};
use super::optim::bias_chunks;
use super::shape::{err, numel, rank, states_sharded};
use super::split::split_partials_elems;
use crate::update::UpdateRule;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ConvOp {
    /// x\[N,H,W,Ci\], w\[kh,kw,Ci,Co\], (b\[Co\] if bias), (r\[N,Ho,Wo,Co\] if `epi.add`) ->
    /// y\[N,Ho,Wo,Co\] = epi.act(conv + b + r) ([`Epilogue`], forward side).
    /// Workspace: [`conv_workspace_elems`] f32 (im2col rows of a chunk), or a GPU split-K's partial
    /// sums ([`split_partials_elems`](super::split::split_partials_elems)) if more.
    Conv2d {
        geom: ConvGeom,
        bias: bool,
        #[serde(default, skip_serializing_if = "Epilogue::is_none")]
        epi: Epilogue,
    },
    /// dy\[N,Ho,Wo,Co\], w\[kh,kw,Ci,Co\], (g\[N,H,W,Ci\] if `epi.add`), (saved\[N,H,W,Ci\] if `epi.act`)
    /// -> dx\[N,H,W,Ci\] = epi.act'(saved) * (conv^T(dy, w) + g) (reads w in place, flipped: no
    /// transposed copy). Workspace `partial`: a GPU split-K's partial sums
    /// ([`split_partials_elems`](super::split::split_partials_elems); the CPU leaves it unused). With `in_place` (an activation's backward only), dx is written over
    /// `saved` (InOut): each element of saved is read by the epilogue of the same element of dx
    /// only, so the GEMM may overwrite it.
    Conv2dBwdData {
        geom: ConvGeom,
        #[serde(default, skip_serializing_if = "Epilogue::is_none")]
        epi: Epilogue,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        in_place: bool,
    },
    /// x\[N,H,W,Ci\], dy\[N,Ho,Wo,Co\] -> dw\[kh,kw,Ci,Co\]. Workspace as for `Conv2d`.
    Conv2dBwdWeight { geom: ConvGeom },
    /// x\[N,H,W,Ci\], dy\[N,Ho,Wo,Co\], w\[kh,kw,Ci,Co\] (InOut), state.. (InOut) -> w', state'..
    /// For each block of `chunk` output channels (columns of the [K, Co] weight matrix,
    /// K = kh*kw*Ci): the gradient of that block into the workspace `gw` [K x chunk], then the
    /// update `rule` on that block of w and its state. Workspaces: `gw` (K*chunk), `cols` (as for
    /// `Conv2d`). No whole-layer gradient is ever held.
    /// With `bias` (the bias gradient fused in by `fuse_epilogues`): b\[Co\] (InOut) and its state
    /// (InOut, [`UpdateRule::bias_state_names`]) follow the weight's state, and a third workspace
    /// `db` \[Co\] receives db = sum of dy over every leading axis before b's update (with the
    /// split-K room, [`bias_chunks`] x Co: a split GPU kernel's chunk sums).
    /// With `keep_old`, the weights before the update are written to the output `w_old` (Out,
    /// after the InOut ones), so that the data gradient can run after the update (see
    /// `fuse_epilogues`, "update first").
    Conv2dBwdWeightUpdate {
        geom: ConvGeom,
        rule: UpdateRule,
        chunk: usize,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        bias: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        keep_old: bool,
        /// Data parallel: as [`super::DenseOp::DenseBwdWeightUpdate`]'s `shards` (w seen as
        /// `[K, Co]`; the `comm` workspace comes last).
        #[serde(
            default = "crate::shard::one",
            skip_serializing_if = "crate::shard::is_one"
        )]
        shards: usize,
        /// Sharded parameters (ZeRO-3, [`crate::shard`]): the updated tensor is a window of
        /// which only this rank's rows are kept (`KeepShard`), so the step gathers no other
        /// rank's rows into it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        keep_rows: bool,
    },
    /// The transposed convolution (PyTorch's `ConvTranspose2d`): x\[N,H,W,Ci\], w\[kh,kw,Co/groups,Ci\],
    /// (b\[Co\] if bias) -> y\[N,Ho,Wo,Co\] = conv^T(x, w) + b: the data gradient of the convolution
    /// `geom` (whose input is y and whose output is x) with x in the place of dy, the extents
    /// [`ConvGeom::transposed_out_hw`] (`out_pad`: PyTorch's `output_padding`, extra rows at the
    /// bottom and columns at the right, each below its stride). w is that convolution's HWIO weight:
    /// PyTorch's `ConvTranspose2d.weight` `[Ci, Co/groups, kh, kw]` permuted `(2, 3, 1, 0)`, as a
    /// convolution's OIHW weight is. Its backward: dx = conv(dy, w) (`Conv2d`), dw =
    /// `Conv2dBwdWeight(dy, x)`, db = the sum of dy.
    ConvTranspose2d {
        geom: ConvGeom,
        out_pad: (usize, usize),
        bias: bool,
    },
}

impl ConvOp {
    /// Signature slot of the forward's output `y` (after x, w, b, r).
    pub fn y_slot(bias: bool, epi: &Epilogue) -> usize {
        2 + bias as usize + epi.num_inputs(EpilogueSide::Forward)
    }

    /// Signature slot of the data gradient's `dx` (after dy, w, g, saved; in place, `saved`'s).
    pub fn dx_slot(epi: &Epilogue, in_place: bool) -> usize {
        2 + epi.num_inputs(EpilogueSide::DataGradient) - in_place as usize
    }
}

/// Rows of im2col processed per chunk by convolution kernels: the workspace holds
/// `CONV_CHUNK_ROWS x (kh*kw*Ci)` f32 (or fewer rows when the whole problem is smaller).
pub const CONV_CHUNK_ROWS: usize = 256;

/// Elements of the CPU data gradient's per-thread `dcols` tile (256 KiB of f32): a tile holds
/// `max(1, BWD_DATA_TILE / K)` rows (at most [`CONV_CHUNK_ROWS`]), or more for a weight larger
/// than a cache ([`bwd_data_tile_rows`]).
pub const BWD_DATA_TILE: usize = 1 << 16;

/// Rows of the CPU data gradient's `dcols` tile for `K` = `k` columns, a group's weight of `k x
/// cog` and `per_img` output pixels an image: `max(1, BWD_DATA_TILE / K)` (at most
/// [`CONV_CHUNK_ROWS`]); but every tile's GEMM reads the whole weight, so a weight larger than a
/// cache ([`crate::cpu::CACHED_OPERAND_BYTES`]) takes an image's rows in tiles of up to 4x the
/// elements (the seed network's 37.7 MB weights at 16 pixels: one tile, not three, and its data
/// gradients 3x faster).
pub fn bwd_data_tile_rows(k: usize, cog: usize, per_img: usize) -> usize {
    let k = k.max(1);
    let t = (BWD_DATA_TILE / k).clamp(1, CONV_CHUNK_ROWS);
    if 4 * k * cog > crate::cpu::CACHED_OPERAND_BYTES {
        t.max(per_img.min(4 * BWD_DATA_TILE / k))
            .clamp(1, CONV_CHUNK_ROWS)
    } else {
        t
    }
}

/// Workspace elements (f32) a convolution kernel needs, given x's full shape \[N,H,W,Ci\] and the
/// output's \[N,Ho,Wo,Co\]. Shared by the planner (size of the workspace buffer) and the backends.
/// With groups, the rows hold one group's `kh*kw*Ci/groups` columns (the groups are done in turn).
pub fn conv_workspace_elems(geom: &ConvGeom, x_shape: &[usize], y_shape: &[usize]) -> usize {
    let rows = y_shape[0] * y_shape[1] * y_shape[2];
    rows.min(CONV_CHUNK_ROWS) * k_per_group(geom, x_shape)
}

/// The split-K room of a forward GEMM (x [N,H,W,Ci] -> y [N,Ho,Wo,Co]); none with groups (a
/// grouped GEMM's grid z is its group).
fn fwd_partials(geom: &ConvGeom, x: &[usize], y: &[usize]) -> usize {
    if geom.groups > 1 {
        return 0;
    }
    split_partials_elems(y[0] * y[1] * y[2], y[3], k_per_group(geom, x))
}

/// The split-K room of a weight-gradient GEMM ([K, Co] over the N*Ho*Wo output pixels).
fn wgrad_partials(geom: &ConvGeom, x: &[usize], dy: &[usize]) -> usize {
    if geom.groups > 1 {
        return 0;
    }
    split_partials_elems(k_per_group(geom, x), dy[3], dy[0] * dy[1] * dy[2])
}

/// The reduction length of one group: `kh*kw*Ci/groups` (x [N,H,W,Ci]).
pub fn k_per_group(geom: &ConvGeom, x_shape: &[usize]) -> usize {
    geom.kh * geom.kw * x_shape.get(3).copied().unwrap_or(0) / geom.groups.max(1)
}

/// The geometry is usable for x [N,H,W,Ci] and Co output channels: positive strides, dilation and
/// groups, the groups dividing both channel counts.
fn valid(geom: &ConvGeom, ci: usize, co: usize) -> Result<(), ShapeError> {
    if geom.stride_h == 0 || geom.stride_w == 0 {
        return err("convolution stride must be positive");
    }
    if geom.dil_h == 0 || geom.dil_w == 0 {
        return err("convolution dilation must be positive");
    }
    if geom.groups == 0 || !ci.is_multiple_of(geom.groups) || !co.is_multiple_of(geom.groups) {
        return err(format!(
            "{} groups must divide both {ci} input and {co} output channels",
            geom.groups
        ));
    }
    Ok(())
}

/// x [N,H,W,Ci] and y (or dy) [N,Ho,Wo,Co] agree with the geometry.
fn consistent(geom: &ConvGeom, x: &TensorType, y: &TensorType) -> Result<bool, ShapeError> {
    rank(x, 4, "x")?;
    rank(y, 4, "y")?;
    valid(geom, x.shape[3], y.shape[3])?;
    Ok(x.shape[0] == y.shape[0]
        && geom.out_hw(x.shape[1], x.shape[2]) == Some((y.shape[1], y.shape[2])))
}

/// The weight [kh,kw,Ci/groups,Co] of the geometry over x [N,H,W,Ci] with Co outputs.
fn weight_shape(geom: &ConvGeom, ci: usize, co: usize) -> [usize; 4] {
    [geom.kh, geom.kw, ci / geom.groups.max(1), co]
}

impl ConvOp {
    /// The workspaces of [`OpFacts::workspace_elems`], with the GPU's split-K room or (`!split`)
    /// without it.
    fn workspaces(&self, s: &[Vec<usize>], split: bool) -> Vec<usize> {
        let room = usize::from(split);
        match self {
            ConvOp::Conv2d { geom, bias, epi } => {
                let yi = ConvOp::y_slot(*bias, epi);
                match (s.first(), s.get(yi)) {
                    (Some(x), Some(y)) if x.len() == 4 && y.len() == 4 => {
                        vec![conv_workspace_elems(geom, x, y).max(room * fwd_partials(geom, x, y))]
                    }
                    _ => vec![0],
                }
            }
            ConvOp::Conv2dBwdData {
                geom,
                epi,
                in_place,
            } => {
                let dxi = ConvOp::dx_slot(epi, *in_place);
                match (s.first(), s.get(dxi)) {
                    // dx's pixels x its channels, over dy's taps (no split with groups)
                    (Some(dy), Some(dx)) if dy.len() == 4 && dx.len() == 4 && geom.groups <= 1 => {
                        vec![
                            room * split_partials_elems(
                                dx[0] * dx[1] * dx[2],
                                dx[3],
                                k_per_group(geom, dy),
                            ),
                        ]
                    }
                    _ => vec![0],
                }
            }
            ConvOp::ConvTranspose2d { .. } => vec![],
            ConvOp::Conv2dBwdWeight { geom } => match (s.first(), s.get(1)) {
                (Some(x), Some(dy)) if x.len() == 4 && dy.len() == 4 => {
                    vec![conv_workspace_elems(geom, x, dy).max(room * wgrad_partials(geom, x, dy))]
                }
                _ => vec![0],
            },
            ConvOp::Conv2dBwdWeightUpdate {
                geom,
                chunk,
                bias,
                shards,
                ..
            } => {
                let mut v = match (s.first(), s.get(1)) {
                    (Some(x), Some(dy)) if x.len() == 4 && dy.len() == 4 => {
                        vec![
                            k_per_group(geom, x) * chunk,
                            conv_workspace_elems(geom, x, dy)
                                .max(room * wgrad_partials(geom, x, dy)),
                        ]
                    }
                    _ => vec![0, 0],
                };
                if *bias {
                    // db [Co], or with a split-K room the chunk sums of a split GPU kernel's bias
                    // ([`bias_chunks`] x Co: each k range sums its own chunks)
                    let chunks = match (s.first(), s.get(1)) {
                        (Some(x), Some(dy))
                            if x.len() == 4
                                && dy.len() == 4
                                && room * wgrad_partials(geom, x, dy) > 0 =>
                        {
                            bias_chunks(dy[0] * dy[1] * dy[2])
                        }
                        _ => 1,
                    };
                    v.push(chunks * s.get(1).and_then(|dy| dy.get(3)).copied().unwrap_or(0));
                }
                if *shards > 1 {
                    let k = s
                        .first()
                        .filter(|x| x.len() == 4)
                        .map_or(0, |x| k_per_group(geom, x));
                    let co = s.get(1).and_then(|dy| dy.get(3)).copied().unwrap_or(0);
                    v.push(super::dense::comm_elems(k, *chunk, *bias, co, *shards));
                }
                v
            }
        }
    }
}

impl OpFacts for ConvOp {
    fn params(&self) -> Vec<ParamKind> {
        use DType::*;
        use Role::*;
        match self {
            ConvOp::Conv2d { bias, epi, .. } => {
                let mut v = vec![p("x", In, F32), p("w", In, F32)];
                if *bias {
                    v.push(p("b", In, F32));
                }
                v.extend(epi.params(EpilogueSide::Forward));
                v.push(p("y", Out, F32));
                v.push(p("cols", Workspace, F32));
                v
            }
            ConvOp::Conv2dBwdData { epi, in_place, .. } => {
                let mut v = vec![p("dy", In, F32), p("w", In, F32)];
                v.extend(epi.params(EpilogueSide::DataGradient));
                match v.last_mut() {
                    Some(saved) if *in_place && saved.0 == "saved" => saved.1 = InOut,
                    _ => v.push(p("dx", Out, F32)),
                }
                v.push(p("partial", Workspace, F32));
                v
            }
            ConvOp::ConvTranspose2d { bias, .. } => {
                let mut v = vec![p("x", In, F32), p("w", In, F32)];
                if *bias {
                    v.push(p("b", In, F32));
                }
                v.push(p("y", Out, F32));
                v
            }
            ConvOp::Conv2dBwdWeight { .. } => vec![
                p("x", In, F32),
                p("dy", In, F32),
                p("dw", Out, F32),
                p("cols", Workspace, F32),
            ],
            ConvOp::Conv2dBwdWeightUpdate {
                rule,
                bias,
                keep_old,
                shards,
                ..
            } => {
                let mut v = vec![p("x", In, F32), p("dy", In, F32), p("w", InOut, F32)];
                v.extend(rule.state_names().iter().map(|s| p(s, InOut, F32)));
                if *bias {
                    v.push(p("b", InOut, F32));
                    v.extend(rule.bias_state_names().iter().map(|s| p(s, InOut, F32)));
                }
                if *keep_old {
                    v.push(p("w_old", Out, F32));
                }
                v.push(p("gw", Workspace, F32));
                v.push(p("cols", Workspace, F32));
                if *bias {
                    v.push(p("db", Workspace, F32));
                }
                if *shards > 1 {
                    v.push(p("comm", Workspace, F32));
                }
                v
            }
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            ConvOp::Conv2d { .. } => "conv2d",
            ConvOp::Conv2dBwdData { .. } => "conv2d_bwd_data",
            ConvOp::Conv2dBwdWeight { .. } => "conv2d_bwd_weight",
            ConvOp::Conv2dBwdWeightUpdate { .. } => "conv2d_bwd_weight_update",
            ConvOp::ConvTranspose2d { .. } => "conv_transpose2d",
        }
    }

    fn aliased_outputs(&self) -> Vec<(usize, usize)> {
        match self {
            ConvOp::Conv2dBwdData {
                epi,
                in_place: true,
                ..
            } => vec![(0, 2 + epi.add as usize)],
            ConvOp::Conv2d { .. }
            | ConvOp::Conv2dBwdData { .. }
            | ConvOp::Conv2dBwdWeight { .. }
            | ConvOp::ConvTranspose2d { .. } => {
                vec![]
            }
            ConvOp::Conv2dBwdWeightUpdate { rule, bias, .. } => {
                let n = (1 + rule.state_names().len()) * (1 + *bias as usize);
                (0..n).map(|o| (o, o + 2)).collect()
            }
        }
    }

    fn workspace_elems(&self, s: &[Vec<usize>]) -> Vec<usize> {
        self.workspaces(s, true)
    }

    fn workspace_elems_unsplit(&self, s: &[Vec<usize>]) -> Vec<usize> {
        self.workspaces(s, false)
    }

    fn infer(
        &self,
        inputs: &[TensorType],
        hint: Option<&TensorType>,
    ) -> Result<Vec<TensorType>, ShapeError> {
        let f = TensorType::f32;
        match self {
            ConvOp::Conv2d { geom, bias, epi } => {
                let (x, w) = (&inputs[0], &inputs[1]);
                rank(x, 4, "x")?;
                rank(w, 4, "w")?;
                valid(geom, x.shape[3], w.shape[3])?;
                if w.shape != weight_shape(geom, x.shape[3], w.shape[3]) {
                    return err(format!(
                        "w {w} does not match kernel {}x{} over {} channels in {} groups",
                        geom.kh, geom.kw, x.shape[3], geom.groups
                    ));
                }
                if *bias && inputs[2].shape != [w.shape[3]] {
                    return err(format!("bias {} must be [{}]", inputs[2], w.shape[3]));
                }
                let y = match hint {
                    Some(h) => {
                        if !consistent(geom, x, h)? || h.shape[3] != w.shape[3] {
                            return err(format!(
                                "output {h} inconsistent with x {x}, w {w}, {geom:?}"
                            ));
                        }
                        h.shape.clone()
                    }
                    None => match geom.out_hw(x.shape[1], x.shape[2]) {
                        Some((ho, wo)) => vec![x.shape[0], ho, wo, w.shape[3]],
                        None => {
                            return err(format!(
                                "kernel {}x{} (dilated) larger than the padded input {x}, {geom:?}",
                                geom.kh, geom.kw
                            ))
                        }
                    },
                };
                let y = f(y);
                epi.check(&y, &inputs[2 + *bias as usize..])?;
                Ok(vec![y])
            }
            ConvOp::Conv2dBwdData {
                geom,
                epi,
                in_place,
            } => {
                let (dy, w) = (&inputs[0], &inputs[1]);
                if *in_place && epi.act.is_none() {
                    return err("an in-place data gradient needs an activation's saved value");
                }
                rank(dy, 4, "dy")?;
                rank(w, 4, "w")?;
                let Some(h) = hint else {
                    return err("conv2d_bwd_data needs the expected output shape");
                };
                rank(h, 4, "dx")?;
                let ok = consistent(geom, h, dy)?
                    && w.shape == weight_shape(geom, h.shape[3], dy.shape[3]);
                if !ok {
                    return err(format!("dx {h} inconsistent with dy {dy}, w {w}, {geom:?}"));
                }
                let dx = f(h.shape.clone());
                epi.check(&dx, &inputs[2..])?;
                Ok(vec![dx])
            }
            ConvOp::ConvTranspose2d {
                geom,
                out_pad,
                bias,
            } => {
                let (x, w) = (&inputs[0], &inputs[1]);
                rank(x, 4, "x")?;
                rank(w, 4, "w")?;
                // the convolution the op transposes reads y's Co channels and writes x's Ci
                let (ci, co) = (x.shape[3], w.shape[2] * geom.groups.max(1));
                valid(geom, co, ci)?;
                if w.shape != weight_shape(geom, co, ci) {
                    return err(format!(
                        "w {w} does not match kernel {}x{} from {ci} channels in {} groups",
                        geom.kh, geom.kw, geom.groups
                    ));
                }
                if *bias && inputs[2].shape != [co] {
                    return err(format!("bias {} must be [{co}]", inputs[2]));
                }
                let Some((ho, wo)) = geom.transposed_out_hw((x.shape[1], x.shape[2]), *out_pad)
                else {
                    return err(format!(
                        "no transposed convolution output for x {x}, output padding {out_pad:?} \
                         (each below its stride), {geom:?}"
                    ));
                };
                let y = vec![x.shape[0], ho, wo, co];
                if let Some(h) = hint {
                    if h.shape != y {
                        return err(format!("output {h} inconsistent with x {x}, w {w}"));
                    }
                }
                Ok(vec![f(y)])
            }
            ConvOp::Conv2dBwdWeight { geom } => {
                let (x, dy) = (&inputs[0], &inputs[1]);
                if !consistent(geom, x, dy)? {
                    return err(format!("x {x} and dy {dy} inconsistent with {geom:?}"));
                }
                Ok(vec![
                    f(weight_shape(geom, x.shape[3], dy.shape[3]).to_vec()),
                ])
            }
            ConvOp::Conv2dBwdWeightUpdate {
                geom,
                chunk,
                bias,
                rule,
                keep_old,
                shards,
                ..
            } => {
                let (x, dy, w) = (&inputs[0], &inputs[1], &inputs[2]);
                if !consistent(geom, x, dy)?
                    || w.shape != weight_shape(geom, x.shape[3], dy.shape[3])
                {
                    return err(format!("x {x}, dy {dy}, w {w} inconsistent with {geom:?}"));
                }
                if *chunk == 0 || *chunk > dy.shape[3] {
                    return err(format!("chunk {chunk} outside 1..={}", dy.shape[3]));
                }
                let ns = rule.state_names().len();
                states_sharded(w, inputs, 3, ns, *shards, dy.shape[3])?;
                if *bias {
                    let b = &inputs[3 + ns];
                    if b.shape != [dy.shape[3]] {
                        return err(format!("bias {b} must be [{}]", dy.shape[3]));
                    }
                    states_sharded(b, inputs, 4 + ns, ns, *shards, 1)?;
                }
                let mut outs = inputs[2..].to_vec();
                if *keep_old {
                    outs.push(w.clone());
                }
                Ok(outs)
            }
        }
    }

    fn flops(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> u64 {
        let i = |k: usize| ins.get(k).map(|s| numel(s)).unwrap_or(0);
        let o = |k: usize| outs.get(k).map(|s| numel(s)).unwrap_or(0);
        match self {
            // y[N,Ho,Wo,Co] = sum over kh*kw*Ci: 2 per multiply-add.
            ConvOp::Conv2d { geom, bias, epi } => {
                let k = ins.first().map_or(0, |x| k_per_group(geom, x)) as u64;
                2 * o(0) * k + if *bias { o(0) } else { 0 } + epi.flops(o(0))
            }
            // dx[N,H,W,Ci] from dy and w: as many multiply-adds as the forward (w's third axis is
            // Ci per group).
            ConvOp::Conv2dBwdData { geom, epi, .. } => {
                let ci = ins.get(1).and_then(|w| w.get(2)).copied().unwrap_or(0) as u64;
                2 * i(0) * (geom.kh * geom.kw) as u64 * ci + epi.flops(o(0))
            }
            // y from x and w: the multiply-adds of the convolution it transposes (w's third axis is
            // Co per group), and the bias.
            ConvOp::ConvTranspose2d { geom, bias, .. } => {
                let cog = ins.get(1).and_then(|w| w.get(2)).copied().unwrap_or(0) as u64;
                2 * i(0) * (geom.kh * geom.kw) as u64 * cog + if *bias { o(0) } else { 0 }
            }
            // dw[kh,kw,Ci,Co] = sum over N*Ho*Wo (and the update: 4 per weight).
            ConvOp::Conv2dBwdWeight { geom } | ConvOp::Conv2dBwdWeightUpdate { geom, .. } => {
                let k = ins.first().map_or(0, |x| k_per_group(geom, x)) as u64;
                let upd = match self {
                    ConvOp::Conv2dBwdWeightUpdate { bias, rule, .. } => {
                        // the update (4 per weight), and the fused bias: its column sum and update
                        let b = i(3 + rule.state_names().len());
                        4 * i(2) + if *bias { i(1) + 4 * b } else { 0 }
                    }
                    _ => 0,
                };
                2 * i(1) * k + upd
            }
        }
    }

    /// The CPU backend's im2col + GEMM per chunk of [`CONV_CHUNK_ROWS`] output pixels (the
    /// forward and weight gradient; a fused update once per block of `chunk` columns, im2col
    /// redone per block), and its data gradient's GEMM + col2im per tile of an image's pixels
    /// (images in parallel).
    fn cpu_work(&self, ins: &[Vec<usize>], outs: &[Vec<usize>]) -> crate::cpu::CpuWork {
        use crate::cpu::{strided_bytes, update_block_work, CpuWork, GemmCalls};
        if let Some(w) = depthwise_cpu_work(self, ins, outs) {
            return w;
        }
        let dim = |s: Option<&Vec<usize>>, a: usize| s.and_then(|s| s.get(a)).copied().unwrap_or(0);
        let el = |s: Option<&Vec<usize>>| s.map(|s| numel(s)).unwrap_or(0);
        let gemm = |m, n, k, calls, outer, accumulate| GemmCalls {
            m,
            n,
            k,
            calls,
            outer,
            accumulate,
            per_thread_rows: false,
            a_t: false,
            b_t: false,
        };
        // (rows of a full chunk, full chunks, rows of the last partial one)
        let chunks = |rows: usize, per: usize| (per, (rows / per.max(1)) as u64, rows % per.max(1));
        let mut w = CpuWork::default();
        // the GEMMs of `rows` in chunks of `per`: (rows, full, rest) -> calls per row count
        let add = |w: &mut CpuWork,
                   (per, full, rest): (usize, u64, usize),
                   f: &dyn Fn(usize, u64) -> GemmCalls| {
            if full > 0 {
                w.gemms.push(f(per, full));
            }
            if rest > 0 {
                w.gemms.push(f(rest, 1));
            }
        };
        match self {
            ConvOp::Conv2d { geom, bias, epi } => {
                let (x, y) = (ins.first(), outs.first());
                let (k, groups) = (x.map_or(0, |x| k_per_group(geom, x)), geom.groups.max(1));
                let (rows, co) = (el(y) as usize / dim(y, 3).max(1), dim(y, 3));
                let ch = chunks(rows, rows.clamp(1, CONV_CHUNK_ROWS));
                let n_chunks = ch.1 + (ch.2 > 0) as u64;
                // per chunk one loop: the GEMM's row blocks, each its rows' bias, gather, GEMM and
                // epilogue (or, for few rows, the gather's, before a column-split GEMM)
                add(&mut w, ch, &|m, c| GemmCalls {
                    per_thread_rows: true,
                    a_t: false,
                    b_t: false,
                    ..gemm(m, co / groups, k, c * groups as u64, 1, *bias)
                });
                w.im2col_fwd = gathered(rows, geom, k, groups);
                w.loops = n_chunks;
                let out = el(y) * 4;
                w.streamed = if *bias { out } else { 0 }
                    + if epi.is_none() {
                        0
                    } else {
                        out * (2 + epi.add as u64)
                    };
                w.special
                    .extend(epi.special(super::EpilogueSide::Forward, el(y)));
            }
            ConvOp::Conv2dBwdData { geom, epi, .. } => {
                // dy [N,Ho,Wo,Co], w [kh,kw,Ci/g,Co] -> dx [N,H,W,Ci]
                let (dy, wt, dx) = (ins.first(), ins.get(1), outs.first());
                let groups = geom.groups.max(1);
                let k = geom.kh * geom.kw * dim(wt, 2);
                let (n, co) = (dim(dy, 0).max(1), dim(dy, 3));
                let per_img = el(dy) as usize / n / co.max(1);
                w = bwd_data_work(geom, k, co / groups, groups, n, per_img);
                let dxb = el(dx) * 4;
                w.streamed += dxb
                    + if epi.is_none() {
                        0
                    } else {
                        dxb * (1 + epi.add as u64 + epi.act.is_some() as u64)
                    };
                w.special
                    .extend(epi.special(super::EpilogueSide::DataGradient, el(dx)));
            }
            ConvOp::ConvTranspose2d { geom, bias, .. } => {
                // x [N,H,W,Ci] in the place of dy; w [kh,kw,Co/g,Ci] -> y
                let (x, wt, y) = (ins.first(), ins.get(1), outs.first());
                let groups = geom.groups.max(1);
                let k = geom.kh * geom.kw * dim(wt, 2);
                let (n, ci) = (dim(x, 0).max(1), dim(x, 3));
                let per_img = el(x) as usize / n / ci.max(1);
                w = bwd_data_work(geom, k, ci / groups, groups, n, per_img);
                w.streamed += el(y) * 4 * (1 + 2 * *bias as u64);
            }
            ConvOp::Conv2dBwdWeight { geom } => {
                let (x, dy) = (ins.first(), ins.get(1));
                let (k, groups) = (x.map_or(0, |x| k_per_group(geom, x)), geom.groups.max(1));
                let (rows, co) = (el(dy) as usize / dim(dy, 3).max(1), dim(dy, 3));
                let ch = chunks(rows, rows.clamp(1, CONV_CHUNK_ROWS));
                // dw = cols^T dy
                add(&mut w, ch, &|m, c| GemmCalls {
                    a_t: true,
                    ..gemm(k, co / groups, m, c * groups as u64, 1, true)
                });
                w.im2col = gathered(rows, geom, k, groups);
                w.loops = (ch.1 + (ch.2 > 0) as u64) * groups as u64 + 1;
                w.streamed = (k * co) as u64 * 4;
            }
            ConvOp::Conv2dBwdWeightUpdate {
                geom,
                rule,
                chunk,
                bias,
                ..
            } => {
                let (x, dy) = (ins.first(), ins.get(1));
                let (k, groups) = (x.map_or(0, |x| k_per_group(geom, x)), geom.groups.max(1));
                let (rows, co) = (el(dy) as usize / dim(dy, 3).max(1), dim(dy, 3));
                let cog = co / groups;
                let ch = chunks(rows, rows.clamp(1, CONV_CHUNK_ROWS));
                let n_chunks = ch.1 + (ch.2 > 0) as u64;
                let c = (*chunk).clamp(1, cog.max(1));
                // per group: blocks of c columns, the last one partial
                let (full, rest) = ((cog / c) as u64 * groups as u64, cog % c);
                let blocks = full + if rest > 0 { groups as u64 } else { 0 };
                let states = 1 + rule.state_names().len();
                for (nc, count) in [(c, full), (rest, if rest > 0 { groups as u64 } else { 0 })] {
                    if count == 0 || nc == 0 {
                        continue;
                    }
                    add(&mut w, ch, &|m, cc| GemmCalls {
                        a_t: true,
                        ..gemm(k, nc, m, cc * count, 1, true)
                    });
                    // the block's fill and update: k rows of nc columns of w and its states
                    let (streamed, loops) = update_block_work(k, nc, co, states);
                    w.streamed += count * ((k * nc) as u64 * 4 + streamed);
                    w.loops += count * loops;
                    if *bias {
                        // the block's columns of dy, summed row by row
                        w.streamed += count * strided_bytes(rows, nc, co);
                    }
                }
                w.im2col = blocks * gathered(rows, geom, k, 1);
                w.loops += blocks * n_chunks;
            }
        }
        w
    }
}

/// The CPU data gradient's work: per image (`n` of them, in parallel) and per tile of its
/// `per_img` pixels, `groups` GEMMs `dcols[tile, k] = dy[tile, cog] w^T` and their col2im.
fn bwd_data_work(
    geom: &ConvGeom,
    k: usize,
    cog: usize,
    groups: usize,
    n: usize,
    per_img: usize,
) -> crate::cpu::CpuWork {
    use crate::cpu::{CpuWork, GemmCalls};
    let t = bwd_data_tile_rows(k, cog, per_img);
    let (full, rest) = ((per_img / t) as u64, per_img % t);
    let mut w = CpuWork {
        col2im: gathered(n * per_img, geom, k, groups),
        loops: 1,
        ..Default::default()
    };
    for (m, per) in [(t, full), (rest, (rest > 0) as u64)] {
        if per > 0 && m > 0 {
            w.gemms.push(GemmCalls {
                m,
                n: k,
                k: cog,
                calls: per * groups as u64 * n as u64,
                outer: n as u64,
                accumulate: false,
                per_thread_rows: false,
                a_t: false,
                // dcols = dy w^T
                b_t: true,
            });
        }
    }
    w
}

/// The CPU backend's direct depthwise convolution (one input and one output channel per group,
/// `dmc_runtime::cpu::depthwise`): every tap's multiply-adds a vector of channels at a time, in
/// one parallel loop (the fused update: one per block of `chunk` channels, each reading its
/// channels of x and dy, and one for its update); `None` for any other convolution.
fn depthwise_cpu_work(
    op: &ConvOp,
    ins: &[Vec<usize>],
    outs: &[Vec<usize>],
) -> Option<crate::cpu::CpuWork> {
    use crate::cpu::{strided_bytes, CpuWork};
    let b = |s: &Vec<usize>| numel(s) * 4;
    // (the convolution's x, its y or dy, its geometry): depthwise when both have `groups` channels
    let (x, y, geom) = match op {
        ConvOp::Conv2d { geom, .. } => (ins.first()?, outs.first()?, geom),
        ConvOp::Conv2dBwdData { geom, .. } => (outs.first()?, ins.first()?, geom),
        ConvOp::ConvTranspose2d { geom, .. } => (outs.first()?, ins.first()?, geom),
        ConvOp::Conv2dBwdWeight { geom } | ConvOp::Conv2dBwdWeightUpdate { geom, .. } => {
            (ins.first()?, ins.get(1)?, geom)
        }
    };
    let c = geom.groups;
    if x.len() != 4 || y.len() != 4 || x[3] != c || y[3] != c {
        return None;
    }
    let taps = (geom.kh * geom.kw) as u64;
    let direct = numel(y) * taps;
    let mut w = CpuWork {
        direct,
        loops: 1,
        ..Default::default()
    };
    match op {
        ConvOp::Conv2d { bias, epi, .. } => {
            let extra = if epi.is_none() { 0 } else { 1 + epi.add as u64 };
            w.streamed = b(x) + b(y) * (1 + *bias as u64 + extra);
        }
        ConvOp::Conv2dBwdData { epi, .. } => {
            let extra = if epi.is_none() {
                0
            } else {
                1 + epi.add as u64 + epi.act.is_some() as u64
            };
            w.streamed = b(y) + b(x) * (2 + extra);
        }
        ConvOp::ConvTranspose2d { bias, .. } => {
            w.streamed = b(y) + b(x) * (2 + 2 * *bias as u64);
        }
        ConvOp::Conv2dBwdWeight { .. } => w.streamed = b(x) + b(y) + taps * c as u64 * 4,
        ConvOp::Conv2dBwdWeightUpdate {
            rule, chunk, bias, ..
        } => {
            let states = 1 + rule.state_names().len() as u64;
            let (px, rows) = (numel(x) as usize / c, numel(y) as usize / c);
            let mut c0 = 0;
            w.loops = 0;
            while c0 < c {
                let nc = (*chunk).clamp(1, c - c0);
                w.streamed += strided_bytes(px, nc, c)
                    + strided_bytes(rows, nc, c) * (1 + *bias as u64)
                    + taps * nc as u64 * 4
                    + 2 * states * strided_bytes(taps as usize, nc, c);
                w.loops += 2;
                c0 += nc;
            }
        }
    }
    Some(w)
}

/// Elements a gather (im2col, col2im) of `rows` rows of one group's `k` columns moves, over
/// `groups` groups, as the model counts them: each row's window is `kh*kw` runs of `k / (kh*kw)`
/// channels, and a run shorter than [`crate::cpu::MIN_RUN_ELEMS`] costs as much as one of that
/// length (a first layer's 3-channel runs: the copy's overhead, not its floats).
fn gathered(rows: usize, geom: &ConvGeom, k: usize, groups: usize) -> u64 {
    let taps = (geom.kh * geom.kw).max(1);
    let run = (k / taps).max(crate::cpu::MIN_RUN_ELEMS);
    (rows * taps * run * groups) as u64
}
