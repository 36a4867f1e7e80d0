//! The host arena: one 64-byte aligned, zero-initialised allocation of a plan's `arena_bytes`,
//! shared by the CPU backend (which executes in it), the emulated CUDA backend (whose kernels run
//! in it) and the CPU reference of single kernels.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use dmc_plan::plan::ALIGN;

use crate::error::RuntimeError;

/// The arena: one 64-byte aligned, zero-initialised allocation.
pub(crate) struct Arena {
    pub(crate) ptr: NonNull<u8>,
    layout: Layout,
    /// What the counting allocator ([`crate::alloc`]) counted for this one allocation, when it is
    /// the global allocator: the arena's memory as measured, apart from the backend's other state.
    measured: Option<u64>,
}

impl Arena {
    /// Allocates `bytes` zeroed bytes. An arena larger than the machine's physical memory is
    /// refused up front (the allocation could succeed lazily and the process be killed later).
    pub(crate) fn new(bytes: u64) -> Result<Self, RuntimeError> {
        let memory = crate::alloc::physical_memory();
        if let Some(mem) = memory.filter(|&m| bytes > m) {
            return Err(RuntimeError::ArenaTooLarge { bytes, memory: mem });
        }
        let size = usize::try_from(bytes)
            .map_err(|_| RuntimeError::Alloc { bytes })?
            .max(1);
        let layout = Layout::from_size_align(size, ALIGN as usize)
            .map_err(|_| RuntimeError::Alloc { bytes })?;
        let before = crate::alloc::thread_allocated();
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or(RuntimeError::Alloc { bytes })?;
        // Without the counting allocator installed the counter does not move. This thread's own
        // count: the process-wide one moved by less than the arena when another thread freed
        // meanwhile (then the arena went unmeasured, and `dmc run` counted the host store too).
        let grown = crate::alloc::thread_allocated().saturating_sub(before) as u64;
        let measured = (grown >= size as u64).then_some(grown);
        Ok(Arena {
            ptr,
            layout,
            measured,
        })
    }

    /// The bytes the counting allocator counted for the arena's allocation; `None` when the
    /// counting allocator is not the global allocator.
    pub(crate) fn measured_bytes(&self) -> Option<u64> {
        self.measured
    }

    /// The whole allocation.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` addresses `layout.size()` initialised (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The whole allocation, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `Arena::new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the arena is uniquely owned memory (like a `Box<[u8]>`); access goes through `&self` /
// `&mut self` of the backend.
unsafe impl Send for Arena {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for Arena {}
