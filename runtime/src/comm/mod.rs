//! Collective communication for data-parallel training: the [`Collective`] interface (point-to-point
//! byte messages between the ranks of one job) and the collectives built on it, on `f32` rows.
//!
//! Three implementations: [`Solo`] (one process, world 1), [`mpi::Mpi`] (MPI, loaded at run time,
//! for `mpirun`-launched jobs) and [`local::LocalComm`] (ranks as threads of one process, for
//! tests). [`open_collective`] picks `Solo` or MPI from the launcher's environment.
//!
//! Every collective is deterministic: its result depends on the ranks' data and the world size,
//! never on timing (a fixed summation order), so two runs of a job give bit-identical results.
//! Every rank must call the same collectives in the same order with the same sizes.

pub mod host;
pub mod local;
pub mod mpi;

use std::ops::{AddAssign, Range};

use dmc_plan::shard::{max_rows, rows};

use crate::error::RuntimeError;

/// Point-to-point messages between the `world` ranks of one job. Every method blocks until its
/// buffers may be reused.
pub trait Collective: Send + Sync {
    /// This process' rank, `0..world()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world(&self) -> usize;
    /// What carries the messages, e.g. "Open MPI (libmpi.so.40)", "single process", "threads".
    fn describe(&self) -> String;
    /// `MPI_Sendrecv` semantics: sends `send` to rank `to` while receiving exactly `recv.len()`
    /// bytes from rank `from`. Does not deadlock when every rank calls it in a ring pattern.
    /// `to`/`from` may equal [`rank`](Self::rank) only if the world is 1 (then it is a copy).
    fn sendrecv(
        &self,
        send: &[u8],
        to: usize,
        recv: &mut [u8],
        from: usize,
    ) -> Result<(), RuntimeError>;
    /// Sends `data` to rank `to` (which receives it with a [`recv`](Self::recv) of the same size).
    fn send(&self, data: &[u8], to: usize) -> Result<(), RuntimeError>;
    /// Receives exactly `data.len()` bytes from rank `from`.
    fn recv(&self, data: &mut [u8], from: usize) -> Result<(), RuntimeError>;
    /// Ends every rank's process (`MPI_Abort`) with exit code `code`, printing nothing itself.
    fn abort(&self, code: i32) -> !;
    /// The bytes this rank has sent so far (what `dmc run` reports against the plan's model,
    /// `dmc_plan::shard::sent_bytes`); 0 where nothing is counted.
    fn sent_bytes(&self) -> u64 {
        0
    }
}

/// The single-process [`Collective`]: world 1, rank 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn describe(&self) -> String {
        "single process".into()
    }
    fn sendrecv(
        &self,
        send: &[u8],
        to: usize,
        recv: &mut [u8],
        from: usize,
    ) -> Result<(), RuntimeError> {
        if to != 0 || from != 0 || send.len() != recv.len() {
            return Err(RuntimeError::Comm(format!(
                "sendrecv of {} bytes to rank {to} and {} bytes from rank {from} in a single-process \
                 run (world 1, rank 0): only a copy to rank 0 of equal size is possible (a bug in \
                 the caller)",
                send.len(),
                recv.len()
            )));
        }
        recv.copy_from_slice(send);
        Ok(())
    }
    fn send(&self, data: &[u8], to: usize) -> Result<(), RuntimeError> {
        Err(RuntimeError::Comm(format!(
            "send of {} bytes to rank {to} in a single-process run: there are no other ranks \
             (launch with mpirun for several)",
            data.len()
        )))
    }
    fn recv(&self, data: &mut [u8], from: usize) -> Result<(), RuntimeError> {
        Err(RuntimeError::Comm(format!(
            "receive of {} bytes from rank {from} in a single-process run: there are no other \
             ranks (launch with mpirun for several)",
            data.len()
        )))
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// The collective for this process: [`Solo`] when no launcher started it (or started one rank),
/// MPI ([`mpi::Mpi::init`]) otherwise, checking that MPI's rank and world size agree with the
/// launcher's environment ([`mpi::launcher_world`]).
pub fn open_collective() -> Result<Box<dyn Collective>, RuntimeError> {
    let Some((rank, world)) = mpi::launcher_world() else {
        return Ok(Box::new(Solo));
    };
    if world <= 1 {
        return Ok(Box::new(Solo));
    }
    let m = mpi::Mpi::init()?;
    if m.rank() != rank || m.world() != world {
        return Err(RuntimeError::Comm(format!(
            "the launcher's environment says rank {rank} of {world}, but {} says rank {} of {}: \
             launch with the mpirun of the MPI that dmc loads (or set DMC_MPI_LIB to the libmpi.so \
             of the mpirun you use)",
            m.describe(),
            m.rank(),
            m.world()
        )));
    }
    Ok(Box::new(m))
}

/// The element types the collectives carry: plain numbers, every bit pattern a valid value.
trait Num: Copy + Default + AddAssign {}
impl Num for f32 {}
impl Num for f64 {}

fn bytes<T: Num>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is f32 or f64 (`Num` is private): no padding, every byte initialised; u8 has
    // alignment 1 and the length is the slice's size in bytes, so the view covers exactly `v`,
    // borrowed for `v`'s lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_mut<T: Num>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes`; in addition every bit pattern is a valid f32/f64, so any bytes
    // written through the view leave valid values, and the unique borrow of `v` is moved into it.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The bytes of `v` (a zero-copy view), for [`Collective::sendrecv`] and friends.
pub fn as_bytes(v: &[f32]) -> &[u8] {
    bytes(v)
}

/// The bytes of `v` (a zero-copy view, writable: every bit pattern is a valid `f32`).
pub fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    bytes_mut(v)
}

/// `a` shared and `b` unique, two disjoint ranges of one slice.
fn split<T>(buf: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    if a.is_empty() {
        return (&[], &mut buf[b]);
    }
    if b.is_empty() {
        return (&buf[a], &mut []);
    }
    debug_assert!(a.end <= b.start || b.end <= a.start, "overlapping ranges");
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.len()])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.len()], &mut lo[b])
    }
}

/// The element range of rank `rank`'s rows.
fn elems(rows_total: usize, row_len: usize, world: usize, rank: usize) -> Range<usize> {
    let r = rows(rows_total, world, rank);
    r.start * row_len..r.end * row_len
}

/// Checks that `buf` holds `rows_total` rows of `row_len` for the collective `what`; whether there
/// is anything to exchange (more than one rank).
fn exchanges(
    c: &dyn Collective,
    what: &str,
    buf: usize,
    row_len: usize,
    rows_total: usize,
) -> Result<bool, RuntimeError> {
    check_len(what, buf, rows_total * row_len, "rows_total * row_len")?;
    Ok(c.world() > 1)
}

fn check_len(what: &str, have: usize, need: usize, hint: &str) -> Result<(), RuntimeError> {
    if have < need {
        return Err(RuntimeError::Comm(format!(
            "{what}: the buffer holds {have} elements but needs {need} ({hint}; a bug in the caller)"
        )));
    }
    Ok(())
}

/// Sums the ranks' `[rows_total, row_len]` row-major blocks, each rank getting the sum of its own
/// rows ([`rows`]`(rows_total, world, rank)`); the other rows of `buf` are left unspecified.
///
/// `buf` holds this rank's contribution (all rows) on entry. `tmp` holds at least
/// [`max_rows`]`(rows_total, world) * row_len` elements. The sum is deterministic: on rank `r`,
/// its own contribution first, then those of ranks `r-1, r-2, ...` (mod world). Each of the
/// `world - 1` rounds sends one shard to one peer: `(world-1)/world` of the buffer in all.
pub fn reduce_scatter_rows(
    c: &dyn Collective,
    buf: &mut [f32],
    row_len: usize,
    rows_total: usize,
    tmp: &mut [f32],
) -> Result<(), RuntimeError> {
    if !exchanges(c, "reduce_scatter_rows", buf.len(), row_len, rows_total)? {
        return Ok(());
    }
    let (world, me) = (c.world(), c.rank());
    let need = max_rows(rows_total, world) * row_len;
    check_len(
        "reduce_scatter_rows tmp",
        tmp.len(),
        need,
        "max_rows(rows_total, world) * row_len",
    )?;
    let mine = elems(rows_total, row_len, world, me);
    let tmp = &mut tmp[..mine.len()];
    for k in 1..world {
        let to = (me + k) % world;
        let from = (me + world - k) % world;
        let send = &buf[elems(rows_total, row_len, world, to)];
        c.sendrecv(bytes(send), to, bytes_mut(tmp), from)?;
        for (b, t) in buf[mine.clone()].iter_mut().zip(tmp.iter()) {
            *b += *t;
        }
    }
    Ok(())
}

/// [`reduce_scatter_rows`] out of place: `acc` (this rank's rows' elements) receives the sum over
/// the ranks of their `src`'s rows of this rank, in the same fixed order (own first, then the
/// rounds' peers); `src` is only read. `tmp` holds at least as many elements as `acc`.
pub fn reduce_rows_into(
    c: &dyn Collective,
    src: &[f32],
    (row_len, rows_total): (usize, usize),
    acc: &mut [f32],
    tmp: &mut [f32],
) -> Result<(), RuntimeError> {
    let (world, me) = (c.world(), c.rank());
    let mine = elems(rows_total, row_len, world, me);
    check_len(
        "reduce_rows_into",
        src.len(),
        rows_total * row_len,
        "rows_total * row_len",
    )?;
    check_len(
        "reduce_rows_into acc",
        acc.len(),
        mine.len(),
        "this rank's rows",
    )?;
    check_len(
        "reduce_rows_into tmp",
        tmp.len(),
        mine.len(),
        "this rank's rows",
    )?;
    let (acc, got) = (&mut acc[..mine.len()], &mut tmp[..mine.len()]);
    acc.copy_from_slice(&src[mine]);
    for k in 1..world {
        let (to, from) = ((me + k) % world, (me + world - k) % world);
        let send = &src[elems(rows_total, row_len, world, to)];
        c.sendrecv(bytes(send), to, bytes_mut(got), from)?;
        for (a, v) in acc.iter_mut().zip(got.iter()) {
            *a += *v;
        }
    }
    Ok(())
}

/// Before: rank `r`'s rows ([`rows`]`(rows_total, world, r)`) of `buf` are valid on rank `r`.
/// After: all `rows_total` rows are valid on every rank (pairwise exchange, in place).
pub fn all_gather_rows(
    c: &dyn Collective,
    buf: &mut [f32],
    row_len: usize,
    rows_total: usize,
) -> Result<(), RuntimeError> {
    if !exchanges(c, "all_gather_rows", buf.len(), row_len, rows_total)? {
        return Ok(());
    }
    let (world, me) = (c.world(), c.rank());
    let mine = elems(rows_total, row_len, world, me);
    for k in 1..world {
        let to = (me + k) % world;
        let from = (me + world - k) % world;
        let theirs = elems(rows_total, row_len, world, from);
        let (send, recv) = split(buf, mine.clone(), theirs);
        c.sendrecv(bytes(send), to, bytes_mut(recv), from)?;
    }
    Ok(())
}

/// Like [`all_gather_rows`], but only rank 0 ends with all rows (the others send theirs to rank
/// 0, their `buf` unchanged): for saving a checkpoint from rank 0.
pub fn gather_rows_to_root(
    c: &dyn Collective,
    buf: &mut [f32],
    row_len: usize,
    rows_total: usize,
) -> Result<(), RuntimeError> {
    if !exchanges(c, "gather_rows_to_root", buf.len(), row_len, rows_total)? {
        return Ok(());
    }
    let (world, me) = (c.world(), c.rank());
    if me == 0 {
        for p in 1..world {
            c.recv(bytes_mut(&mut buf[elems(rows_total, row_len, world, p)]), p)?;
        }
    } else {
        c.send(bytes(&buf[elems(rows_total, row_len, world, me)]), 0)?;
    }
    Ok(())
}

/// Sums `buf` over all ranks, every rank ending with bit-identical values: the sum in rank order
/// `0, 1, ..., world-1`. For small buffers (a loss, metric counts): every rank receives every
/// other rank's whole buffer.
pub fn all_reduce_sum(c: &dyn Collective, buf: &mut [f32]) -> Result<(), RuntimeError> {
    all_reduce(c, buf)
}

/// [`all_reduce_sum`] on `f64`.
pub fn all_reduce_sum_f64(c: &dyn Collective, buf: &mut [f64]) -> Result<(), RuntimeError> {
    all_reduce(c, buf)
}

fn all_reduce<T: Num>(c: &dyn Collective, buf: &mut [T]) -> Result<(), RuntimeError> {
    let (world, me, n) = (c.world(), c.rank(), buf.len());
    if world <= 1 || n == 0 {
        return Ok(());
    }
    let mut all = vec![T::default(); world * n];
    all[me * n..(me + 1) * n].copy_from_slice(buf);
    for k in 1..world {
        let to = (me + k) % world;
        let from = (me + world - k) % world;
        c.sendrecv(
            bytes(buf),
            to,
            bytes_mut(&mut all[from * n..(from + 1) * n]),
            from,
        )?;
    }
    buf.copy_from_slice(&all[..n]);
    for part in all[n..].chunks_exact(n) {
        for (b, x) in buf.iter_mut().zip(part) {
            *b += *x;
        }
    }
    Ok(())
}

/// Returns once every rank has called it (an [`all_reduce_sum`] of one value).
pub fn barrier(c: &dyn Collective) -> Result<(), RuntimeError> {
    all_reduce_sum(c, &mut [0.0])
}
