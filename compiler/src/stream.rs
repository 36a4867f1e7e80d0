//! Streaming: parameters and optimizer state that do not stay in the arena, and activations
//! offloaded to the host between their forward and backward uses (`stream`, run by emission
//! before placement when [`Ctx::stream`](crate::ctx::Ctx) asks for it).
//!
//! A streamed tensor's home moves to the host store ([`Store::Host`]); each cluster of its uses
//! in the step (uses at most [`MERGE_GAP`] steps apart: a forward, or a data gradient with its
//! fused update) reads a *window*, an ordinary arena buffer with a live range, which a
//! host-to-device copy step fills before the cluster and, when a step of the cluster wrote it
//! (an update), a device-to-host step writes back after it. An offloaded activation's first
//! window is its producer's output (nothing copied in) and is written back; its later windows are
//! copied in, and written back only when a later window reads what they wrote. The placer then
//! packs windows like any other buffer, so the cap bounds the windows in flight, not the model.
//!
//! Which tensors stream is a count ([`Ctx::stream`](crate::ctx::Ctx)) over one order,
//! `candidates`: the fewest bytes moved per byte saved first (optimizer state, copied in and
//! back once per step, and activations, written back and copied in once, before weights, which
//! the forward reads too), larger tensors first among equals (fewer copies). Offloading an
//! activation is the alternative to recomputing it: the cap fitter weighs both by predicted time. The cap fitter ([`crate::fit`]) picks the smallest count that fits.
//!
//! Prefetch ([`Ctx::prefetch`](crate::ctx::Ctx)): a window's copy is issued when the previous
//! window's cluster starts (double buffering: layer i+1's weights arrive while layer i computes)
//! rather than just before its own first use; it costs a second window's bytes in flight, so
//! the fitter drops it when the plan does not fit with it.

use dmc_plan::op::{DType, Op, Role, TransferOp};
use dmc_plan::plan::{BufferId, BufferKind, Kernel, Step, StepPhase, Store};

use crate::emit::Buf;

/// Uses of a streamed tensor this many steps apart or closer share one window.
pub const MERGE_GAP: usize = 4;

/// One window of a streamed tensor: the steps (original indices) of its cluster of uses.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pub(crate) host: BufferId,
    pub(crate) first: usize,
    pub(crate) last: usize,
    /// Some step of the cluster writes the tensor (an update, or an activation's producer).
    pub(crate) written: bool,
    /// The cluster's first use writes the whole tensor without reading it (an activation's
    /// producer): nothing is copied in.
    fresh: bool,
    /// Written back after the cluster ([`written_back`]).
    back: bool,
}

impl Window {
    /// Whether a copy fills the window before its cluster: every window of a persistent home;
    /// an offloaded activation's windows after its first (which its producer writes).
    fn copied_in(&self) -> bool {
        !self.fresh
    }
}

/// Whether window `i` of `wins` (one tensor's, in order) is written back: when written, unless
/// its home is a transient activation no later window reads.
fn written_back(wins: &[Window], i: usize, persistent: bool) -> bool {
    wins[i].written && (persistent || wins[i + 1..].iter().any(|w| w.host == wins[i].host))
}

/// One step's use of a buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Use {
    step: usize,
    /// Some argument of the step writes it.
    written: bool,
    /// Every argument of the step that names it is an output: written whole, not read.
    write_only: bool,
}

/// The uses of every buffer in `steps`, per buffer id.
pub(crate) fn uses(bufs: &[Buf], steps: &[Step], kernels: &[Kernel]) -> Vec<Vec<Use>> {
    let mut u: Vec<Vec<Use>> = vec![Vec::new(); bufs.len()];
    for (si, s) in steps.iter().enumerate() {
        let k = &kernels[s.kernel];
        for (&id, p) in s.args.iter().zip(&k.signature.params) {
            let w = p.role != Role::In;
            let out = p.role == Role::Out;
            match u[id].last_mut() {
                Some(last) if last.step == si => {
                    last.written |= w;
                    last.write_only &= out;
                }
                _ => u[id].push(Use {
                    step: si,
                    written: w,
                    write_only: out,
                }),
            }
        }
    }
    u
}

/// A tensor's uses grouped into windows. A transient tensor's first window starts with its
/// producer, which writes it whole (`fresh`: nothing to copy in).
pub(crate) fn windows_of(host: BufferId, b: &Buf, uses: &[Use]) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    for u in uses {
        match out.last_mut() {
            Some(win) if u.step - win.last <= MERGE_GAP => {
                win.last = u.step;
                win.written |= u.written;
            }
            _ => out.push(Window {
                host,
                first: u.step,
                last: u.step,
                written: u.written,
                fresh: out.is_empty() && !b.persistent && u.write_only,
                back: false,
            }),
        }
    }
    for i in 0..out.len() {
        out[i].back = written_back(&out, i, b.persistent);
    }
    out
}

/// Whether `b` may be offloaded: an f32 activation (the copies' dtype; not the output or the
/// loss, which the runtime reads after the step) written whole by its first use and used again after a gap, so that
/// the host holds it between its windows.
fn offloadable(b: &Buf, uses: &[Use]) -> bool {
    b.kind == BufferKind::Activation
        && b.dtype == DType::F32
        && !b.persistent
        && !b.pinned
        && uses.first().is_some_and(|u| u.write_only)
        && uses.windows(2).any(|w| w[1].step - w[0].step > MERGE_GAP)
}

/// The tensors that may stream, in the order they are chosen: parameters and optimizer state
/// that some step uses, and activations held across a gap in their uses (offloaded: written
/// back after the forward, copied in again for the backward), by bytes copied per byte saved
/// (copies in plus write-backs per step), then the larger first, then by id.
/// (`u`: every buffer's [`uses`].)
fn candidates(bufs: &[Buf], u: &[Vec<Use>], offload: bool) -> Vec<BufferId> {
    let mut c: Vec<(usize, u64, BufferId)> = bufs
        .iter()
        .enumerate()
        .filter(|(id, b)| {
            b.bytes > 0
                && !u[*id].is_empty()
                && ((b.persistent
                    && matches!(b.kind, BufferKind::Parameter | BufferKind::OptimizerState))
                    || (offload && offloadable(b, &u[*id])))
        })
        .map(|(id, b)| {
            let w = windows_of(id, b, &u[id]);
            let copies =
                w.iter().filter(|w| w.copied_in()).count() + w.iter().filter(|w| w.back).count();
            (copies, b.bytes, id)
        })
        .collect();
    c.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    c.into_iter().map(|(_, _, id)| id).collect()
}

/// Streams the first `count` of [`candidates`]: their homes go to the host store (offsets there
/// assigned in id order; returns its size), every use reads a window, and the copy steps are
/// inserted (their `ready` set). `bufs`' `first_write` / `last_read` of every buffer are
/// renumbered to the new steps.
pub(crate) fn stream(
    bufs: &mut Vec<Buf>,
    steps: &mut Vec<Step>,
    kernels: &mut Vec<Kernel>,
    count: usize,
    offload: bool,
    prefetch: bool,
) -> u64 {
    let u = uses(bufs, steps, kernels);
    let chosen: Vec<BufferId> = candidates(bufs, &u, offload)
        .into_iter()
        .take(count)
        .collect();
    if chosen.is_empty() {
        return 0;
    }
    let mut wins: Vec<Window> = chosen
        .iter()
        .flat_map(|&id| windows_of(id, &bufs[id], &u[id]))
        .collect();
    wins.sort_by_key(|w| (w.first, w.host));
    let n = steps.len();
    // Where each window's copy goes (before original step `issue[i]`): its first use, or with
    // prefetch the start of the previous cluster (of a distinct first use), never before its
    // tensor's previous window has been written back and that write-back has landed.
    let mut issue: Vec<usize> = wins.iter().map(|w| w.first).collect();
    if prefetch {
        let mut prev_start: Option<usize> = None;
        let mut cur_start: Option<usize> = None;
        for (i, w) in wins.iter().enumerate() {
            if cur_start != Some(w.first) {
                prev_start = cur_start;
                cur_start = Some(w.first);
            }
            if let Some(p) = prev_start {
                issue[i] = p;
            }
        }
    }
    // Per tensor, in window order (by first use): its previous window's last use, and how many
    // windows it has had.
    let mut seen: std::collections::HashMap<BufferId, (usize, usize)> = Default::default();
    let mut ordinal = vec![0usize; wins.len()];
    for (i, w) in wins.iter().enumerate() {
        if let Some(&(prev_last, k)) = seen.get(&w.host) {
            // (MERGE_GAP >= 3: this is still at or before the window's first use)
            issue[i] = issue[i].max(prev_last + 3).min(w.first);
            ordinal[i] = k;
        }
        seen.insert(w.host, (w.last, ordinal[i] + 1));
    }

    // The new step order: before original step `i`, the write-backs of the windows whose last
    // use was `i - 1`, then the copies issued there; after the last step, the last write-backs.
    let mut before: Vec<Vec<(usize, TransferOp)>> = vec![Vec::new(); n + 1];
    for (i, w) in wins.iter().enumerate() {
        if w.back {
            before[w.last + 1].push((i, TransferOp::DeviceToHost));
        }
    }
    for (i, w) in wins.iter().enumerate() {
        if w.copied_in() {
            before[issue[i]].push((i, TransferOp::HostToDevice));
        }
    }
    // (new index, (window, op)) of each inserted step
    let (mut seq, new_of, copies) = splice(std::mem::take(steps), &before);
    let total = seq.len();

    // The windows: new buffers; every use of a streamed tensor reads its window instead.
    let names: Vec<String> = (0..wins.len())
        .map(|i| format!("{} (window {})", bufs[wins[i].host].name, ordinal[i] + 1))
        .collect();
    let window_buf = windows_in(bufs, &mut seq, &new_of, &wins, names, |w, win| {
        if !w.copied_in() {
            // its producer writes it (renumbered below with every range)
            (win.first_write, win.last_read) = (Some(w.first), Some(w.last));
        }
    });
    // The copy steps, their kernels, their `ready`, and the windows' live ranges.
    for &(at, (w, op)) in &copies {
        let win = &wins[w];
        let (host, window) = (win.host, window_buf[w]);
        let shape = vec![(bufs[host].bytes / DType::F32.size() as u64) as usize];
        let kernel = transfer_kernel(kernels, op, &shape);
        let (args, ready, phase_of, verb) = match op {
            TransferOp::HostToDevice => {
                (vec![host, window], new_of[win.first], win.first, "copy in")
            }
            // overlaps the step after its cluster; lands before the next one
            TransferOp::DeviceToHost => (
                vec![window, host],
                new_of[(win.last + 2).min(n)].max(at + 1),
                win.last,
                "write back",
            ),
        };
        let phase = seq[new_of[phase_of]].phase;
        seq[at] = Step {
            kernel,
            args,
            label: format!("{} {verb}", bufs[window].name),
            phase,
            ready: Some(ready),
        };
        let b = &mut bufs[window];
        match op {
            TransferOp::HostToDevice => b.first_write = Some(at),
            TransferOp::DeviceToHost => {}
        }
        let end = match op {
            TransferOp::HostToDevice => new_of[win.last],
            TransferOp::DeviceToHost => ready - 1,
        };
        b.last_read = Some(b.last_read.map_or(end, |e| e.max(end)));
    }
    debug_assert_eq!(seq.len(), total);
    *steps = seq;
    // The homes: the host store, in id order.
    let mut host_bytes = 0u64;
    let mut homes = chosen;
    homes.sort_unstable();
    for id in homes {
        let b = &mut bufs[id];
        b.store = Store::Host;
        b.host_offset = host_bytes;
        host_bytes += crate::placement::align_up(b.bytes);
    }
    host_bytes
}

/// `old` with a placeholder step inserted before original step `i` for each item of `before[i]`
/// (`before[old.len()]`: after the last step). Returns the new steps, the new index of every
/// original step (and of the end), and each placeholder's new index with its item.
pub(crate) fn splice<T: Copy>(
    old: Vec<Step>,
    before: &[Vec<T>],
) -> (Vec<Step>, Vec<usize>, Vec<(usize, T)>) {
    let n = old.len();
    let mut new_of = vec![0usize; n + 1];
    let mut inserted = Vec::new();
    let mut seq: Vec<Step> = Vec::with_capacity(n + before.iter().map(Vec::len).sum::<usize>());
    let mut placed = old.into_iter();
    for (i, items) in before.iter().enumerate().take(n + 1) {
        for &item in items {
            inserted.push((seq.len(), item));
            seq.push(Step {
                kernel: 0, // the caller's
                args: vec![],
                label: String::new(),
                phase: StepPhase::Forward,
                ready: None,
            });
        }
        new_of[i] = seq.len();
        if i < n {
            seq.extend(placed.next());
        }
    }
    (seq, new_of, inserted)
}

/// A window buffer per window of `wins` (named `names[i]`, shaped after its home, `init` given
/// the chance to set its range), every use in its cluster (original steps `first..=last`, at
/// `new_of` in `seq`) pointed at it; then every buffer's range renumbered to the new steps.
/// Returns the windows' buffer ids.
pub(crate) fn windows_in(
    bufs: &mut Vec<Buf>,
    seq: &mut [Step],
    new_of: &[usize],
    wins: &[Window],
    names: Vec<String>,
    init: impl Fn(&Window, &mut Buf),
) -> Vec<BufferId> {
    let mut window_buf = vec![0usize; wins.len()];
    for ((i, w), name) in wins.iter().enumerate().zip(names) {
        let h = &bufs[w.host];
        let mut win = Buf::new(name, h.bytes, h.dtype, h.kind, false);
        init(w, &mut win);
        bufs.push(win);
        window_buf[i] = bufs.len() - 1;
        for si in w.first..=w.last {
            for a in seq[new_of[si]].args.iter_mut() {
                if *a == w.host {
                    *a = window_buf[i];
                }
            }
        }
    }
    for b in bufs.iter_mut() {
        b.first_write = b.first_write.map(|s| new_of[s]);
        b.last_read = b.last_read.map(|s| new_of[s]);
    }
    window_buf
}

/// The kernel of a copy of `shape` (one per direction and shape).
fn transfer_kernel(kernels: &mut Vec<Kernel>, op: TransferOp, shape: &[usize]) -> usize {
    let op = Op::Transfer(op);
    if let Some(k) = kernels
        .iter()
        .position(|k| k.op == op && k.arg_shapes[0] == shape)
    {
        return k;
    }
    let same_kind = kernels.iter().filter(|k| k.op == op).count();
    kernels.push(Kernel {
        id: kernels.len(),
        name: format!("{}_{same_kind}", op.kind_name()),
        arg_shapes: vec![shape.to_vec(), shape.to_vec()],
        signature: op.signature(),
        op,
    });
    kernels.len() - 1
}
