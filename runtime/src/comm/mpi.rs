//! [`Mpi`]: the [`Collective`] of an `mpirun`-launched job, with MPI loaded at run time
//! (`libloading`; no MPI at build time).
//!
//! The library is `$DMC_MPI_LIB` when set (a path), else the first of `libmpi.so.40` (Open MPI),
//! `libmpi.so.12` (MPICH and its derivatives) and `libmpi.so` the system loader finds. It is
//! opened with `RTLD_NOW | RTLD_GLOBAL`: Open MPI's plugins (`mca_*.so`, opened by libmpi itself)
//! resolve libmpi's symbols globally. Two ABIs: Open MPI's (handles are pointers to its predefined
//! objects: `MPI_COMM_WORLD` is `&ompi_mpi_comm_world`), recognised by that symbol, and MPICH's
//! (handles are C ints) for everything else.
//!
//! Messages go as `MPI_BYTE`s in pieces of at most 1 GiB (an MPI count is a C int), all with tag
//! 0; `$DMC_MPI_PIECE_BYTES` sets a smaller piece (to test the splitting). Empty messages are not
//! sent: both sides know the size. MPI is initialised with `MPI_THREAD_SERIALIZED` (whatever level
//! it grants: Open MPI and MPICH support it) and every call holds a lock, so the [`Collective`]
//! may be shared between threads.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use super::Collective;
use crate::error::RuntimeError;

/// The libraries tried, in order, when `DMC_MPI_LIB` is not set.
pub const LIBRARY_NAMES: [&str; 3] = ["libmpi.so.40", "libmpi.so.12", "libmpi.so"];

/// The largest message piece: 1 GiB.
const PIECE: usize = 1 << 30;
const TAG: c_int = 0;
const MPI_THREAD_SERIALIZED: c_int = 2; // the same in Open MPI and MPICH

type Status = *mut c_void;
/// `MPI_Sendrecv(sendbuf, count, type, dest, tag, recvbuf, count, type, source, tag, comm, status)`
#[rustfmt::skip]
type SendrecvFn<H> = unsafe extern "C" fn(
    *const c_void, c_int, H, c_int, c_int, *mut c_void, c_int, H, c_int, c_int, H, Status,
) -> c_int;

/// The entry points whose types depend on the ABI's handle type `H` (`MPI_Comm`, `MPI_Datatype`).
struct Api<H: Copy> {
    world: H,
    byte: H,
    status_ignore: Status,
    comm_rank: unsafe extern "C" fn(H, *mut c_int) -> c_int,
    comm_size: unsafe extern "C" fn(H, *mut c_int) -> c_int,
    sendrecv: SendrecvFn<H>,
    send: unsafe extern "C" fn(*const c_void, c_int, H, c_int, c_int, H) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, c_int, H, c_int, c_int, H, Status) -> c_int,
    abort: unsafe extern "C" fn(H, c_int) -> c_int,
}

enum Abi {
    OpenMpi(Api<*mut c_void>),
    Mpich(Api<c_int>),
}

/// Runs `$body` with `$a` bound to the ABI's `Api`.
macro_rules! with_api {
    ($abi:expr, $a:ident => $body:expr) => {
        match $abi {
            Abi::OpenMpi($a) => $body,
            Abi::Mpich($a) => $body,
        }
    };
}

/// An MPI job's `MPI_COMM_WORLD` (see the module docs).
pub struct Mpi {
    abi: Abi,
    finalize: unsafe extern "C" fn() -> c_int,
    finalized: unsafe extern "C" fn(*mut c_int) -> c_int,
    /// Whether `init` initialised MPI (then `drop` finalises it).
    ours: bool,
    rank: usize,
    world: usize,
    name: String,
    piece: usize,
    lock: Mutex<()>,
    /// Bytes sent so far ([`Collective::sent_bytes`]).
    sent: AtomicU64,
    /// Keeps the library loaded while the function pointers above are used.
    _lib: Library,
}

// SAFETY: the handles are addresses of (or indices into) MPI's process-wide predefined objects,
// valid from any thread; MPI is initialised with MPI_THREAD_SERIALIZED and every call after
// `init` holds `lock`, so no two threads call MPI at once.
unsafe impl Send for Mpi {}
// SAFETY: as above.
unsafe impl Sync for Mpi {}

fn comm_err(msg: String) -> RuntimeError {
    RuntimeError::Comm(msg)
}

fn open_library() -> Result<(Library, String), RuntimeError> {
    if let Some(p) = std::env::var_os("DMC_MPI_LIB").filter(|p| !p.is_empty()) {
        let p = p.to_string_lossy().into_owned();
        // SAFETY: loading libmpi runs its initialisers, which have no preconditions.
        return match unsafe { Library::open(Some(&p), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => Ok((lib, p)),
            Err(e) => Err(comm_err(format!(
                "MPI was not found: DMC_MPI_LIB={p} cannot be opened ({e}). Set DMC_MPI_LIB to \
                 the path of your libmpi.so, or unset it to look for {} (install Open MPI: \
                 `apt install openmpi-bin`)",
                LIBRARY_NAMES.join(", ")
            ))),
        };
    }
    let mut tried = Vec::new();
    for n in LIBRARY_NAMES {
        // SAFETY: loading libmpi runs its initialisers, which have no preconditions.
        match unsafe { Library::open(Some(n), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => return Ok((lib, n.to_string())),
            Err(e) => tried.push(format!("{n} ({e})")),
        }
    }
    Err(comm_err(format!(
        "MPI was not found (a run of several ranks needs it): tried {}. Install Open MPI \
         (`apt install openmpi-bin`) or set DMC_MPI_LIB to the path of your libmpi.so",
        tried.join(", ")
    )))
}

fn bind<H: Copy>(
    lib: &Library,
    name: &str,
    world: H,
    byte: H,
    status_ignore: Status,
) -> Result<Api<H>, RuntimeError> {
    macro_rules! sym {
        ($s:literal) => {
            // SAFETY: the symbol has this C signature in the MPI standard (mpi.h), with `H` the
            // handle type of this library's ABI (checked by the caller).
            *unsafe { lib.get($s) }.map_err(|e| missing(name, $s, e))?
        };
    }
    Ok(Api {
        world,
        byte,
        status_ignore,
        comm_rank: sym!(b"MPI_Comm_rank\0"),
        comm_size: sym!(b"MPI_Comm_size\0"),
        sendrecv: sym!(b"MPI_Sendrecv\0"),
        send: sym!(b"MPI_Send\0"),
        recv: sym!(b"MPI_Recv\0"),
        abort: sym!(b"MPI_Abort\0"),
    })
}

fn missing(lib: &str, sym: &[u8], e: libloading::Error) -> RuntimeError {
    let s = String::from_utf8_lossy(&sym[..sym.len() - 1]);
    comm_err(format!(
        "{lib} lacks {s} ({e}): it is not an MPI library; set DMC_MPI_LIB to your libmpi.so"
    ))
}

fn check(what: &str, rc: c_int) -> Result<(), RuntimeError> {
    if rc != 0 {
        return Err(comm_err(format!(
            "{what} failed (MPI error code {rc}): a rank ended or the ranks' calls do not match \
             (every rank must run the same command); see the other ranks' errors"
        )));
    }
    Ok(())
}

impl Mpi {
    /// Loads MPI (see the module docs) and initialises it (unless already initialised in this
    /// process), reading this rank and the world size of `MPI_COMM_WORLD`.
    pub fn init() -> Result<Mpi, RuntimeError> {
        let (lib, name) = open_library()?;
        macro_rules! sym {
            ($s:literal) => {
                // SAFETY: the symbol has this C signature in the MPI standard (mpi.h), in both ABIs.
                *unsafe { lib.get($s) }.map_err(|e| missing(&name, $s, e))?
            };
        }
        let initialized: unsafe extern "C" fn(*mut c_int) -> c_int = sym!(b"MPI_Initialized\0");
        let init_thread: unsafe extern "C" fn(
            *mut c_int,
            *mut *mut *mut c_char,
            c_int,
            *mut c_int,
        ) -> c_int = sym!(b"MPI_Init_thread\0");
        let finalized: unsafe extern "C" fn(*mut c_int) -> c_int = sym!(b"MPI_Finalized\0");
        let finalize: unsafe extern "C" fn() -> c_int = sym!(b"MPI_Finalize\0");

        // SAFETY: looking a data symbol up has no side effects; its address is only used if found.
        let ompi_world = unsafe { lib.get::<*mut c_void>(b"ompi_mpi_comm_world\0") };
        let (abi, kind) = match ompi_world {
            Ok(w) => {
                // SAFETY: as above; in Open MPI, MPI_BYTE is `&ompi_mpi_byte`.
                let byte = unsafe { lib.get::<*mut c_void>(b"ompi_mpi_byte\0") }
                    .map_err(|e| missing(&name, b"ompi_mpi_byte\0", e))?;
                let (w, b) = (w.into_raw(), byte.into_raw());
                (
                    Abi::OpenMpi(bind(&lib, &name, w, b, std::ptr::null_mut())?),
                    "Open MPI",
                )
            }
            Err(_) => {
                let ignore = 1usize as Status; // MPICH's MPI_STATUS_IGNORE
                (
                    Abi::Mpich(bind(&lib, &name, 0x4400_0000, 0x4c00_010d, ignore)?),
                    "MPICH",
                )
            }
        };

        let (mut flag, mut done) = (0, 0);
        // SAFETY: valid out-pointers; both may be called at any time, even before MPI_Init.
        check("MPI_Finalized", unsafe { finalized(&mut done) })?;
        if done != 0 {
            return Err(comm_err(
                "MPI was already finalised in this process and cannot be initialised again \
                 (open the collective once per process)"
                    .into(),
            ));
        }
        // SAFETY: as above.
        check("MPI_Initialized", unsafe { initialized(&mut flag) })?;
        let ours = flag == 0;
        if ours {
            let mut provided = 0;
            // SAFETY: null argc/argv are allowed by MPI-2 and later; `provided` is an out-pointer.
            let rc = unsafe {
                init_thread(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    MPI_THREAD_SERIALIZED,
                    &mut provided,
                )
            };
            check("MPI_Init_thread (initialising MPI)", rc)?;
        }
        let piece = std::env::var("DMC_MPI_PIECE_BYTES")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&p| p > 0)
            .map_or(PIECE, |p| p.min(PIECE));
        let short = name.rsplit('/').next().unwrap_or(&name).to_string();
        // Made before the queries below, so that an error finalises MPI (in `drop`).
        let mut m = Mpi {
            abi,
            finalize,
            finalized,
            ours,
            rank: 0,
            world: 1,
            name: format!("{kind} ({short})"),
            piece,
            lock: Mutex::new(()),
            sent: AtomicU64::new(0),
            _lib: lib,
        };
        let (mut rank, mut size) = (0, 0);
        with_api!(&m.abi, a => {
            // SAFETY: MPI is initialised; the handle is this ABI's MPI_COMM_WORLD; out-pointers.
            check("MPI_Comm_rank", unsafe { (a.comm_rank)(a.world, &mut rank) })?;
            // SAFETY: as above.
            check("MPI_Comm_size", unsafe { (a.comm_size)(a.world, &mut size) })?;
        });
        (m.rank, m.world) = (rank.max(0) as usize, size.max(1) as usize);
        Ok(m)
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        // A panic while holding the lock leaves no state behind it to repair.
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn peer(&self, what: &str, p: usize) -> Result<c_int, RuntimeError> {
        if p >= self.world {
            return Err(comm_err(format!(
                "{what}: rank {p} does not exist in a world of {} ranks (a bug in the caller)",
                self.world
            )));
        }
        Ok(p as c_int)
    }

    fn send_piece(&self, s: &[u8], to: c_int) -> Result<(), RuntimeError> {
        with_api!(&self.abi, a => {
            // SAFETY: `s` is readable for its length (<= 1 GiB, fits a C int); MPI is initialised.
            let rc = unsafe { (a.send)(s.as_ptr().cast(), s.len() as c_int, a.byte, to, TAG, a.world) };
            check(&format!("MPI_Send of {} bytes to rank {to}", s.len()), rc)
        })
    }

    fn recv_piece(&self, r: &mut [u8], from: c_int) -> Result<(), RuntimeError> {
        with_api!(&self.abi, a => {
            // SAFETY: `r` is writable for its length (<= 1 GiB); MPI is initialised; MPI writes
            // at most that many bytes (more is an error it reports).
            let rc = unsafe {
                (a.recv)(r.as_mut_ptr().cast(), r.len() as c_int, a.byte, from, TAG, a.world, a.status_ignore)
            };
            check(&format!("MPI_Recv of {} bytes from rank {from}", r.len()), rc)
        })
    }

    fn sendrecv_piece(
        &self,
        s: &[u8],
        to: c_int,
        r: &mut [u8],
        from: c_int,
    ) -> Result<(), RuntimeError> {
        with_api!(&self.abi, a => {
            // SAFETY: as in `send_piece` and `recv_piece`; the two buffers are distinct borrows.
            let rc = unsafe {
                (a.sendrecv)(
                    s.as_ptr().cast(), s.len() as c_int, a.byte, to, TAG,
                    r.as_mut_ptr().cast(), r.len() as c_int, a.byte, from, TAG,
                    a.world, a.status_ignore,
                )
            };
            let what = format!("MPI_Sendrecv of {} bytes to rank {to} and {} from rank {from}", s.len(), r.len());
            check(&what, rc)
        })
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn sendrecv(
        &self,
        send: &[u8],
        to: usize,
        recv: &mut [u8],
        from: usize,
    ) -> Result<(), RuntimeError> {
        let (to, from) = (self.peer("sendrecv", to)?, self.peer("sendrecv", from)?);
        let _g = self.lock();
        self.sent.fetch_add(send.len() as u64, Ordering::Relaxed);
        // Piece i of `send` meets piece i of the peer's `recv` (the same sizes); when one side
        // has more pieces, the rest go alone.
        let (mut s, mut r) = (send.chunks(self.piece), recv.chunks_mut(self.piece));
        loop {
            match (s.next(), r.next()) {
                (Some(s), Some(r)) => self.sendrecv_piece(s, to, r, from)?,
                (Some(s), None) => self.send_piece(s, to)?,
                (None, Some(r)) => self.recv_piece(r, from)?,
                (None, None) => return Ok(()),
            }
        }
    }
    fn send(&self, data: &[u8], to: usize) -> Result<(), RuntimeError> {
        let to = self.peer("send", to)?;
        let _g = self.lock();
        self.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
        data.chunks(self.piece)
            .try_for_each(|s| self.send_piece(s, to))
    }
    fn recv(&self, data: &mut [u8], from: usize) -> Result<(), RuntimeError> {
        let from = self.peer("recv", from)?;
        let _g = self.lock();
        data.chunks_mut(self.piece)
            .try_for_each(|r| self.recv_piece(r, from))
    }
    fn sent_bytes(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
    fn abort(&self, code: i32) -> ! {
        with_api!(&self.abi, a => {
            // SAFETY: MPI is initialised; MPI_Abort does not return in practice. No lock: the
            // abort must go through even while another thread is blocked in a call.
            unsafe { (a.abort)(a.world, code) };
        });
        std::process::exit(code)
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        if !self.ours {
            return;
        }
        let _g = self.lock();
        let mut done = 0;
        // SAFETY: an out-pointer; callable at any time.
        let rc = unsafe { (self.finalized)(&mut done) };
        if rc == 0 && done == 0 {
            // SAFETY: MPI was initialised by `init` and is not finalised; nothing uses it after.
            // Its error cannot be reported from `drop`; the process is ending anyway.
            let _ = unsafe { (self.finalize)() };
        }
    }
}

/// `(rank, world)` from the launcher's environment: `OMPI_COMM_WORLD_RANK`/`_SIZE` (Open MPI),
/// `PMI_RANK`/`PMI_SIZE` (MPICH's hydra), `PMIX_RANK` with `OMPI_COMM_WORLD_SIZE`, then
/// `RANK`/`WORLD_SIZE` (torchrun style). `None` when no launcher set them (or they are invalid).
pub fn launcher_world() -> Option<(usize, usize)> {
    launcher_world_in(|k| std::env::var(k).ok())
}

fn launcher_world_in(get: impl Fn(&str) -> Option<String>) -> Option<(usize, usize)> {
    const PAIRS: [(&str, &str); 4] = [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("RANK", "WORLD_SIZE"),
    ];
    PAIRS.iter().find_map(|(r, w)| {
        let rank = get(r)?.trim().parse::<usize>().ok()?;
        let world = get(w)?.trim().parse::<usize>().ok()?;
        (world >= 1 && rank < world).then_some((rank, world))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
    }

    #[test]
    fn launcher_env() {
        assert_eq!(launcher_world_in(env(&[])), None);
        let ompi = [("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3")];
        assert_eq!(launcher_world_in(env(&ompi)), Some((2, 3)));
        assert_eq!(
            launcher_world_in(env(&[("PMI_RANK", "1"), ("PMI_SIZE", "4")])),
            Some((1, 4))
        );
        let pmix = [("PMIX_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")];
        assert_eq!(launcher_world_in(env(&pmix)), Some((0, 2)));
        assert_eq!(
            launcher_world_in(env(&[("RANK", "3"), ("WORLD_SIZE", "8")])),
            Some((3, 8))
        );
        assert_eq!(
            launcher_world_in(env(&[("RANK", "3"), ("WORLD_SIZE", "2")])),
            None
        );
        assert_eq!(
            launcher_world_in(env(&[("RANK", "x"), ("WORLD_SIZE", "2")])),
            None
        );
    }
}
