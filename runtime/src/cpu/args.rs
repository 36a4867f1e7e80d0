//! One step's arguments as the CPU kernels see them: [`Args`] takes each argument by its signature
//! slot (shared or mutable slices of the arena, by the slot's role), [`Ctx`] what a step reads
//! besides them. Shared by the executor and every family's `exec`.

use dmc_plan::plan::{Buffer, Kernel, Mode, Step, Store};
use dmc_plan::update::UpdateRule;

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// What a step reads besides its arguments: the 1-based training step and the seed (Adam's `t`,
/// the dropout key), the step's learning rate and the plan's mode (dropout is the identity in
/// `Eval`).
pub(super) struct Ctx {
    pub(super) step_counter: u64,
    pub(super) seed: u64,
    pub(super) lr: f32,
    pub(super) mode: Mode,
    /// The ranks a data-parallel plan's sharded updates run with (`None`: this process alone).
    pub(super) comm: Option<std::sync::Arc<dyn crate::comm::Collective>>,
}

impl Ctx {
    /// An op's update rule at this step: with the step's learning rate.
    pub(super) fn rule(&self, rule: &UpdateRule) -> UpdateRule {
        rule.with_lr(self.lr)
    }

    /// Where this rank's part of a tensor of `elems` elements starts in the global batch's
    /// (a data-parallel rank holds part `rank` of `world` equal parts of every batch tensor; 0
    /// alone).
    pub(super) fn batch_offset(&self, elems: usize) -> u64 {
        self.comm.as_ref().map_or(0, |c| (c.rank() * elems) as u64)
    }
}

/// One step's arguments: the arena base (and the host store's, for streamed tensors), the plan's
/// buffers, the step and its kernel.
pub(super) struct Args<'p> {
    pub(super) base: *mut u8,
    /// The host store's base ([`Store::Host`] buffers; null when the plan has none).
    pub(super) host: *mut u8,
    pub(super) buffers: &'p [Buffer],
    pub(super) kernel: &'p Kernel,
    pub(super) step: &'p Step,
}

impl<'p> Args<'p> {
    pub(super) fn shape(&self, i: usize) -> &'p [usize] {
        &self.kernel.arg_shapes[i]
    }
    pub(super) fn ptr(&self, i: usize) -> *mut u8 {
        let b = &self.buffers[self.step.args[i]];
        let base = match b.store {
            Store::Arena => self.base,
            Store::Host => self.host,
        };
        // SAFETY: the offset was validated to lie inside the arena (or the host store, whose
        // buffers only copy steps take).
        unsafe { base.add(b.offset as usize) }
    }
    /// # Safety
    /// Argument `i` must be a validated f32 argument not written through another slice meanwhile.
    pub(super) unsafe fn f32<'a>(&self, i: usize) -> &'a [f32] {
        // SAFETY: per the caller's contract and `validate` (aligned, in bounds, large enough).
        unsafe { std::slice::from_raw_parts(self.ptr(i) as *const f32, numel(self.shape(i))) }
    }
    /// # Safety
    /// Argument `i` must be a validated written f32 argument that overlaps no other argument.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn f32_mut<'a>(&self, i: usize) -> &'a mut [f32] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(i) as *mut f32, numel(self.shape(i))) }
    }
    /// # Safety
    /// As `f32`, for an i32 argument.
    pub(super) unsafe fn i32<'a>(&self, i: usize) -> &'a [i32] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts(self.ptr(i) as *const i32, numel(self.shape(i))) }
    }
    /// # Safety
    /// As `f32_mut`, for an i32 argument.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn i32_mut<'a>(&self, i: usize) -> &'a mut [i32] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(i) as *mut i32, numel(self.shape(i))) }
    }
    /// # Safety
    /// As `f32`, for a u8 argument.
    pub(super) unsafe fn u8<'a>(&self, i: usize) -> &'a [u8] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts(self.ptr(i) as *const u8, numel(self.shape(i))) }
    }
    /// # Safety
    /// As `f32_mut`, for a u8 argument.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn u8_mut<'a>(&self, i: usize) -> &'a mut [u8] {
        // SAFETY: per the caller's contract and `validate`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(i), numel(self.shape(i))) }
    }
}

/// The optimizer-state arguments `first..first+n` (n <= 2) as mutable slices, without allocating
/// (the unused entries are empty).
///
/// # Safety
/// As [`Args::f32_mut`] for each of those arguments (validated `InOut` slots, pairwise disjoint).
pub(super) unsafe fn state_slices<'a>(a: &Args, first: usize, n: usize) -> [&'a mut [f32]; 2] {
    let mut out: [&'a mut [f32]; 2] = [&mut [], &mut []];
    for (i, o) in out.iter_mut().enumerate().take(n) {
        // SAFETY: per this function's contract.
        *o = unsafe { a.f32_mut(first + i) };
    }
    out
}
