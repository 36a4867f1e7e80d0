//! The collectives of a sharded kernel's program ([`dmc_codegen::Collective`]) on host memory,
//! with this crate's host collectives: what the CUDA emulator runs between the launches where the
//! CUDA backend calls NCCL. The same functions as the CPU backend's sharded steps, so the three
//! backends agree on the order of every sum.

use dmc_codegen::{Collective as Coll, Region};
use dmc_plan::shard::{max_rows, rows};

use super::{
    all_gather_rows, all_reduce_sum_f64, reduce_rows_into, reduce_scatter_rows, Collective,
};
use crate::error::RuntimeError;

/// `n` f32 at `region` of a kernel whose argument pointers are `ptrs`.
///
/// # Safety
/// `ptrs[region.slot] + 4 * region.at` must address `n` valid, initialised f32 of host memory
/// that nothing else reads or writes while the slice lives.
unsafe fn slice<'a>(ptrs: &[u64], region: Region, n: usize) -> Result<&'a mut [f32], RuntimeError> {
    let p = ptrs.get(region.slot).ok_or_else(|| {
        RuntimeError::BadPlan(format!(
            "a collective names argument {} of a kernel with {} arguments",
            region.slot,
            ptrs.len()
        ))
    })?;
    let p = (*p as *mut f32).wrapping_add(region.at);
    // SAFETY: per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

/// Runs `op` among `c`'s ranks on the host buffers `ptrs` (one per signature slot).
///
/// # Safety
/// Each pointer must address host memory at least as large as its argument (per the kernel's
/// shapes, which sized the collective), distinct arguments must not overlap, and nothing else may
/// touch them during the call.
pub unsafe fn run(c: &dyn Collective, op: &Coll, ptrs: &[u64]) -> Result<(), RuntimeError> {
    let (world, me) = (c.world(), c.rank());
    // SAFETY: (every `slice` below) the regions lie in distinct arguments sized by the plan for
    // these collectives (the caller's contract).
    unsafe {
        match *op {
            Coll::ReduceScatterRows {
                buf,
                rows: n,
                cols,
                tmp,
            } => reduce_scatter_rows(
                c,
                slice(ptrs, buf, n * cols)?,
                cols,
                n,
                slice(ptrs, tmp, max_rows(n, world) * cols)?,
            ),
            Coll::ReduceInto { src, n, dst, tmp } => {
                let mine = rows(n, world, me).len();
                reduce_rows_into(
                    c,
                    slice(ptrs, src, n)?,
                    (1, n),
                    slice(ptrs, dst, mine)?,
                    slice(ptrs, tmp, max_rows(n, world))?,
                )
            }
            Coll::AllGatherRows { buf, rows: n, cols } => {
                all_gather_rows(c, slice(ptrs, buf, n * cols)?, cols, n)
            }
            Coll::AllReduce { buf, n, tmp } => {
                let b = slice(ptrs, buf, n)?;
                reduce_scatter_rows(c, b, 1, n, slice(ptrs, tmp, max_rows(n, world))?)?;
                all_gather_rows(c, b, 1, n)
            }
            Coll::AllReduceF64 { buf, n } => {
                let f = slice(ptrs, buf, 2 * n)?;
                let p = f.as_mut_ptr().cast::<f64>();
                if !p.is_aligned() {
                    return Err(RuntimeError::BadPlan(format!(
                        "an f64 all-reduce at {p:?}, not 8-byte aligned"
                    )));
                }
                // the f32 slice's 8 n bytes as n f64 (aligned, checked; any bits are an f64)
                all_reduce_sum_f64(c, std::slice::from_raw_parts_mut(p, n))
            }
        }
    }
}
