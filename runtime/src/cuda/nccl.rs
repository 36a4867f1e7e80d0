//! NCCL for the CUDA backend's data-parallel steps: the collectives of a sharded kernel's program
//! ([`dmc_codegen::Collective`]) on device memory, queued on the compute stream between the
//! program's launches, so a rank's step is one stream of work, as alone.
//!
//! NCCL is loaded at run time (`libloading`, like the MPI of the host collectives): `$DMC_NCCL`
//! when set (a path), else NCCL's own soname `libnccl.so.2` (the distribution's `libnccl2` package
//! and the `nvidia-nccl-cu12` wheel PyTorch installs, searched in the Python environments as NVRTC
//! is), else `libnccl.so`. (cudarc's NCCL bindings look for `libnccl.so` and CUDA-versioned names
//! only, never `libnccl.so.2`, and panic when none loads; the handful of entry points dmc needs
//! are declared here instead, with NCCL 2's stable ABI.)
//!
//! The communicator is bootstrapped over the job's host [`Collective`] (MPI under `mpirun`): rank
//! 0 makes the unique id and sends it to every other rank, then every rank joins with
//! `ncclCommInitRank`. Rows of uneven size are what [`dmc_plan::shard::rows`] gives each rank, so a
//! reduce-scatter is one `ncclReduce` per rank (rooted at the rank that owns the rows) and a
//! gather one `ncclBroadcast` per rank, each set in one NCCL group. NCCL's reductions are
//! deterministic for a given job (same ranks, same topology), so a run is reproducible.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;

use dmc_codegen::{Collective as Coll, Region};
use dmc_plan::shard::rows;
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use super::CudaError;
use crate::comm::Collective;

/// NCCL's `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

type Comm = *mut c_void;
type Stream = *mut c_void;
/// `ncclFloat32`
const FLOAT32: c_int = 7;
/// `ncclFloat64`
const FLOAT64: c_int = 8;
/// `ncclSum`
const SUM: c_int = 0;

#[rustfmt::skip]
struct Api {
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(Comm) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, Stream) -> c_int,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int,
}

/// The libraries tried, in order, when `DMC_NCCL` is not set (bare names: the loader's search).
pub const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// The places NCCL is looked for: `$DMC_NCCL`, the Python environments' `nvidia/nccl/lib`, then
/// the bare names.
pub fn candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("DMC_NCCL") {
        return vec![PathBuf::from(p)];
    }
    let mut out: Vec<PathBuf> = super::nvrtc_search::python_dirs("nvidia/nccl/lib")
        .into_iter()
        .map(|d| d.join(LIBRARY_NAMES[0]))
        .filter(|f| f.is_file())
        .collect();
    out.extend(LIBRARY_NAMES.iter().map(PathBuf::from));
    out
}

/// One rank's NCCL communicator (destroyed on drop).
pub struct Nccl {
    api: Api,
    comm: Comm,
    world: usize,
    /// e.g. "NCCL 2.21.5 (libnccl.so.2)"
    pub name: String,
    _lib: Library,
}

// SAFETY: the communicator is used from one thread at a time (`&mut` backend methods or the
// backend's own thread); NCCL communicators may move between threads.
unsafe impl Send for Nccl {}

fn err(what: &str, message: String) -> CudaError {
    CudaError::Driver {
        what: what.into(),
        message,
    }
}

impl Nccl {
    /// Loads NCCL and joins the job of `host` (every rank calls this at the same point) on the
    /// current device.
    pub fn init(host: &dyn Collective) -> Result<Nccl, CudaError> {
        Self::init_from(host, &candidates())
    }

    /// [`Nccl::init`] with the first of `tried` that loads and is NCCL 2.
    pub fn init_from(host: &dyn Collective, tried: &[PathBuf]) -> Result<Nccl, CudaError> {
        let mut failures = Vec::new();
        let mut found = None;
        for c in tried {
            // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
            match unsafe { Library::open(Some(c), RTLD_NOW | RTLD_GLOBAL) } {
                Ok(lib) => {
                    found = Some((lib, c.display().to_string()));
                    break;
                }
                Err(e) => failures.push(format!("{}: {e}", c.display())),
            }
        }
        let Some((lib, path)) = found else {
            return Err(err(
                "loading NCCL",
                format!(
                    "no NCCL library loads ({}): install NCCL (`pip install nvidia-nccl-cu12`, or \
                     the distribution's libnccl2) or set DMC_NCCL to its libnccl.so.2",
                    failures.join("; ")
                ),
            ));
        };
        let api = load(&lib, &path)?;
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out-pointer.
        unsafe { (api.get_version)(&mut version) };
        let (major, minor, patch) = if version >= 10000 {
            (version / 10000, version % 10000 / 100, version % 100)
        } else {
            (version / 1000, version % 1000 / 100, version % 100)
        };
        let mut id = UniqueId { internal: [0; 128] };
        let id_bytes = |id: &mut UniqueId| -> &mut [u8] {
            // SAFETY: the id is 128 plain bytes, borrowed uniquely for the view's lifetime.
            unsafe { std::slice::from_raw_parts_mut(id.internal.as_mut_ptr().cast::<u8>(), 128) }
        };
        let (rank, world) = (host.rank(), host.world());
        if rank == 0 {
            // SAFETY: `id` is a valid out-pointer.
            check(&api, "ncclGetUniqueId", unsafe {
                (api.get_unique_id)(&mut id)
            })?;
            for r in 1..world {
                host.send(id_bytes(&mut id), r)
                    .map_err(|e| err("sending the NCCL id", e.to_string()))?;
            }
        } else {
            host.recv(id_bytes(&mut id), 0)
                .map_err(|e| err("receiving the NCCL id", e.to_string()))?;
        }
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; every rank passes the same id and world.
        check(&api, "ncclCommInitRank", unsafe {
            (api.comm_init_rank)(&mut comm, world as c_int, id, rank as c_int)
        })?;
        Ok(Nccl {
            api,
            comm,
            world,
            name: format!("NCCL {major}.{minor}.{patch} ({path})"),
            _lib: lib,
        })
    }

    /// Queues `op` on `stream` over the kernel arguments `ptrs` (device pointers, one per
    /// signature slot).
    ///
    /// # Safety
    /// Each pointer must address device memory at least as large as its argument (per the
    /// kernel's shapes, which sized the collective), and `stream` must be a stream of the current
    /// context.
    pub unsafe fn run(&self, op: &Coll, ptrs: &[u64], stream: Stream) -> Result<(), CudaError> {
        let at = |r: Region, e: usize| -> Result<*mut c_void, CudaError> {
            let p = ptrs.get(r.slot).ok_or_else(|| {
                err(
                    "a collective",
                    format!("argument {} of {}", r.slot, ptrs.len()),
                )
            })?;
            Ok((*p + 4 * (r.at + e) as u64) as *mut c_void)
        };
        let (api, comm) = (&self.api, self.comm);
        match *op {
            // each rank's rows reduced onto it, in place
            Coll::ReduceScatterRows {
                buf, rows: n, cols, ..
            } => self.group(|| {
                for r in 0..self.world {
                    let e = rows(n, self.world, r);
                    if e.is_empty() {
                        continue;
                    }
                    let p = at(buf, e.start * cols)?;
                    // SAFETY: `p` addresses the rows of `buf` (this function's contract).
                    check(api, "ncclReduce", unsafe {
                        (api.reduce)(p, p, e.len() * cols, FLOAT32, SUM, r as c_int, comm, stream)
                    })?;
                }
                Ok(())
            }),
            // each rank's elements of `src` reduced into its `dst`
            Coll::ReduceInto { src, n, dst, .. } => self.group(|| {
                for r in 0..self.world {
                    let e = rows(n, self.world, r);
                    if e.is_empty() {
                        continue;
                    }
                    let (s, d) = (at(src, e.start)?, at(dst, 0)?);
                    // SAFETY: `s` addresses `e.len()` elements of `src`, `d` as many of `dst` on
                    // the root (this function's contract; `dst` holds the largest rank's part).
                    check(api, "ncclReduce", unsafe {
                        (api.reduce)(s, d, e.len(), FLOAT32, SUM, r as c_int, comm, stream)
                    })?;
                }
                Ok(())
            }),
            // each rank's rows broadcast from it, in place
            Coll::AllGatherRows { buf, rows: n, cols } => self.group(|| {
                for r in 0..self.world {
                    let e = rows(n, self.world, r);
                    if e.is_empty() {
                        continue;
                    }
                    let p = at(buf, e.start * cols)?;
                    // SAFETY: `p` addresses the rows of `buf` (this function's contract).
                    check(api, "ncclBroadcast", unsafe {
                        (api.broadcast)(p, p, e.len() * cols, FLOAT32, r as c_int, comm, stream)
                    })?;
                }
                Ok(())
            }),
            Coll::AllReduce { buf, n, .. } => {
                let p = at(buf, 0)?;
                // SAFETY: `p` addresses the `n` elements of `buf` (this function's contract).
                unsafe { self.all_reduce(p as u64, n, stream) }
            }
            Coll::AllReduceF64 { buf, n } => {
                let p = at(buf, 0)?;
                // SAFETY: `p` addresses the `n` f64 of `buf` (this function's contract).
                check(api, "ncclAllReduce", unsafe {
                    (api.all_reduce)(p, p, n, FLOAT64, SUM, comm, stream)
                })
            }
        }
    }

    /// Sums the `n` f32 at device address `p` over the ranks, in place, on `stream`.
    ///
    /// # Safety
    /// `p` must address `n` f32 of device memory; `stream` a stream of the current context.
    pub unsafe fn all_reduce(&self, p: u64, n: usize, stream: Stream) -> Result<(), CudaError> {
        let p = p as *mut c_void;
        // SAFETY: per this function's contract.
        check(&self.api, "ncclAllReduce", unsafe {
            (self.api.all_reduce)(p, p, n, FLOAT32, SUM, self.comm, stream)
        })
    }

    fn group(&self, f: impl FnOnce() -> Result<(), CudaError>) -> Result<(), CudaError> {
        // SAFETY: no arguments; a group only batches the calls made inside it.
        check(&self.api, "ncclGroupStart", unsafe {
            (self.api.group_start)()
        })?;
        let r = f();
        // SAFETY: as above; ended whether or not a call failed, so NCCL leaves the group.
        let end = check(&self.api, "ncclGroupEnd", unsafe { (self.api.group_end)() });
        r.and(end)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: the communicator was initialised by `init` and is not used after this.
        unsafe { (self.api.comm_destroy)(self.comm) };
    }
}

fn check(api: &Api, what: &str, rc: c_int) -> Result<(), CudaError> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static NUL-terminated string for any result code.
    let msg = unsafe { CStr::from_ptr((api.get_error_string)(rc)) }
        .to_string_lossy()
        .into_owned();
    Err(err(what, format!("NCCL error {rc}: {msg}")))
}

/// Resolves the entry points of `lib` (loaded from `path`).
fn load(lib: &Library, path: &str) -> Result<Api, CudaError> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is NCCL 2's entry point of this name, declared in `Api` with its C
            // signature; the library stays loaded as long as the `Nccl` that holds both.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                err(
                    "loading NCCL",
                    format!("{path} has no `{}` ({e}): is it NCCL 2?", $name),
                )
            })?
        };
    }
    Ok(Api {
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_destroy: sym!("ncclCommDestroy"),
        get_error_string: sym!("ncclGetErrorString"),
        get_version: sym!("ncclGetVersion"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        reduce: sym!("ncclReduce"),
        broadcast: sym!("ncclBroadcast"),
        all_reduce: sym!("ncclAllReduce"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Solo;

    /// No NCCL: a clear error that says what was tried and how to install it, never a panic.
    #[test]
    fn a_missing_nccl_is_a_clear_error() {
        let e = Nccl::init_from(&Solo, &[PathBuf::from("/nonexistent/libnccl.so.2")])
            .err()
            .expect("no NCCL there")
            .to_string();
        assert!(
            e.contains("/nonexistent/libnccl.so.2") && e.contains("DMC_NCCL") && e.contains("pip"),
            "{e}"
        );
    }

    /// A library that is not NCCL (the C library): refused by its missing entry points.
    #[test]
    fn a_library_that_is_not_nccl_is_refused() {
        let e = Nccl::init_from(&Solo, &[PathBuf::from("libc.so.6")])
            .err()
            .expect("libc is not NCCL")
            .to_string();
        assert!(e.contains("ncclGetUniqueId") && e.contains("NCCL 2"), "{e}");
    }
}
