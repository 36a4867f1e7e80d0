//! An INDEPENDENT plan checker. It re-derives every safety property of a [`Plan`] from the plan
//! alone (no IR, no planner code): buffers inside the arena and aligned, no two simultaneously
//! live buffers overlapping, every step's arguments matching its kernel, every read preceded by a
//! write, and no read of a persistent buffer after a step overwrote it in place (an in-place
//! write of a transient buffer makes the step's output, which later steps read).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

pub use crate::error::PlanCheckError;
use crate::op::Role;
use crate::op::{Op, TransferOp};
use crate::plan::{BufferId, BufferKind, Mode, Plan, Store, ALIGN, FORMAT_VERSION};

/// Bytes of a tensor (saturating: a corrupted plan must not make the checker panic).
fn bytes_of(shape: &[usize], elem: u64) -> u64 {
    shape
        .iter()
        .fold(elem, |acc, d| acc.saturating_mul(*d as u64))
}

/// Plans with more buffers than this are checked on two threads (the buffers and the steps).
const PARALLEL_BUFFERS: usize = 4096;

/// Checks `plan`; the first violation found is returned (in this order: the format version, the
/// buffers and their overlaps, the kernels, the steps, the bindings).
pub fn check_plan(plan: &Plan) -> Result<(), PlanCheckError> {
    if plan.format_version != FORMAT_VERSION {
        return Err(PlanCheckError::FormatVersion {
            got: plan.format_version,
            expected: FORMAT_VERSION,
        });
    }
    // The two halves read the plan only and do not depend on each other's result (the steps'
    // checks look buffers up with `get`): a large plan's run side by side, the buffers' error
    // first as if run in order.
    if plan.buffers.len() <= PARALLEL_BUFFERS {
        return check_buffers(plan).and_then(|()| check_steps(plan));
    }
    std::thread::scope(|s| {
        let buffers = s.spawn(|| check_buffers(plan));
        let steps = check_steps(plan);
        let buffers = buffers
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        buffers.and(steps)
    })
}

/// [`check_plan`] on a second thread while `next(plan)` runs on this one (a large plan's; a small
/// one is checked first): for the work that follows the check (the memory report, the
/// serialisation), which then overlaps it. The check's error wins over `next`'s result, as if it
/// had run first, and over a panic of `next` (on a plan the checker rejects).
pub fn check_plan_alongside<T>(
    plan: &Plan,
    next: impl FnOnce(&Plan) -> T,
) -> Result<T, PlanCheckError> {
    if plan.buffers.len() <= PARALLEL_BUFFERS {
        check_plan(plan)?;
        return Ok(next(plan));
    }
    std::thread::scope(|s| {
        let checked = s.spawn(|| check_plan(plan));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| next(plan)));
        checked
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        Ok(result.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })
}

/// The buffers: ids, alignment, arena bounds, live ranges, and no two live at once sharing a byte.
fn check_buffers(plan: &Plan) -> Result<(), PlanCheckError> {
    use PlanCheckError as E;
    // Buffers: ids, alignment, arena bounds, live ranges.
    for (i, b) in plan.buffers.iter().enumerate() {
        if b.id != i {
            return Err(E::BufferId { index: i, id: b.id });
        }
        if b.offset % ALIGN != 0 {
            return Err(E::Misaligned {
                buffer: i,
                name: b.name.clone(),
                offset: b.offset,
                align: ALIGN,
            });
        }
        let end = b.offset.saturating_add(b.bytes);
        let room = match b.store {
            Store::Arena => plan.arena_bytes,
            Store::Host => plan.host_bytes,
        };
        if end > room {
            return Err(E::OutOfArena {
                buffer: i,
                name: b.name.clone(),
                offset: b.offset,
                end,
                arena: room,
            });
        }
        if b.store == Store::Host
            && !(b.persistent
                && matches!(b.kind, BufferKind::Parameter | BufferKind::OptimizerState))
            && (b.persistent || b.kind != BufferKind::Activation)
        {
            return Err(E::Binding {
                name: b.name.clone(),
                msg: "only a parameter, optimizer state or offloaded activation tensor's home may be in the host store"
                    .into(),
            });
        }
        if b.live.0 > b.live.1 {
            return Err(E::BadLiveRange {
                buffer: i,
                name: b.name.clone(),
                live: b.live,
            });
        }
    }
    // No two simultaneously live buffers share a byte (live as `Plan::held` says: persistent
    // buffers always, inputs from the start, what the runtime reads after the steps to the end).
    // The buffers held for the whole run (the parameters and optimizer state: half of a deep
    // network's buffers) are all live together with every other buffer: they are checked once,
    // against each other by their order in offset, and each other buffer against them by a binary
    // search. The others by a sweep over time: taken by first live step, the ones still live then
    // are all live together, hence (unless an overlap was already reported) disjoint in bytes, so
    // the new one overlaps one of them iff it overlaps its neighbour below or above in offset
    // order.
    let live_range = |b: &crate::plan::Buffer| plan.held(b);
    let overlap = |i: usize, j: usize| {
        let (x, y) = (i.min(j), i.max(j));
        E::Overlap {
            a: x,
            a_name: plan.buffers[x].name.clone(),
            b: y,
            b_name: plan.buffers[y].name.clone(),
        }
    };
    // Held throughout: (offset, end, id). The others: (first live step, id). Keys computed once,
    // not at every comparison.
    let mut always: Vec<(u64, u64, usize)> = vec![];
    let mut by_start: Vec<(usize, usize)> = Vec::with_capacity(plan.buffers.len());
    // The host store's tensors are all held throughout, in their own memory: no two may share
    // a byte.
    let mut host: Vec<(u64, u64, usize)> = plan
        .buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| b.bytes > 0 && b.store == Store::Host)
        .map(|(i, b)| (b.offset, b.offset.saturating_add(b.bytes), i))
        .collect();
    host.sort_unstable();
    if let Some(w) = host.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(overlap(w[0].2, w[1].2));
    }
    for (i, b) in plan
        .buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| b.bytes > 0 && b.store == Store::Arena)
    {
        match live_range(b) {
            (0, usize::MAX) => always.push((b.offset, b.offset.saturating_add(b.bytes), i)),
            (start, _) => by_start.push((start, i)),
        }
    }
    // Sorted by offset, two of them overlap iff some neighbours do (the one in between starts
    // no later than the second, so before the first one's end). Once disjoint, their ends are in
    // offset order too.
    always.sort_unstable();
    if let Some(w) = always.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(overlap(w[0].2, w[1].2));
    }
    by_start.sort_unstable();
    // Live buffers by offset: offset -> (end, id); and (last live step, offset), earliest first.
    let mut active: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    let mut expiry: BinaryHeap<Reverse<(usize, u64)>> = BinaryHeap::new();
    for &(_, j) in &by_start {
        let b = &plan.buffers[j];
        let (start, last) = live_range(b);
        while let Some(&Reverse((l, off))) = expiry.peek() {
            if l >= start {
                break;
            }
            expiry.pop();
            active.remove(&off);
        }
        let bytes = (b.offset, b.offset.saturating_add(b.bytes));
        // The first buffer held throughout that ends above this one's offset overlaps it iff it
        // starts below this one's end.
        let k = always.partition_point(|&(_, end, _)| end <= bytes.0);
        if let Some(&(_, _, i)) = always.get(k).filter(|(off, _, _)| *off < bytes.1) {
            return Err(overlap(i, j));
        }
        let below = active
            .range(..b.offset)
            .next_back()
            .filter(|(_, (end, _))| *end > bytes.0);
        let above = active
            .range(b.offset..)
            .next()
            .filter(|(off, _)| **off < bytes.1);
        if let Some((_, &(_, i))) = below.or(above) {
            return Err(overlap(i, j));
        }
        active.insert(b.offset, (bytes.1, j));
        expiry.push(Reverse((last, b.offset)));
    }
    Ok(())
}

/// The kernels, the steps (arguments, liveness, read-before-write, in-place hazards) and the
/// bindings.
fn check_steps(plan: &Plan) -> Result<(), PlanCheckError> {
    use PlanCheckError as E;
    let nsteps = plan.steps.len();
    // Kernels: signature is the op's, one shape per parameter.
    for (i, k) in plan.kernels.iter().enumerate() {
        let msg = if k.id != i {
            Some(format!("has id {}", k.id))
        } else if k.signature != k.op.signature() {
            Some("its signature is not the op's signature".to_string())
        } else if k.arg_shapes.len() != k.signature.params.len() {
            Some(format!(
                "{} arg shapes for {} signature parameters",
                k.arg_shapes.len(),
                k.signature.params.len()
            ))
        } else {
            None
        };
        if let Some(msg) = msg {
            return Err(E::Kernel {
                kernel: i,
                name: k.name.clone(),
                msg,
            });
        }
    }
    // Steps, in order: arguments, liveness, read-before-write, in-place hazards.
    let mut written = vec![false; plan.buffers.len()];
    let mut in_place_at: Vec<Option<usize>> = vec![None; plan.buffers.len()];
    let mut windows = Windows::new(plan);
    for (s, st) in plan.steps.iter().enumerate() {
        let label = || st.label.clone();
        // `ok_or_else`: the error (and its label's copy) only when there is one.
        let k = plan
            .kernels
            .get(st.kernel)
            .ok_or_else(|| E::UnknownKernel {
                step: s,
                label: label(),
                kernel: st.kernel,
            })?;
        let sig = &k.signature.params;
        if st.args.len() != sig.len() {
            return Err(E::ArgCount {
                step: s,
                label: label(),
                expected: sig.len(),
                got: st.args.len(),
            });
        }
        for (a, (&bid, p)) in st.args.iter().zip(sig).enumerate() {
            let b = plan.buffers.get(bid).ok_or_else(|| E::UnknownBuffer {
                step: s,
                label: label(),
                arg: a,
                buffer: bid,
            })?;
            let mismatch = |what, msg| E::ArgMismatch {
                step: s,
                label: label(),
                arg: a,
                param: p.name.clone(),
                buffer: bid,
                what,
                msg,
            };
            if b.dtype != p.dtype {
                return Err(mismatch(
                    "dtype",
                    format!("{:?}, expected {:?}", b.dtype, p.dtype),
                ));
            }
            let want = bytes_of(&k.arg_shapes[a], p.dtype.size() as u64);
            if b.bytes != want {
                return Err(mismatch(
                    "size",
                    format!(
                        "{} bytes, the kernel expects {:?} = {want} bytes",
                        b.bytes, k.arg_shapes[a]
                    ),
                ));
            }
            if !b.persistent && (s < b.live.0 || s > b.live.1) {
                return Err(E::OutsideLive {
                    step: s,
                    label: label(),
                    buffer: bid,
                    name: b.name.clone(),
                    live: b.live,
                });
            }
            if matches!(p.role, Role::Out | Role::InOut | Role::Workspace)
                && st.args.iter().enumerate().any(|(o, x)| o != a && *x == bid)
            {
                return Err(E::ArgAlias {
                    step: s,
                    label: label(),
                    buffer: bid,
                    name: b.name.clone(),
                });
            }
        }
        if let Op::Transfer(op) = k.op {
            windows.copy(s, op, &mut in_place_at)?;
            written[st.args[1]] = true;
            continue;
        }
        windows.kernel(s)?;
        for (&bid, p) in st.args.iter().zip(sig) {
            let b = &plan.buffers[bid];
            if matches!(p.role, Role::In | Role::InOut) {
                if !b.persistent && b.kind != BufferKind::Input && !written[bid] {
                    return Err(E::ReadBeforeWrite {
                        step: s,
                        label: label(),
                        buffer: bid,
                        name: b.name.clone(),
                    });
                }
                if let Some(t) = in_place_at[bid] {
                    return Err(E::ReadAfterInPlace {
                        step: s,
                        label: label(),
                        buffer: bid,
                        name: b.name.clone(),
                        written_at: t,
                    });
                }
            }
        }
        for (&bid, p) in st.args.iter().zip(sig) {
            let b = &plan.buffers[bid];
            match p.role {
                Role::Out => {
                    if b.persistent || b.kind == BufferKind::Input {
                        return Err(E::WritesReadOnly {
                            step: s,
                            label: label(),
                            buffer: bid,
                            name: b.name.clone(),
                            kind: b.kind,
                        });
                    }
                    written[bid] = true;
                }
                Role::InOut => {
                    // A persistent buffer (parameter, optimizer state) overwritten in place holds
                    // next step's value: nothing may read it after. A transient one overwritten
                    // in place (an elementwise op whose input died there) holds the op's output,
                    // which later steps read.
                    // An accumulated gradient is the exception: the micro-batch's `GradAccum`
                    // writes it in place for the update to read (and zero) later in the step.
                    if b.persistent && b.kind != BufferKind::GradAccum {
                        in_place_at[bid] = Some(s);
                    }
                    written[bid] = true;
                }
                Role::In | Role::Workspace => {}
            }
        }
    }
    windows.end()?;
    // Bindings.
    let binding = |name: &str,
                   bid: BufferId,
                   shape: &[usize],
                   elem: u64,
                   kinds: &[BufferKind]|
     -> Result<(), PlanCheckError> {
        let b = plan.buffers.get(bid).ok_or_else(|| E::Binding {
            name: name.into(),
            msg: format!("buffer #{bid} does not exist"),
        })?;
        let want = bytes_of(shape, elem);
        if b.bytes != want {
            return Err(E::Binding {
                name: name.into(),
                msg: format!(
                    "buffer #{bid} has {} bytes, shape {shape:?} needs {want}",
                    b.bytes
                ),
            });
        }
        if !kinds.contains(&b.kind) {
            return Err(E::Binding {
                name: name.into(),
                msg: format!("buffer #{bid} is {:?}", b.kind),
            });
        }
        Ok(())
    };
    for p in &plan.params {
        let kinds = [BufferKind::Parameter, BufferKind::RunningStat];
        binding(&p.name, p.buffer, &p.buffer_shape(), 4, &kinds)?;
    }
    for p in plan.params.iter().chain(&plan.opt_state) {
        if let Some(l) = p.shard {
            if l.rows * l.cols != p.shape.iter().product::<usize>() || l.world != plan.ranks {
                return Err(E::Binding {
                    name: p.name.clone(),
                    msg: format!(
                        "shard {l:?} does not split its shape {:?} among the plan's {} ranks",
                        p.shape, plan.ranks
                    ),
                });
            }
        }
    }
    for p in &plan.opt_state {
        binding(
            &p.name,
            p.buffer,
            &p.buffer_shape(),
            4,
            &[BufferKind::OptimizerState],
        )?;
    }
    for io in plan.inputs.iter().chain(&plan.targets) {
        binding(
            &io.name,
            io.buffer,
            &io.shape,
            io.dtype.size() as u64,
            &[BufferKind::Input],
        )?;
    }
    let any = [
        BufferKind::Parameter,
        BufferKind::OptimizerState,
        BufferKind::Input,
        BufferKind::Activation,
        BufferKind::Gradient,
    ];
    binding("loss", plan.loss, &[1], 4, &any)?;
    let o = &plan.output;
    binding(&o.name, o.buffer, &o.shape, o.dtype.size() as u64, &any)?;
    if plan.mode != Mode::Predict && nsteps > 0 && !written[plan.loss] {
        return Err(E::Binding {
            name: "loss".into(),
            msg: "no step writes the loss".into(),
        });
    }
    for (name, bid) in [("loss", plan.loss), (o.name.as_str(), o.buffer)] {
        let b = &plan.buffers[bid];
        if written[bid] && !b.persistent && b.live.1.saturating_add(1) < nsteps {
            return Err(E::Binding {
                name: name.into(),
                msg: format!("buffer #{bid} dies at step {} before the end", b.live.1),
            });
        }
    }
    Ok(())
}

/// Streaming's rules, checked step by step ([`check_steps`]): a copy moves one tensor between its
/// home in the host store and a window of the arena of the same kind and size; a kernel touches
/// only the arena; a window is read only once its copy has landed (its `ready`); the home of a
/// window written by a kernel gets it back by a write-back, which lands while the window's bytes
/// are still its own (its live range reaches `ready - 1`); a persistent home written back is not
/// copied in again within the step (the next step's forward reads it). An offloaded activation's
/// first window has no copy in: its producer writes it, and its write-back gives it its home; a
/// later window copies in only what a write-back has landed.
struct Windows<'p> {
    plan: &'p Plan,
    /// Per window: its home (set by its copy in, or an activation's first write-back).
    home: Vec<Option<BufferId>>,
    /// Per transient home: the step its last write-back lands at.
    landed: Vec<Option<usize>>,
    /// Per buffer without a home yet: a kernel wrote it (an activation's producer).
    produced: Vec<bool>,
    /// Per window: the step its copy lands at.
    lands: Vec<usize>,
    /// Per window: the kernel step that wrote it since its last write-back.
    dirty: Vec<Option<usize>>,
}

impl<'p> Windows<'p> {
    fn new(plan: &'p Plan) -> Self {
        let n = plan.buffers.len();
        Windows {
            plan,
            home: vec![None; n],
            landed: vec![None; n],
            produced: vec![false; n],
            lands: vec![0; n],
            dirty: vec![None; n],
        }
    }

    fn err(&self, s: usize, msg: String) -> PlanCheckError {
        PlanCheckError::Stream {
            step: s,
            label: self.plan.steps[s].label.clone(),
            msg,
        }
    }

    /// Copy step `s` (arguments already checked against its kernel).
    fn copy(
        &mut self,
        s: usize,
        op: TransferOp,
        in_place_at: &mut [Option<usize>],
    ) -> Result<(), PlanCheckError> {
        let plan = self.plan;
        let st = &plan.steps[s];
        let (src, dst) = (&plan.buffers[st.args[0]], &plan.buffers[st.args[1]]);
        let ready = match st.ready {
            Some(r) if r > s && r <= plan.steps.len() => r,
            r => {
                return Err(self.err(
                    s,
                    format!(
                        "a copy must land after its step and by the end of the run (ready {r:?})"
                    ),
                ))
            }
        };
        let (home, window) = match op {
            TransferOp::HostToDevice => (src, dst),
            TransferOp::DeviceToHost => (dst, src),
        };
        if home.store != Store::Host || window.store != Store::Arena || window.persistent {
            return Err(self.err(
                s,
                format!(
                    "copies between `{}` and `{}`: a copy moves a host-store home to or from a transient arena window",
                    src.name, dst.name
                ),
            ));
        }
        if home.kind != window.kind {
            return Err(self.err(
                s,
                format!(
                    "window `{}` is {:?}, its home {:?}",
                    window.name, window.kind, home.kind
                ),
            ));
        }
        match op {
            TransferOp::HostToDevice if !home.persistent => match self.landed[home.id] {
                _ if self
                    .home
                    .iter()
                    .zip(&self.dirty)
                    .any(|(h, d)| *h == Some(home.id) && d.is_some()) =>
                {
                    return Err(self.err(
                        s,
                        format!(
                            "copies in `{}` while a window written since is not written back",
                            home.name
                        ),
                    ))
                }
                Some(l) if l <= s => {
                    self.home[window.id] = Some(home.id);
                    self.lands[window.id] = ready;
                    self.dirty[window.id] = None;
                }
                l => {
                    return Err(self.err(
                        s,
                        format!(
                            "copies in `{}` before a write-back of it has landed ({})",
                            home.name,
                            l.map_or("none was issued".into(), |l| format!("at step {l}"))
                        ),
                    ))
                }
            },
            TransferOp::HostToDevice => {
                if let Some(t) = in_place_at[home.id] {
                    return Err(self.err(
                        s,
                        format!(
                            "copies in `{}` after step {t} wrote it back (a read of the updated tensor within the step)",
                            home.name
                        ),
                    ));
                }
                self.home[window.id] = Some(home.id);
                self.lands[window.id] = ready;
                self.dirty[window.id] = None;
            }
            TransferOp::DeviceToHost => {
                if !home.persistent && self.home[window.id].is_none() && self.produced[window.id] {
                    // an activation's producer wrote the window: this is its home
                    self.home[window.id] = Some(home.id);
                }
                if self.home[window.id] != Some(home.id) {
                    return Err(self.err(
                        s,
                        format!(
                            "writes window `{}` back to `{}`, which is not the home it was copied from",
                            window.name, home.name
                        ),
                    ));
                }
                if window.live.1.saturating_add(1) < ready {
                    return Err(self.err(
                        s,
                        format!(
                            "the write-back of window `{}` lands before step {ready}, but the window's bytes are released after step {} (live {:?}): they may be overwritten before the copy has read them",
                            window.name, window.live.1, window.live
                        ),
                    ));
                }
                self.dirty[window.id] = None;
                if home.persistent {
                    in_place_at[home.id] = Some(s);
                } else {
                    self.landed[home.id] = Some(ready);
                }
            }
        }
        Ok(())
    }

    /// Kernel step `s`: no host-store argument, windows read only after their copy landed, the
    /// windows it writes marked for a write-back.
    fn kernel(&mut self, s: usize) -> Result<(), PlanCheckError> {
        let plan = self.plan;
        let st = &plan.steps[s];
        let k = &plan.kernels[st.kernel];
        for (&bid, p) in st.args.iter().zip(&k.signature.params) {
            let b = &plan.buffers[bid];
            if b.store == Store::Host {
                return Err(PlanCheckError::HostArg {
                    step: s,
                    label: st.label.clone(),
                    buffer: bid,
                    name: b.name.clone(),
                });
            }
            if self.home[bid].is_none() {
                self.produced[bid] |= p.role != Role::In;
                continue;
            }
            if s < self.lands[bid] {
                return Err(self.err(
                    s,
                    format!(
                        "reads window `{}` before its copy lands (at step {})",
                        b.name, self.lands[bid]
                    ),
                ));
            }
            if p.role != Role::In {
                self.dirty[bid] = Some(s);
            }
        }
        Ok(())
    }

    /// After the last step: every window of a persistent home written has been written back
    /// (an offloaded activation is dead after its last window).
    fn end(&self) -> Result<(), PlanCheckError> {
        let persistent = |w: usize| self.home[w].is_some_and(|h| self.plan.buffers[h].persistent);
        match self
            .dirty
            .iter()
            .enumerate()
            .find_map(|(w, d)| d.filter(|_| persistent(w)).map(|s| (w, s)))
        {
            Some((w, s)) => Err(self.err(
                s,
                format!(
                    "writes window `{}`, which is never written back to its home: the update would be lost",
                    self.plan.buffers[w].name
                ),
            )),
            None => Ok(()),
        }
    }
}
